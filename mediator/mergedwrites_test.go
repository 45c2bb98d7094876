package mediator_test

import (
	"bytes"
	"testing"

	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
)

// A batch of copies too large to gather into a node batch (64 KiB each,
// from host memory) reaches the node as a few merged writes, not a request
// each, and lands as the copies would one by one: scattered offsets, in
// reverse order, and the later of two copies to one place wins. Copies
// back into host memory are merged reads, each landing where it should.
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
	if replies := (after.NetIn - before.NetIn) / wire.HeaderSize; replies > (n+1)/4 {
		t.Fatalf("%d node replies for %d copies of %d bytes in one batch: not merged", replies, n+1, size)
	}
	if after.CopiedIn-before.CopiedIn != size*(n+1) {
		t.Fatalf("%d bytes counted copied in, %d copied", after.CopiedIn-before.CopiedIn, size*(n+1))
	}
	// And back, the same way: reads into host memory, merged too.
	got, err := c.HostAlloc(size * n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		s.CopyFromDevice(got[i*size:(i+1)*size], p+client.Ptr((n-1-i)*size))
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	back, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// Each reply carries its payload behind its header.
	if replies := (back.NetIn - after.NetIn - size*n) / wire.HeaderSize; replies > n/4 {
		t.Fatalf("%d node replies for %d copies of %d bytes from the device in one batch: not merged", replies, n, size)
	}
	for i := range n {
		at := (n - 1 - i) * size
		if !bytes.Equal(got[i*size:(i+1)*size], want[at:at+size]) {
			t.Fatalf("copy %d from the device brought back other bytes than the merged writes left", i)
		}
	}
}
