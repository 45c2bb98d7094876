package cuda

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vgpu/vgpu/accelerator/conformance"
	"github.com/vgpu/vgpu/api"
)

// TestLoadWithoutDriver loads the real libcuda.so.1: on a host without
// the NVIDIA driver (CI) that fails at once, naming it.
func TestLoadWithoutDriver(t *testing.T) {
	d, err := Load("")
	if err == nil {
		gpus, err := d.GPUs()
		t.Skipf("this host has a CUDA driver (%d GPUs, %v)", len(gpus), err)
	}
	conformance.WantErr(t, "Load", err, api.ErrUnavailable, Library, "no NVIDIA driver")
	_, err = Load("/nonexistent/libcuda.so.1")
	conformance.WantErr(t, "Load of a missing path", err, api.ErrUnavailable, "/nonexistent/libcuda.so.1")
}

// TestLoadLacksSymbol: a library that is not a complete driver is refused
// with the first entry point it lacks, not a crash on first use.
func TestLoadLacksSymbol(t *testing.T) {
	buildFake(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "old.c")
	if err := os.WriteFile(src, []byte("int cuInit(unsigned f) { return 0; }\nint cuDriverGetVersion(int *v) { *v = 9000; return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libold.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	_, err := Load(lib)
	conformance.WantErr(t, "Load of an incomplete driver", err, api.ErrUnavailable, lib, "cuDeviceGetCount")
}

func TestInitFails(t *testing.T) {
	f := buildFake(t)
	f.inject("cuInit", 3, 0)
	_, err := Load(f.path)
	conformance.WantErr(t, "Load with cuInit failing", err, api.ErrUnavailable, "cuInit: CUDA_ERROR_NOT_INITIALIZED (3): initialization error")
}

func TestGPUs(t *testing.T) {
	d, f := load(t)
	f.setMemory(64 << 20)
	v, err := d.Version()
	if err != nil || v != 13000 {
		t.Errorf("Version() = %d, %v; want 13000", v, err)
	}
	gpus, err := d.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	want := GPU{Ordinal: 0, Name: "vgpu fake GPU", UUID: "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf", Memory: 64 << 20}
	if len(gpus) != 1 || gpus[0] != want {
		t.Errorf("GPUs() = %+v, want [%+v]", gpus, want)
	}
	f.inject("cuDeviceGetCount", 999, 0)
	_, err = d.GPUs()
	conformance.WantErr(t, "GPUs with cuDeviceGetCount failing", err, api.ErrInternal, "cuDeviceGetCount: CUDA error 999")
}

// TestVMM maps two physical allocations side by side in one reservation
// and copies across their boundary, as the backend's frames are.
func TestVMM(t *testing.T) {
	d, f := load(t)
	f.setMemory(64 << 20)
	c, err := d.Retain(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	err = c.Do(func(k *Calls) error {
		g, err := k.Granularity()
		if err != nil || g != 2<<20 {
			t.Fatalf("Granularity() = %d, %v; want 2 MiB", g, err)
		}
		base, err := k.Reserve(4*g, g)
		if err != nil {
			t.Fatal(err)
		}
		var hs []uint64
		for i := range 2 {
			h, err := k.Create(g)
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
			if err := k.Map(base+uint64(i)*g, g, h); err != nil {
				t.Fatal(err)
			}
		}
		// Fresh physical memory holds old bytes: the backend must scrub.
		old := make([]byte, 16)
		if err := k.DtoH(old, base); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(old, bytes.Repeat([]byte{0xCD}, 16)) {
			t.Errorf("fresh allocation reads %x, want the fake's 0xCD", old)
		}
		p := make([]byte, 10000)
		for i := range p {
			p[i] = byte(i * 7)
		}
		at := base + g - 5000
		if err := k.HtoD(at, p); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(p))
		if err := k.DtoH(got, at); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, p) {
			t.Errorf("copy across two mapped allocations came back changed")
		}
		if err := k.Memset(at+100, 0, 200); err != nil {
			t.Fatal(err)
		}
		if err := k.DtoH(got[:300], at); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:100], p[:100]) || !bytes.Equal(got[100:300], make([]byte, 200)) {
			t.Errorf("memset of 200 bytes at 100: got %x", got[:300])
		}
		// The third frame of the reservation is not mapped.
		conformance.WantErr(t, "copy into an unmapped frame", k.HtoD(base+2*g, p[:8]), api.ErrInvalidArgument,
			"cuMemcpyHtoD: CUDA_ERROR_INVALID_VALUE (1): invalid argument")
		// Misuse the driver refuses: an unaligned map, too much memory.
		h, err := k.Create(g)
		if err != nil {
			t.Fatal(err)
		}
		conformance.WantErr(t, "unaligned map", k.Map(base+2*g+4096, g, h), api.ErrInvalidArgument, "cuMemMap")
		_, err = k.Create(64 << 20)
		conformance.WantErr(t, "allocation beyond memory", err, api.ErrOutOfMemory, "cuMemCreate", "out of memory")
		// A map whose access cannot be set is undone.
		f.inject("cuMemSetAccess", 1, 0)
		conformance.WantErr(t, "map with cuMemSetAccess failing", k.Map(base+2*g, g, h), api.ErrInvalidArgument, "cuMemSetAccess")
		if err := k.Map(base+2*g, g, h); err != nil {
			t.Errorf("map again after the failed one was undone: %v", err)
		}
		hs = append(hs, h)
		for i, h := range hs {
			if err := k.Unmap(base+uint64(i)*g, g); err != nil {
				t.Error(err)
			}
			if err := k.Release(h); err != nil {
				t.Error(err)
			}
		}
		return k.FreeAddress(base, 4*g)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestContextPerThread: the driver keeps the current context per OS
// thread, so a call on a thread where it is not current fails; Do makes it
// current wherever the goroutine runs.
func TestContextPerThread(t *testing.T) {
	d, _ := load(t)
	c, err := d.Retain(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var bare, inDo error
	offThread(func() {
		d.cuCtxSetCurrent(0)
		bare = d.check("cuMemsetD8", d.cuMemsetD8(0, 0, 0))
		inDo = c.Do(func(k *Calls) error { return k.Memset(0, 0, 0) })
	})
	conformance.WantErr(t, "a call without a current context", bare, api.ErrInternal, "cuMemsetD8: CUDA error 201")
	if inDo != nil {
		t.Errorf("the same call in Do: %v", inDo)
	}
	if err := c.Release(); err != nil {
		t.Fatal(err)
	}
	conformance.WantErr(t, "Do after Release", c.Do(func(*Calls) error { return nil }), api.ErrUnavailable)
}

func TestStreamsAndPinned(t *testing.T) {
	d, f := load(t)
	c, err := d.Retain(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	err = c.Do(func(k *Calls) error {
		g, _ := k.Granularity()
		base, err := k.Reserve(g, 0)
		if err != nil {
			return err
		}
		h, err := k.Create(g)
		if err != nil {
			return err
		}
		if err := k.Map(base, g, h); err != nil {
			return err
		}
		s, err := k.NewStream()
		if err != nil {
			return err
		}
		pin, err := k.HostAlloc(1 << 16)
		if err != nil {
			return err
		}
		b := pin.Bytes()
		for i := range b {
			b[i] = byte(i ^ 0x5a)
		}
		want := bytes.Clone(b)
		if err := k.HtoDAsync(base+100, pin, 0, len(b), s); err != nil {
			return err
		}
		clear(b)
		if err := k.DtoHAsync(pin, 10, len(b)-10, base+110, s); err != nil {
			return err
		}
		if err := k.Sync(s); err != nil {
			return err
		}
		if !bytes.Equal(b[10:], want[10:]) {
			t.Errorf("pinned round trip on a stream came back changed")
		}
		f.inject("cuStreamSynchronize", 700, 0)
		conformance.WantErr(t, "Sync with the stream faulted", k.Sync(s), api.ErrInternal, "cuStreamSynchronize: CUDA error 700")
		for _, err := range []error{k.FreeHost(pin), k.DestroyStream(s), k.Unmap(base, g), k.Release(h), k.FreeAddress(base, g)} {
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f.inject("cuMemHostAlloc", 2, 0)
	err = c.Do(func(k *Calls) error { _, err := k.HostAlloc(4096); return err })
	conformance.WantErr(t, "HostAlloc with the driver out of memory", err, api.ErrOutOfMemory, "cuMemHostAlloc")
}
