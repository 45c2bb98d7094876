package cuda

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/conformance"
	"github.com/vgpu/vgpu/api"
)

// Tests against the real driver and GPU: they skip on hosts without one
// (CI) unless VGPU_REQUIRE_GPU=1, which scripts/gpu-check sets on a GPU
// host so that a missing driver fails instead of passing silently.

func realDriver(t *testing.T) *Driver {
	t.Helper()
	d, err := Load("")
	if err != nil {
		if os.Getenv("VGPU_REQUIRE_GPU") == "1" {
			t.Fatalf("VGPU_REQUIRE_GPU=1: %v", err)
		}
		t.Skipf("no CUDA driver: %v", err)
	}
	return d
}

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

// TestRealConformance runs the suite on GPU 0: memory through real VMM
// mappings, copies and scrubs on the device (kernels still run on the
// host, Device's doc).
func TestRealConformance(t *testing.T) {
	drv := realDriver(t)
	conformance.Run(t, func(t *testing.T, size uint64) accelerator.Device {
		d, err := New(drv, 0, 0, size, "gpu0")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}, conformance.Options{})
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
