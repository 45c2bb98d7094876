package mediator_test

import (
	"bytes"
	"testing"
)

// Memory freed and allocated again within a chunk that stays in use reads as
// zeros, as Malloc promises, not as what the freed buffer held.
func TestReusedPagesReadAsZero(t *testing.T) {
	s := start(t, 1, 1, 1<<30, 0)
	c := s.dial(t, "a", 1)
	st := c.Stream()
	a, err := c.Malloc(0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Malloc(0, 8192); err != nil { // keeps the chunk in use
		t.Fatal(err)
	}
	st.Memset(a, 0xEE, 8192)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(a); err != nil {
		t.Fatal(err)
	}
	b, err := c.Malloc(0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	got := bytes.Repeat([]byte{1}, 8192)
	st.CopyFromDevice(got, b)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, 8192)) {
		t.Fatalf("allocation at %#x (freed one was at %#x) reads %#x..., want zeros", b, a, got[:4])
	}
}
