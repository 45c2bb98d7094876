package memory

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

// restartDevice empties device dev of the fake node, as a node that
// restarts comes back with no frame held and no byte kept.
func (n *fakeNode) restartDevice(dev uint32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k := range n.owner {
		if k.dev == dev {
			delete(n.owner, k)
			delete(n.data, k)
			delete(n.sealed, k)
		}
	}
}

// fillChunks writes a recognisable pattern into every chunk of the
// allocation at va through its translation, and returns the bytes and the
// SHA-256 of each chunk.
func fillChunks(t *testing.T, s *Space, l lease, va, size uint64, seed byte) ([]byte, [][32]byte) {
	t.Helper()
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i/4096) ^ seed
	}
	var sums [][32]byte
	for off := uint64(0); off < size; off += FrameSize {
		dev, xs, err := s.TranslateWrite(va+off, FrameSize)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Write(dev, xs[0].Addr, want[off:off+FrameSize]); err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sha256.Sum256(want[off:off+FrameSize]))
	}
	return want, sums
}

// readBack reads [va, va+size) of whole chunks through its translation.
func readBack(s *Space, l lease, va, size uint64) ([]byte, error) {
	got := make([]byte, size)
	for off := uint64(0); off < size; off += FrameSize {
		dev, xs, err := s.Translate(va+off, FrameSize)
		if err != nil {
			return nil, err
		}
		if err := l.Read(dev, xs[0].Addr, got[off:off+FrameSize]); err != nil {
			return nil, err
		}
	}
	return got, nil
}

// A device that loses its memory takes the contents of every allocation
// on it: they fail with the reason given, those of other devices do not,
// new allocations on it work, a lost allocation frees, and a sealed one
// whose sums were recorded is restored with the bytes its caller finds.
func TestLoseAndRestore(t *testing.T) {
	node := newFakeNode(16)
	l := node.lease(0)
	s := NewSpace(l, 0)
	weight, err := s.AllocHint(0, 2*FrameSize, vocab.HintWeight)
	if err != nil {
		t.Fatal(err)
	}
	small, err := s.Alloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Alloc(1, FrameSize)
	if err != nil {
		t.Fatal(err)
	}
	want, sums := fillChunks(t, s, l, weight, 2*FrameSize, 7)
	if err := s.SetSums(weight, sums); !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Fatalf("sums of an unsealed allocation: %v, want ErrInvalidArgument", err)
	}
	if err := s.Seal(weight); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSums(weight, sums); err != nil {
		t.Fatal(err)
	}
	otherWant, _ := fillChunks(t, s, l, other, FrameSize, 9)

	node.restartDevice(0)
	why := fmt.Errorf("device 0 restarted: %w", vocab.ErrUnavailable)
	lost := s.Lose(0, why)
	if len(lost) != 2 || lost[0].VA != weight || len(lost[0].Sums) != 2 || lost[1].VA != small || lost[1].Sums != nil {
		t.Fatalf("lost %+v, want the weight with its 2 sums and the small buffer", lost)
	}
	if st := s.Stats(); st.Lost != 3*FrameSize || st.Frames != 1 {
		t.Fatalf("after the loss: %+v, want 3 chunks lost and the other device's frame held", st)
	}
	if _, _, err := s.Translate(small, 64); !errors.Is(err, vocab.ErrUnavailable) || !errors.Is(err, why) {
		t.Fatalf("translate a lost buffer: %v, want the loss's reason", err)
	}
	if got, err := readBack(s, l, other, FrameSize); err != nil || !bytes.Equal(got, otherWant) {
		t.Fatalf("the other device's buffer after the loss: %v", err)
	}
	fresh, err := s.Alloc(0, 4096) // not into the lost chunk of the small buffer
	if err != nil {
		t.Fatal(err)
	}
	if fresh>>21 == small>>21 {
		t.Fatalf("new allocation %#x placed in the lost chunk of %#x", fresh, small)
	}
	if _, _, err := s.Translate(fresh, 4096); err != nil {
		t.Fatalf("a new allocation on the device that lost its memory: %v", err)
	}

	bad := errors.New("no copy anywhere")
	if err := s.Restore(weight, func(int, [32]byte, []byte) error { return bad }); !errors.Is(err, bad) {
		t.Fatalf("restore whose fill fails: %v", err)
	}
	if _, _, err := s.Translate(weight, 64); !errors.Is(err, why) {
		t.Fatalf("after a failed restore: %v, want still lost", err)
	}
	if err := s.Restore(small, nil); !errors.Is(err, why) {
		t.Fatalf("restore of a buffer without sums: %v, want the loss's reason", err)
	}
	var asked [][32]byte
	if err := s.Restore(weight, func(i int, sum [32]byte, p []byte) error {
		asked = append(asked, sum)
		copy(p, want[uint64(i)*FrameSize:])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(asked) != 2 || asked[0] != sums[0] || asked[1] != sums[1] {
		t.Fatal("restore did not ask for the recorded sums in order")
	}
	if got, err := readBack(s, l, weight, 2*FrameSize); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("restored weight: %v, equal %v", err, bytes.Equal(got, want))
	}
	if err := s.Free(small); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Lost != 0 || st.Frames != 4 {
		t.Fatalf("after restore and free: %+v, want nothing lost and 4 frames held", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(node.violations) > 0 {
		t.Fatal(node.violations)
	}
}

// In an oversubscribing space, what the store holds survives the loss of
// its device: an evicted chunk faults in again on a new frame, and a
// restored allocation goes to the store first.
func TestLoseKeepsStored(t *testing.T) {
	node := newFakeNode(16)
	l := node.lease(0)
	store, err := NewHostStore(8*FrameSize, "")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s := NewSpace(l, 0)
	s.Oversubscribe(store, FrameSize) // one chunk resident at a time
	a, err := s.Alloc(0, FrameSize)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.AllocHint(0, FrameSize, vocab.HintWeight)
	if err != nil {
		t.Fatal(err)
	}
	wantA, _ := fillChunks(t, s, l, a, FrameSize, 1)
	wantB, sums := fillChunks(t, s, l, b, FrameSize, 2) // evicts a to the store
	if err := s.Seal(b); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSums(b, sums); err != nil {
		t.Fatal(err)
	}
	node.restartDevice(0)
	why := fmt.Errorf("device 0 restarted: %w", vocab.ErrUnavailable)
	lost := s.Lose(0, why)
	if len(lost) != 1 || lost[0].VA != b {
		t.Fatalf("lost %+v, want only the resident weight", lost)
	}
	if got, err := readBack(s, l, a, FrameSize); err != nil || !bytes.Equal(got, wantA) {
		t.Fatalf("evicted buffer after the loss: %v", err)
	}
	if err := s.Restore(b, func(_ int, _ [32]byte, p []byte) error { copy(p, wantB); return nil }); err != nil {
		t.Fatal(err)
	}
	if got, err := readBack(s, l, b, FrameSize); err != nil || !bytes.Equal(got, wantB) {
		t.Fatalf("restored weight: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(node.violations) > 0 {
		t.Fatal(node.violations)
	}
}
