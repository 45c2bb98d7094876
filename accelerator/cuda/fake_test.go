package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/vgpu/vgpu/internal/testenv"
)

// The tests load testdata/fakecuda.c, built here with gcc, in place of
// libcuda.so.1: a fake driver over host memory that stands in for the GPU
// and driver this machine does not have, with the kernel catalog's CUDA C
// compiled for the host by g++ (testdata/fakekernels.cc), which its
// cuLaunchKernel runs thread by thread; testdata/fakenvrtc.c in place of
// libnvrtc, whose "compiler" emits an image naming the source's kernels;
// and testdata/fakecublas.c in place of libcublas, a reference SGEMM.
// They run the binding's real dlopen, symbol binding, argument passing and
// error paths, and the kernels' indexing; what only a GPU shows (real
// compilation, parallel threads, real DMA, the driver's own checks) is
// left to scripts/gpu-check.

// fake is the built fake driver and its test controls.
type fakeLib struct {
	path string
	// inject makes call name fail with code after skip more successes.
	inject func(name string, code int32, skip int32)
	// live counts allocations, reservations, maps, streams and pinned
	// buffers not freed.
	live      func() int32
	setMemory func(n uintptr)
	// calls counts host-to-device copies (0), device-to-host (1), memsets
	// (2), device-to-device copies (3) and launches (4).
	calls func(which int32) int64

	nvrtcPath string
	// compiles counts the fake NVRTC's successful compilations.
	compiles func() int32

	cublasPath string
	// sgemms counts the fake cuBLAS's SGEMM calls.
	sgemms func() int64
}

var (
	fakeOnce sync.Once
	fakeErr  error
	fake     fakeLib
	fakeDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeDir != "" {
		os.RemoveAll(fakeDir)
	}
	os.Exit(code)
}

// buildFake compiles the fake driver once per test binary.
func buildFake(t *testing.T) fakeLib {
	t.Helper()
	fakeOnce.Do(func() {
		for _, cc := range []string{"gcc", "g++"} {
			if _, err := exec.LookPath(cc); err != nil {
				fakeErr = fmt.Errorf("%s not found: %v", cc, err)
				return
			}
		}
		if fakeDir, fakeErr = os.MkdirTemp("", "fakecuda"); fakeErr != nil {
			return
		}
		fake.path = filepath.Join(fakeDir, "libcuda.so.1")
		fake.nvrtcPath = filepath.Join(fakeDir, "libnvrtc.so.13")
		fake.cublasPath = filepath.Join(fakeDir, "libcublas.so.13")
		in := func(name string) string { return filepath.Join(fakeDir, name) }
		warn := []string{"-fPIC", "-O1", "-Wall", "-Werror"}
		for _, cmd := range [][]string{
			append([]string{"gcc", "-c", "-o", in("fakecuda.o"), "testdata/fakecuda.c"}, warn...),
			// No contraction into fused multiply-adds, as NVRTC's --fmad=false.
			append([]string{"g++", "-c", "-std=c++17", "-ffp-contract=off", "-o", in("fakekernels.o"), "testdata/fakekernels.cc"}, warn...),
			{"g++", "-shared", "-o", fake.path, in("fakecuda.o"), in("fakekernels.o"), "-lm"},
			append([]string{"gcc", "-shared", "-o", fake.nvrtcPath, "testdata/fakenvrtc.c"}, warn...),
			append([]string{"gcc", "-shared", "-ffp-contract=off", "-o", fake.cublasPath, "testdata/fakecublas.c"}, warn...),
		} {
			if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
				fakeErr = fmt.Errorf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
				return
			}
		}
		lib, err := purego.Dlopen(fake.path, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			fakeErr = err
			return
		}
		purego.RegisterLibFunc(&fake.inject, lib, "fake_inject")
		purego.RegisterLibFunc(&fake.live, lib, "fake_live")
		purego.RegisterLibFunc(&fake.setMemory, lib, "fake_set_memory")
		purego.RegisterLibFunc(&fake.calls, lib, "fake_calls")
		nv, err := purego.Dlopen(fake.nvrtcPath, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			fakeErr = err
			return
		}
		purego.RegisterLibFunc(&fake.compiles, nv, "fake_nvrtc_compiles")
		blas, err := purego.Dlopen(fake.cublasPath, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			fakeErr = err
			return
		}
		purego.RegisterLibFunc(&fake.sgemms, blas, "fake_cublas_calls")
	})
	if fakeErr != nil {
		testenv.Missing(t, fmt.Sprintf("the fake libcuda: %v", fakeErr))
	}
	return fake
}

// load loads the fake driver and checks, at the end of the test, that
// everything it allocated was freed.
func load(t *testing.T) (*Driver, fakeLib) {
	t.Helper()
	f := buildFake(t)
	d, err := Load(f.path)
	if err != nil {
		t.Fatalf("Load(%s): %v", f.path, err)
	}
	t.Cleanup(func() {
		f.inject("", 0, 0)
		if n := f.live(); n != 0 {
			t.Errorf("%d driver objects not freed", n)
		}
	})
	return d, f
}

// offThread runs fn on a goroutine locked to a fresh OS thread, on which no
// context was ever made current.
func offThread(fn func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fn()
		close(done)
	}()
	<-done
}
