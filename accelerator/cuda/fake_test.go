package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/vgpu/vgpu/internal/testenv"
)

// The tests load testdata/fakecuda.c, built here with gcc, in place of
// libcuda.so.1: a fake driver over host memory that stands in for the GPU
// and driver this machine does not have. It runs the binding's real
// dlopen, symbol binding, argument passing and error paths; what only a GPU
// shows (kernels, real DMA, the driver's own checks) is left to
// scripts/gpu-check.

// fake is the built fake driver and its test controls.
type fakeLib struct {
	path string
	// inject makes call name fail with code after skip more successes.
	inject func(name string, code int32, skip int32)
	// live counts allocations, reservations, maps, streams and pinned
	// buffers not freed.
	live      func() int32
	setMemory func(n uintptr)
	calls     func(which int32) int64
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
		if _, err := exec.LookPath("gcc"); err != nil {
			fakeErr = fmt.Errorf("gcc not found: %v", err)
			return
		}
		if fakeDir, fakeErr = os.MkdirTemp("", "fakecuda"); fakeErr != nil {
			return
		}
		fake.path = filepath.Join(fakeDir, "libcuda.so.1")
		out, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", fake.path, "testdata/fakecuda.c").CombinedOutput()
		if err != nil {
			fakeErr = fmt.Errorf("gcc: %v\n%s", err, out)
			return
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
