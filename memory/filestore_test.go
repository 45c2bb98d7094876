package memory

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

// A FileStore bound to a container's view counts its entries against the
// view's limit with the view's own: past it a put fails out of memory, a
// drop gives room back and its slot is reused, and closing the store
// gives back what it still held.
func TestFileStoreBound(t *testing.T) {
	h, err := NewHostStore(8*FrameSize, "")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	view := h.Bounded(3 * FrameSize)
	if _, err := view.Put(make([]byte, FrameSize)); err != nil { // one in the host store
		t.Fatal(err)
	}
	fs, err := CreateFileStore(filepath.Join(t.TempDir(), "s.store"), view)
	if err != nil {
		t.Fatal(err)
	}
	a, b := pattern(1, FrameSize), pattern(2, FrameSize)
	ka, err := fs.Put(a)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := fs.Put(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Put(a); !errors.Is(err, vocab.ErrOutOfMemory) {
		t.Fatalf("a fourth entry under a bound of three: %v, want out of memory", err)
	}
	got := make([]byte, FrameSize)
	if err := fs.Get(kb, got); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("get %d: %v, bytes equal %v", kb, err, bytes.Equal(got, b))
	}
	fs.Drop(ka)
	kc, err := fs.Put(b)
	if err != nil || kc != ka {
		t.Fatalf("a put after a drop: key %d, %v; want the dropped key %d reused", kc, err, ka)
	}
	if fs.Bytes() != 2*FrameSize {
		t.Fatalf("the store holds %d bytes, want two entries", fs.Bytes())
	}
	if err := fs.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := view.Put(a); err != nil {
		t.Fatalf("the view after its file store closed: %v", err)
	}
}
