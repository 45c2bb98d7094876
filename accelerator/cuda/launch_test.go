package cuda

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/conformance"
	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// fakeMaxRelErr is the conformance tolerance of the catalog's CUDA C run
// by the fake driver: sums run in the references' order without fused
// multiply-adds, so only the C library's exp and erf, within an ulp of
// float64 of the references' own, differ.
const fakeMaxRelErr = 1e-6

// nvrtcFake loads the fake NVRTC.
func nvrtcFake(t *testing.T, f fakeLib) *NVRTC {
	t.Helper()
	n, err := LoadNVRTC(f.nvrtcPath)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// openKernels opens a device on the fake driver with the catalog compiled
// by c and loaded.
func openKernels(t *testing.T, size uint64, c *Compiler) (*Device, fakeLib) {
	t.Helper()
	d, f := openFake(t, size)
	if err := d.UseKernels(c); err != nil {
		d.Close()
		t.Fatalf("UseKernels: %v", err)
	}
	return d, f
}

// TestConformance runs the suite every backend passes with the kernels on
// the "GPU": the catalog's CUDA C through the fake NVRTC, cuModuleLoadData
// and cuLaunchKernel of the fake driver, which runs it on the host.
func TestConformance(t *testing.T) {
	f := buildFake(t)
	c := NewCompiler(nvrtcFake(t, f), "")
	before := f.calls(4)
	conformance.Run(t, func(t *testing.T, size uint64) accelerator.Device {
		d, _ := openKernels(t, size, c)
		return d
	}, conformance.Options{MaxRelErr: fakeMaxRelErr})
	// Every case launched on the device, whole and in slices, at least once.
	if n := f.calls(4) - before; n < 2*int64(len(kernels.Catalog())) {
		t.Errorf("%d kernel launches through the driver, want at least 2 for each of the %d kernels", n, len(kernels.Catalog()))
	}
	if s := c.Stats(); s.Compiled != 1 {
		t.Errorf("compiled %d times for one architecture, want once", s.Compiled)
	}
}

// TestCompileError: a source NVRTC refuses is an error carrying its log.
func TestCompileError(t *testing.T) {
	f := buildFake(t)
	n := nvrtcFake(t, f)
	src := "extern \"C\" __global__ void k(float *x) { x[0] = 1; }\n#error the catalog is broken\n"
	_, err := n.Compile(src, "broken.cu", []string{"--gpu-architecture=sm_90"})
	var ce *CompileError
	if !errors.As(err, &ce) || !errors.Is(err, api.ErrInternal) {
		t.Fatalf("Compile of a broken source: %v, want a *CompileError wrapping ErrInternal", err)
	}
	for _, want := range []string{"broken.cu(2): error: #error the catalog is broken", "NVRTC could not compile broken.cu"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	_, err = n.Compile(src, "noarch.cu", nil)
	conformance.WantErr(t, "Compile without an architecture", err, api.ErrInternal, "nvrtcCompileProgram", "NVRTC_ERROR_INVALID_OPTION")
	if _, err := LoadNVRTC(filepath.Join(t.TempDir(), "libnvrtc.so.13")); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "libnvrtc") {
		t.Errorf("LoadNVRTC of a missing library: %v, want unavailable naming libnvrtc", err)
	}
}

// TestKernelCache: a second start with the same cache directory loads the
// image from disk and compiles nothing; an entry whose bytes do not match
// its hash, or that the driver refuses, is compiled again and replaced.
func TestKernelCache(t *testing.T) {
	f := buildFake(t)
	n := nvrtcFake(t, f)
	dir := filepath.Join(t.TempDir(), "kernels")
	start := func(want CompilerStats, compiles int32) {
		t.Helper()
		before := f.compiles()
		c := NewCompiler(n, dir)
		d, _ := openKernels(t, 4<<20, c)
		defer d.Close()
		if s := c.Stats(); s != want {
			t.Errorf("stats %+v, want %+v", s, want)
		}
		if got := f.compiles() - before; got != compiles {
			t.Errorf("NVRTC compiled %d times, want %d", got, compiles)
		}
		fill(t, d)
	}
	start(CompilerStats{Compiled: 1}, 1)
	start(CompilerStats{CacheHits: 1}, 0)
	entries, _ := filepath.Glob(filepath.Join(dir, "*-sm_90.cubin"))
	if len(entries) != 1 {
		t.Fatalf("cache entries %v, want one for sm_90", entries)
	}
	// Bytes that do not match the entry's hash.
	b, err := os.ReadFile(entries[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0xff
	if err := os.WriteFile(entries[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	start(CompilerStats{Compiled: 1, Corrupt: 1}, 1)
	start(CompilerStats{CacheHits: 1}, 0)
	// An entry whole by its hash that the driver refuses.
	if err := write(entries[0], []byte("not a cubin")); err != nil {
		t.Fatal(err)
	}
	start(CompilerStats{Compiled: 1, CacheHits: 1, Corrupt: 1}, 1)
	start(CompilerStats{CacheHits: 1}, 0)
}

// fill launches fill_f32 over 1000 floats and checks them.
func fill(t *testing.T, d *Device) {
	t.Helper()
	k, err := kernels.Lookup("fill_f32")
	if err != nil {
		t.Fatal(err)
	}
	args := []api.NodeArg{
		{Kind: api.ArgBuffer, Extents: []api.Extent{{Addr: 8, Len: 4000}}},
		{Kind: api.ArgI64, Bits: 1000},
		{Kind: api.ArgF32, Bits: api.F32Bits(2.5)},
	}
	if err := conformance.Launch(d, k, args, math.MaxInt); err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := d.Read([]api.Extent{{Addr: 8, Len: 4000}}, func(p ...[]byte) error { got = p[0]; return nil }); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(got); i += 4 {
		if v := math.Float32frombits(uint32(got[i]) | uint32(got[i+1])<<8 | uint32(got[i+2])<<16 | uint32(got[i+3])<<24); v != 2.5 {
			t.Fatalf("element %d is %v after fill_f32 with 2.5", i/4, v)
		}
	}
}

// TestGridSlices: a launch is cut into grid ranges of whole blocks, about
// maxWork element operations each, one cuLaunchKernel per slice; a failing
// launch midway is an error naming the call, and the scratch of a buffer
// in several extents is freed however the launch ends (load's leak check).
func TestGridSlices(t *testing.T) {
	f := buildFake(t)
	d, _ := openKernels(t, 8<<20, NewCompiler(nvrtcFake(t, f), ""))
	defer d.Close()
	k, _ := kernels.Lookup("fill_f32")
	// 1000 elements in two extents, costing 4 each: 5*gpuWorkScale/4 =
	// 320 a slice, rounded up to 3 blocks of 128, is 384 elements: 3
	// slices.
	xs := []api.Extent{{Addr: 4, Len: 2000}, {Addr: FrameSize + 4, Len: 2000}}
	args := []api.NodeArg{{Kind: api.ArgBuffer, Extents: xs}, {Kind: api.ArgI64, Bits: 1000}, {Kind: api.ArgF32, Bits: api.F32Bits(1)}}
	p, _, err := d.Prepare(k, args, 5)
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 3 {
		t.Errorf("%d slices, want 3", p.Len())
	}
	before := f.calls(4)
	if err := conformance.Launch(d, k, args, 5); err != nil {
		t.Fatal(err)
	}
	if n := f.calls(4) - before; n != 3 {
		t.Errorf("%d launches, want 3", n)
	}
	if len(d.scratch) != 0 {
		t.Errorf("%d scratch buffers left after the launch", len(d.scratch))
	}
	f.inject("cuLaunchKernel", 719, 1)
	conformance.WantErr(t, "a launch whose second slice fails", conformance.Launch(d, k, args, 5), api.ErrInternal, "cuLaunchKernel")
	if len(d.scratch) != 0 {
		t.Errorf("%d scratch buffers left after a failed launch", len(d.scratch))
	}
	// A plan abandoned after its first slice: Close frees its scratch.
	p, _, err = d.Prepare(k, args, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Step(); err != nil {
		t.Fatal(err)
	}
	if len(d.scratch) != 1 {
		t.Errorf("%d scratch buffers during a launch in two extents, want 1", len(d.scratch))
	}
}

// TestConformanceCUBLAS runs the suite with matmul through cuBLAS (the
// fake's reference SGEMM, column-major as cuBLAS's): the mapping of
// row-major matmul, transposes and a shared b included, onto it.
func TestConformanceCUBLAS(t *testing.T) {
	f := buildFake(t)
	c := NewCompiler(nvrtcFake(t, f), "")
	blas, err := LoadCUBLAS(f.cublasPath)
	if err != nil {
		t.Fatal(err)
	}
	before := f.sgemms()
	conformance.Run(t, func(t *testing.T, size uint64) accelerator.Device {
		d, _ := openKernels(t, size, c)
		if err := d.UseCUBLAS(blas); err != nil {
			t.Fatal(err)
		}
		return d
	}, conformance.Options{MaxRelErr: fakeMaxRelErr})
	// Two matmul cases, each whole and in slices of one matrix of the batch.
	if n := f.sgemms() - before; n < 4 {
		t.Errorf("%d SGEMM calls, want matmul through cuBLAS at least 4 times", n)
	}
	if _, err := LoadCUBLAS(filepath.Join(t.TempDir(), "libcublas.so.13")); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "libcublas") {
		t.Errorf("LoadCUBLAS of a missing library: %v, want unavailable naming libcublas", err)
	}
}

// TestOverlapRefused: a written buffer that overlaps another other than
// exactly is refused, on the GPU (threads would race) and with kernels on
// the host (copies would hide it); exactly in place is allowed.
func TestOverlapRefused(t *testing.T) {
	f := buildFake(t)
	gpu, _ := openKernels(t, 4<<20, NewCompiler(nvrtcFake(t, f), ""))
	defer gpu.Close()
	host, _ := openFake(t, 4<<20)
	defer host.Close()
	k, _ := kernels.Lookup("relu")
	arg := func(addr uint64) api.NodeArg {
		return api.NodeArg{Kind: api.ArgBuffer, Extents: []api.Extent{{Addr: addr, Len: 400}}}
	}
	for _, d := range []*Device{gpu, host} {
		shifted := []api.NodeArg{{Kind: api.ArgI64, Bits: 100}, arg(0), arg(4)}
		conformance.WantErr(t, "relu with out shifted over x", conformance.Launch(d, k, shifted, math.MaxInt), api.ErrInvalidArgument, "relu", "overlap")
		inPlace := []api.NodeArg{{Kind: api.ArgI64, Bits: 100}, arg(0), arg(0)}
		if err := conformance.Launch(d, k, inPlace, math.MaxInt); err != nil {
			t.Errorf("relu in place: %v", err)
		}
	}
}
