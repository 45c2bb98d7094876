package mediator_test

import (
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// A stream answers a launch's signature from its last launch's while the
// kernel repeats (stream.kernel); a launch of that kernel with another
// argument count, or of another kernel, is still checked against the
// catalog, in one batch as across batches.
func TestLaunchSignatureFromTheLastLaunchStillChecked(t *testing.T) {
	c, p := session(t, 64)
	s := c.Stream()
	for range 3 {
		s.Launch("fill_f32", client.Buf(p), client.I64(1), client.F32(2))
	}
	s.Launch("fill_f32", client.Buf(p), client.I64(1)) // command 3: one argument short
	s.Launch("fill_f32", client.Buf(p), client.I64(1), client.F32(3))
	wantErr(t, s.Synchronize(), api.ErrInvalidArgument, "command 3", "fill_f32", "3 arguments, 2 given")
	s.Launch("fill_f32", client.Buf(p), client.I64(1), client.F32(4))
	s.Launch("fill_f32", client.Buf(p), client.I64(1), client.F32(5), client.I64(6)) // one too many
	wantErr(t, s.Synchronize(), api.ErrInvalidArgument, "command 1", "fill_f32", "3 arguments, 4 given")
	s.Launch("fill_f32", client.Buf(p), client.I64(1), client.F32(7))
	s.Launch("fill_f32x", client.Buf(p), client.I64(1), client.F32(8))
	wantErr(t, s.Synchronize(), api.ErrUnknownKernel, "command 1", "fill_f32x")
	got := make([]byte, 4)
	s.CopyFromDevice(got, p)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if v := client.BytesFloat32(got)[0]; v != 7 {
		t.Fatalf("after the last good launch the buffer holds %g, want 7", v)
	}
}
