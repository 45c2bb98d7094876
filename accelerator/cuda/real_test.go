package cuda

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/conformance"
	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// Tests against the real driver and GPU: they skip on hosts without one
// (CI) unless VGPU_REQUIRE_GPU=1, which scripts/gpu-check sets on a GPU
// host so that a missing driver fails instead of passing silently.

func realDriver(t *testing.T) *Driver { return realLib(t, Load) }

func TestRealGPUs(t *testing.T) {
	d := realDriver(t)
	v, err := d.Version()
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := d.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) == 0 {
		t.Fatal("the driver lists no GPU")
	}
	for _, g := range gpus {
		t.Logf("driver CUDA %d.%d: GPU %d %q %s, %d bytes", v/1000, v%1000/10, g.Ordinal, g.Name, g.UUID, g.Memory)
		if g.Memory < FrameSize || len(g.UUID) != len("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") {
			t.Errorf("GPU %+v: implausible", g)
		}
	}
}

// realLib loads the driver or one of the CUDA toolkit's libraries from
// where the dynamic loader finds it.
func realLib[L any](t *testing.T, load func(string) (L, error)) L {
	t.Helper()
	l, err := load("")
	if err != nil {
		if os.Getenv("VGPU_REQUIRE_GPU") == "1" {
			t.Fatalf("VGPU_REQUIRE_GPU=1: %v", err)
		}
		t.Skipf("%v", err)
	}
	return l
}

// realMaxRelErr is the conformance tolerance on a GPU: sums run in the
// references' order without fused multiply-adds, but CUDA's exp and erf
// may differ from the references' by an ulp of float64, and cuBLAS sums
// in its own order.
const realMaxRelErr = 1e-4

