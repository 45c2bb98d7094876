// Package fakegpu builds, for tests, the fake NVIDIA libraries that stand
// in for the GPU and driver a machine without one lacks: libcuda.so.1
// (accelerator/cuda/testdata/fakecuda.c, with the kernel catalog's CUDA C
// compiled for the host by g++, fakekernels.cc), libnvrtc
// (fakenvrtc.c), libcublas (fakecublas.c) and libnvidia-ml.so.1
// (accelerator/gpus/testdata/fakenvml.c). Each lies in one directory under
// the file name the loader looks for, so that a test puts that directory
// on LD_LIBRARY_PATH for a vgpu-node --backend cuda it starts, or loads a
// library by its path in its own process.
//
// It is test machinery: only tests import it. The libraries are built
// once per test binary with gcc and g++, whose absence goes through
// testenv.Missing (a skip, a failure under VGPU_E2E_REQUIRE_ROOT=1);
// TestMain calls Remove when the tests are done.
package fakegpu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/internal/testenv"
)

// Libs are the built fake libraries: Dir holds each of the others.
type Libs struct {
	Dir    string
	CUDA   string // libcuda.so.1
	NVRTC  string // libnvrtc.so.13
	CUBLAS string // libcublas.so.13
	NVML   string // libnvidia-ml.so.1
}

var (
	once     sync.Once
	built    Libs
	buildErr error
)

// Build builds the fake libraries, once per process, and returns them.
func Build(tb testing.TB) Libs {
	tb.Helper()
	once.Do(func() { built, buildErr = build() })
	if buildErr != nil {
		testenv.Missing(tb, fmt.Sprintf("the fake NVIDIA libraries: %v", buildErr))
	}
	return built
}

// Remove removes what Build built, if it did.
func Remove() {
	if built.Dir != "" {
		os.RemoveAll(built.Dir)
	}
}

func build() (Libs, error) {
	for _, cc := range []string{"gcc", "g++"} {
		if _, err := exec.LookPath(cc); err != nil {
			return Libs{}, fmt.Errorf("%s not found: %w", cc, err)
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return Libs{}, err
	}
	dir, err := os.MkdirTemp("", "fakegpu")
	if err != nil {
		return Libs{}, err
	}
	l := Libs{Dir: dir, CUDA: filepath.Join(dir, "libcuda.so.1"), NVRTC: filepath.Join(dir, "libnvrtc.so.13"),
		CUBLAS: filepath.Join(dir, "libcublas.so.13"), NVML: filepath.Join(dir, "libnvidia-ml.so.1")}
	in := func(name string) string { return filepath.Join(dir, name) }
	cuda := func(name string) string { return filepath.Join(root, "accelerator", "cuda", "testdata", name) }
	warn := []string{"-fPIC", "-O1", "-Wall", "-Werror"}
	for _, cmd := range [][]string{
		append([]string{"gcc", "-c", "-o", in("fakecuda.o"), cuda("fakecuda.c")}, warn...),
		// No contraction into fused multiply-adds, as NVRTC's --fmad=false.
		append([]string{"g++", "-c", "-std=c++17", "-ffp-contract=off", "-o", in("fakekernels.o"), cuda("fakekernels.cc")}, warn...),
		{"g++", "-shared", "-o", l.CUDA, in("fakecuda.o"), in("fakekernels.o"), "-lm"},
		append([]string{"gcc", "-shared", "-o", l.NVRTC, cuda("fakenvrtc.c")}, warn...),
		append([]string{"gcc", "-shared", "-ffp-contract=off", "-o", l.CUBLAS, cuda("fakecublas.c")}, warn...),
		append([]string{"gcc", "-shared", "-o", l.NVML, filepath.Join(root, "accelerator", "gpus", "testdata", "fakenvml.c")}, warn...),
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return Libs{}, fmt.Errorf("%s: %w\n%s", strings.Join(cmd, " "), err, out)
		}
	}
	return l, nil
}

// moduleRoot is the directory of vgpu's go.mod, above the test's working
// directory (its package's directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run the tests from the module")
		}
		dir = parent
	}
}
