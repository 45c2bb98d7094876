package mediator_test

import (
	"bytes"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// A batch of copies too large to gather into a node batch (64 KiB each,
// from host memory) reaches the node as a few merged writes, not a request
// each, and lands as the copies would one by one: scattered offsets, in
// reverse order, and the later of two copies to one place wins.
func TestLargeWritesOfABatchAreMerged(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := sys.dial(t, "acme", 1)
	const size, n = 64 << 10, 64
	src, err := c.HostAlloc(size * n)
	if err != nil {
		t.Fatal(err)
	}
	copy(src, randomBytes(2, size*n))
	p, err := c.Malloc(0, size*n)
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	want := make([]byte, size*n)
	for i := range n {
		at := (n - 1 - i) * size
		s.CopyToDevice(p+client.Ptr(at), src[i*size:(i+1)*size])
		copy(want[at:], src[i*size:(i+1)*size])
	}
	s.CopyToDevice(p, src[5*size:6*size])
	copy(want, src[5*size:6*size])
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	after, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// One reply (a frame header) a node request: n+1 of them unmerged,
	// about (n+1)/16 merged into writes of 1 MiB.
	if replies := (after.NetIn - before.NetIn) / api.HeaderSize; replies > (n+1)/4 {
		t.Fatalf("%d node replies for %d copies of %d bytes in one batch: not merged", replies, n+1, size)
	}
	if after.CopiedIn-before.CopiedIn != size*(n+1) {
		t.Fatalf("%d bytes counted copied in, %d copied", after.CopiedIn-before.CopiedIn, size*(n+1))
	}
	got, err := c.HostAlloc(size * n)
	if err != nil {
		t.Fatal(err)
	}
	s.CopyFromDevice(got, p)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("merged writes left the device's memory other than the copies one by one would")
	}
}
