package cuda

import (
	"os"
	"runtime"
	"sync"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/vgpu/vgpu/internal/fakegpu"
)

// The tests load the fake NVIDIA libraries internal/fakegpu builds with
// gcc and g++: testdata/fakecuda.c in place of libcuda.so.1, a fake driver
// over host memory that stands in for the GPU and driver this machine does
// not have, with the kernel catalog's CUDA C compiled for the host
// (testdata/fakekernels.cc), which its cuLaunchKernel runs thread by
// thread; testdata/fakenvrtc.c in place of libnvrtc, whose "compiler"
// emits an image naming the source's kernels; and testdata/fakecublas.c in
// place of libcublas, a reference SGEMM. They run the binding's real
// dlopen, symbol binding, argument passing and error paths, and the
// kernels' indexing; what only a GPU shows (real compilation, parallel
// threads, real DMA, the driver's own checks) is left to scripts/gpu-check.

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
)

func TestMain(m *testing.M) {
	code := m.Run()
	fakegpu.Remove()
	os.Exit(code)
}

// buildFake builds the fake libraries and binds their test controls, once
// per test binary.
func buildFake(t *testing.T) fakeLib {
	t.Helper()
	libs := fakegpu.Build(t)
	fakeOnce.Do(func() {
		fake.path, fake.nvrtcPath, fake.cublasPath = libs.CUDA, libs.NVRTC, libs.CUBLAS
		for _, bind := range []struct {
			path string
			fns  map[string]any
		}{
			{fake.path, map[string]any{"fake_inject": &fake.inject, "fake_live": &fake.live, "fake_set_memory": &fake.setMemory, "fake_calls": &fake.calls}},
			{fake.nvrtcPath, map[string]any{"fake_nvrtc_compiles": &fake.compiles}},
			{fake.cublasPath, map[string]any{"fake_cublas_calls": &fake.sgemms}},
		} {
			lib, err := purego.Dlopen(bind.path, purego.RTLD_NOW|purego.RTLD_LOCAL)
			if err != nil {
				fakeErr = err
				return
			}
			for name, fn := range bind.fns {
				purego.RegisterLibFunc(fn, lib, name)
			}
		}
	})
	if fakeErr != nil {
		t.Fatalf("load the fake libraries' test controls: %v", fakeErr)
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