// TestRealConformance runs the suite on GPU 0: memory through real VMM
// mappings, copies and scrubs on the device, and the kernels compiled by
// NVRTC for the GPU and launched there (matmul by our kernel, then by
// cuBLAS), then on the host.
func TestRealConformance(t *testing.T) {
	drv := realDriver(t)
	c := NewCompiler(realLib(t, LoadNVRTC), t.TempDir())
	open := func(t *testing.T, size uint64) *Device {
		d, err := New(drv, 0, 0, size, "gpu0")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Run("GPU", func(t *testing.T) {
		conformance.Run(t, func(t *testing.T, size uint64) accelerator.Device {
			d := open(t, size)
			if err := d.UseKernels(c); err != nil {
				d.Close()
				t.Fatal(err)
			}
			return d
		}, conformance.Options{MaxRelErr: realMaxRelErr})
	})
	t.Run("CUBLAS", func(t *testing.T) {
		blas := realLib(t, LoadCUBLAS)
		conformance.Run(t, func(t *testing.T, size uint64) accelerator.Device {
			d := open(t, size)
			if err := errors.Join(d.UseKernels(c), d.UseCUBLAS(blas)); err != nil {
				d.Close()
				t.Fatal(err)
			}
			return d
		}, conformance.Options{MaxRelErr: realMaxRelErr})
	})
	t.Run("Host", func(t *testing.T) {
		conformance.Run(t, func(t *testing.T, size uint64) accelerator.Device { return open(t, size) }, conformance.Options{})
	})
}

// TestRealMatmulRatio measures, with VGPU_GPU_MATMUL_JSON set to a file to
// write, a 2048 x 2048 x 2048 matmul launched whole through the Device by
// the catalog's kernel and by cuBLAS, in the same run, and writes the
// ratio (cuBLAS time / kernel time: 1 is as fast as cuBLAS) and the
// largest difference between their results; it checks nothing about the
// speed.
func TestRealMatmulRatio(t *testing.T) {
	path := os.Getenv("VGPU_GPU_MATMUL_JSON")
	if path == "" {
		t.Skip("VGPU_GPU_MATMUL_JSON not set")
	}
	drv := realDriver(t)
	const n = 2048
	const bytes = n * n * 4
	const reps = 5
	d, err := New(drv, 0, 0, 4*bytes, "gpu0")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := errors.Join(d.UseKernels(NewCompiler(realLib(t, LoadNVRTC), "")), d.UseCUBLAS(realLib(t, LoadCUBLAS))); err != nil {
		t.Fatal(err)
	}
	in := make([]byte, 2*bytes)
	for i := 0; i < len(in); i += 4 {
		binary.LittleEndian.PutUint32(in[i:], math.Float32bits(float32(i%1999)/1999-0.5))
	}
	if err := d.Write([]api.Extent{{Addr: 0, Len: 2 * bytes}}, in); err != nil {
		t.Fatal(err)
	}
	k, _ := kernels.Lookup("matmul")
	args := []api.NodeArg{{Kind: api.ArgI64, Bits: 1}, {Kind: api.ArgI64, Bits: n}, {Kind: api.ArgI64, Bits: n}, {Kind: api.ArgI64, Bits: n},
		{Kind: api.ArgI64}, {Kind: api.ArgI64}, {Kind: api.ArgI64, Bits: 1},
		{Kind: api.ArgBuffer, Extents: []api.Extent{{Addr: 0, Len: bytes}}},
		{Kind: api.ArgBuffer, Extents: []api.Extent{{Addr: bytes, Len: bytes}}},
		{Kind: api.ArgBuffer, Extents: []api.Extent{{Addr: 2 * bytes, Len: bytes}}}}
	out := []api.Extent{{Addr: 2 * bytes, Len: bytes}}
	timed := func() (time.Duration, []byte) {
		best := time.Duration(1 << 62)
		for range reps + 1 { // the first warms up
			start := time.Now()
			if err := conformance.Launch(d, k, args, math.MaxInt); err != nil {
				t.Fatal(err)
			}
			best = min(best, time.Since(start))
		}
		var c []byte
		if err := d.Read(out, func(p ...[]byte) error { c = slices.Clone(p[0]); return nil }); err != nil {
			t.Fatal(err)
		}
		return best, c
	}
	blasTime, blasC := timed()
	blas := d.blas
	d.blas = nil
	kernelTime, kernelC := timed()
	d.blas = blas
	maxDiff := 0.0
	for i := 0; i < len(blasC); i += 4 {
		a := float64(math.Float32frombits(binary.LittleEndian.Uint32(blasC[i:])))
		b := float64(math.Float32frombits(binary.LittleEndian.Uint32(kernelC[i:])))
		maxDiff = max(maxDiff, math.Abs(a-b)/max(1, math.Abs(a)))
	}
	tflops := func(t time.Duration) float64 { return 2 * n * n * n / t.Seconds() / 1e12 }
	res := map[string]any{
		"m": n, "n": n, "k": n, "reps": reps,
		"kernel_tflops": tflops(kernelTime), "cublas_tflops": tflops(blasTime),
		"kernel_vs_cublas": blasTime.Seconds() / kernelTime.Seconds(),
		"max_rel_diff":     maxDiff,
		"note":             "one matmul launched whole through Device.Prepare and its plan (compiled catalog kernel vs cublasSgemmStridedBatched), best of reps after a warm-up, each waited for",
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("%s", b)
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRealCopyRatio measures, with VGPU_GPU_JSON set to a file to write,
// host-to-device and device-to-host copies through the Device (Write from
// Go memory through the staging buffer, Read back) against a raw
// cuMemcpyHtoDAsync/DtoHAsync of the same bytes from pinned memory, the
// baseline, in the same run; it writes the ratios (baseline time / Device
// time: 1 is as fast as raw) and checks nothing about them.
func TestRealCopyRatio(t *testing.T) {
	path := os.Getenv("VGPU_GPU_JSON")
	if path == "" {
		t.Skip("VGPU_GPU_JSON not set")
	}
	drv := realDriver(t)
	const size = 256 << 20
	const reps = 5
	d, err := New(drv, 0, 0, size, "gpu0")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	xs := []api.Extent{{Addr: 0, Len: size}}
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	best := func(fn func() error) time.Duration {
		b := time.Duration(1 << 62)
		for range reps {
			start := time.Now()
			if err := fn(); err != nil {
				t.Fatal(err)
			}
			b = min(b, time.Since(start))
		}
		return b
	}
	var rawH2D, rawD2H time.Duration
	err = d.do(func(k *Calls) error {
		pin, err := k.HostAlloc(size)
		if err != nil {
			return err
		}
		defer k.FreeHost(pin)
		copy(pin.Bytes(), src)
		s := d.streams[0]
		rawH2D = best(func() error {
			if err := k.HtoDAsync(d.base, pin, 0, size, s); err != nil {
				return err
			}
			return k.Sync(s)
		})
		rawD2H = best(func() error {
			if err := k.DtoHAsync(pin, 0, size, d.base, s); err != nil {
				return err
			}
			return k.Sync(s)
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h2d := best(func() error { return d.Write(xs, src) })
	d2h := best(func() error { return d.Read(xs, func(...[]byte) error { return nil }) })
	gbps := func(t time.Duration) float64 { return float64(size) / t.Seconds() / 1e9 }
	res := map[string]any{
		"bytes": size, "reps": reps,
		"raw_h2d_gbps": gbps(rawH2D), "raw_d2h_gbps": gbps(rawD2H),
		"device_h2d_gbps": gbps(h2d), "device_d2h_gbps": gbps(d2h),
		"h2d_ratio": rawH2D.Seconds() / h2d.Seconds(), "d2h_ratio": rawD2H.Seconds() / d2h.Seconds(),
		"note": "Device.Write/Read (staging through pinned memory) against raw cuMemcpy*Async from pinned memory, best of reps; the network path is not included",
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("%s", b)
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}
