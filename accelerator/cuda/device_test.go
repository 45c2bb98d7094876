package cuda

import (
	"bytes"
	"testing"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/conformance"
	"github.com/vgpu/vgpu/api"
)

// openFake opens a device of size bytes on the fake driver (fake_test.go),
// which stands in for a GPU; the fake's memory is 64 MiB unless the test
// set it.
func openFake(t *testing.T, size uint64) (*Device, fakeLib) {
	t.Helper()
	drv, f := load(t)
	d, err := New(drv, 0, 0, size, "fake0")
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d, f
}

// TestConformanceHostKernels runs the suite every backend passes against
// the fake driver with kernels on the host (a device without UseKernels):
// memory, copies, scrub and errors through the real binding, and kernel
// results that are the references' bit for bit.
func TestConformanceHostKernels(t *testing.T) {
	conformance.Run(t, func(t *testing.T, size uint64) accelerator.Device {
		d, _ := openFake(t, size)
		return d
	}, conformance.Options{})
}

func TestNewFrees(t *testing.T) {
	drv, f := load(t)
	f.setMemory(16 << 20)
	defer f.setMemory(64 << 20)
	_, err := New(drv, 0, 0, 32<<20, "big")
	conformance.WantErr(t, "New beyond the GPU's memory", err, api.ErrOutOfMemory, "cuMemCreate", "frame 8 of 16")
	f.inject("cuMemMap", 999, 2)
	_, err = New(drv, 0, 0, 8<<20, "mapfails")
	conformance.WantErr(t, "New with the third map failing", err, api.ErrInternal, "frame 2", "cuMemMap")
	_, err = New(drv, 0, 0, 3<<20, "odd")
	conformance.WantErr(t, "New of a size not in frames", err, api.ErrInvalidArgument, "3145728")
	// load's cleanup checks that the failed opens freed everything.
}

// TestFreshFramesZeroed: physical allocations hold old bytes (the fake
// fills them with 0xCD), so a new device must zero them before use.
func TestFreshFramesZeroed(t *testing.T) {
	d, _ := openFake(t, 4<<20)
	defer d.Close()
	var got []byte
	if err := d.Read([]api.Extent{{Addr: 0, Len: 4 << 20}}, func(parts ...[]byte) error { got = parts[0]; return nil }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, 4<<20)) {
		t.Errorf("a new device's memory is not zeroed")
	}
}

// TestScrubChecked: a scrub whose memset fails, or whose completion the
// device reports as failed, is an error, never a silent success.
func TestScrubChecked(t *testing.T) {
	d, f := openFake(t, 4<<20)
	defer d.Close()
	f.inject("cuMemsetD8", 700, 0)
	conformance.WantErr(t, "Scrub with the memset failing", d.Scrub(0, FrameSize), api.ErrInternal, "scrub", "cuMemsetD8")
	f.inject("cuCtxSynchronize", 700, 0)
	conformance.WantErr(t, "Scrub with the device faulting", d.Scrub(0, FrameSize), api.ErrInternal, "scrub", "cuCtxSynchronize")
	if err := d.Scrub(0, FrameSize); err != nil {
		t.Errorf("Scrub after the faults: %v", err)
	}
}

// TestStagedCopies: writes larger than the staging buffer go through both
// halves, and a failing transfer midway is reported with nothing left in
// flight.
func TestStagedCopies(t *testing.T) {
	d, f := openFake(t, 8<<20)
	defer d.Close()
	p := make([]byte, 5*stagingChunk+123)
	for i := range p {
		p[i] = byte(i*31 + i>>11)
	}
	xs := []api.Extent{{Addr: 100, Len: uint64(len(p))}}
	before := f.calls(0)
	if err := d.WriteFrom(xs, bytes.NewReader(p)); err != nil {
		t.Fatal(err)
	}
	if n := f.calls(0) - before; n != 6 {
		t.Errorf("%d host-to-device copies for %d bytes, want 6 chunks of at most %d", n, len(p), stagingChunk)
	}
	var got []byte
	if err := d.Read(xs, func(parts ...[]byte) error { got = bytes.Clone(parts[0]); return nil }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, p) {
		t.Errorf("a staged round trip came back changed")
	}
	f.inject("cuMemcpyHtoD", 700, 3)
	conformance.WantErr(t, "Write with the fourth chunk failing", d.Write(xs, p), api.ErrInternal, "cuMemcpyHtoD")
	if err := d.Write(xs, p); err != nil {
		t.Errorf("Write after the failure: %v", err)
	}
}

// TestCopyOnDevice: a copy whose destination shares no byte with its
// source runs on the device (cuMemcpyDtoD), piece by piece across
// extents of different shapes; an overlapping one goes through the host.
func TestCopyOnDevice(t *testing.T) {
	d, f := openFake(t, 16<<20)
	defer d.Close()
	p := make([]byte, 3*FrameSize)
	for i := range p {
		p[i] = byte(i*5 + i>>9)
	}
	src := []api.Extent{{Addr: 0, Len: FrameSize + 7}, {Addr: FrameSize + 100, Len: 2*FrameSize - 7}}
	if err := d.Write(src, p); err != nil {
		t.Fatal(err)
	}
	dst := []api.Extent{{Addr: 4*FrameSize + 1, Len: 1000}, {Addr: 4*FrameSize + 2000, Len: 3*FrameSize - 1000}}
	dtod, htod := f.calls(3), f.calls(0)
	if err := d.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if n := f.calls(3) - dtod; n != 3 || f.calls(0) != htod {
		t.Errorf("%d device-to-device pieces and %d host-to-device copies, want 3 and none", n, f.calls(0)-htod)
	}
	var got []byte
	if err := d.Read(dst, func(parts ...[]byte) error { got = bytes.Join(parts, nil); return nil }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, p) {
		t.Errorf("a copy on the device came back changed")
	}
	dtod = f.calls(3)
	if err := d.Copy([]api.Extent{{Addr: 10, Len: 100}}, []api.Extent{{Addr: 0, Len: 100}}); err != nil {
		t.Fatal(err)
	}
	if f.calls(3) != dtod {
		t.Errorf("an overlapping copy went device to device, where the driver leaves overlap undefined")
	}
	f.inject("cuMemcpyDtoD", 700, 1)
	conformance.WantErr(t, "Copy with its second piece failing", d.Copy(dst, src), api.ErrInternal, "cuMemcpyDtoD")
}
