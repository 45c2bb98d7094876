package memory

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

// residencyEvent is what a Residency was told, with the sum of the entry
// an eviction put.
type residencyEvent struct {
	evicted   bool
	dev       uint32
	va, frame uint64
	key       uint64
	sum       uint32
	keep      bool
}

// residencyLog writes down a space's residency changes, as a journal does.
type residencyLog struct {
	store  *FileStore
	events []residencyEvent
}

func (l *residencyLog) Evicted(dev uint32, va, key uint64) {
	sum, ok := l.store.Sum(key)
	if !ok {
		panic("evicted to a key the store does not hold")
	}
	l.events = append(l.events, residencyEvent{evicted: true, dev: dev, va: va, key: key, sum: sum})
}

func (l *residencyLog) Resident(dev uint32, va, frame uint64, keep bool) {
	l.events = append(l.events, residencyEvent{dev: dev, va: va, frame: frame, keep: keep})
}

// grantLog is a lease that writes down its grants.
type grantLog struct {
	lease
	grants [][]uint64
}

func (g *grantLog) Grant(dev uint32, n int) ([]uint64, error) {
	fs, err := g.lease.Grant(dev, n)
	if err == nil {
		g.grants = append(g.grants, fs)
	}
	return fs, err
}

// replaySource grants the frames it is told to, as a restart's replay
// does with the frames the node kept, and returns nothing to the node.
type replaySource struct {
	lease
	next [][]uint64
}

func (r *replaySource) Grant(dev uint32, n int) ([]uint64, error) {
	if len(r.next) == 0 || len(r.next[0]) != n {
		return nil, errors.New("replay: no such grant recorded")
	}
	g := r.next[0]
	r.next = r.next[1:]
	return g, nil
}

func (r *replaySource) Return(uint32, []uint64) error { return nil }

// An oversubscribing space rebuilt by a later process — its allocation
// replayed with the frames it was granted, then every eviction and
// fault-in a Residency was told of, on the same node frames and the same
// store file — reads back every byte, faulting the evicted chunks in from
// the file; a damaged file fails Verify naming the slot.
func TestSpaceRestoredFromItsResidency(t *testing.T) {
	const chunks = 6
	node := newFakeNode(16)
	path := filepath.Join(t.TempDir(), "s.store")
	store, err := CreateFileStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := &grantLog{lease: node.lease(0)}
	first := NewSpace(src, 0)
	first.Oversubscribe(store, 2*FrameSize)
	rlog := &residencyLog{store: store}
	first.SetResidency(rlog)
	va, err := first.Alloc(0, chunks*FrameSize)
	if err != nil {
		t.Fatal(err)
	}
	allocGrants := src.grants
	want := pattern(7, chunks*FrameSize)
	for i := 0; i < chunks; i++ { // each chunk written once: the later ones evict the earlier
		off := uint64(i) * FrameSize
		dev, xs, err := first.TranslateWrite(va+off, FrameSize)
		if err != nil {
			t.Fatal(err)
		}
		copyExtents(node, dev, xs, want[off:off+FrameSize], true)
	}
	// Back to the first chunk: it faults in from the store.
	if _, _, err := first.Translate(va, 1); err != nil {
		t.Fatal(err)
	}
	st := first.Stats()
	evicted := 0
	for _, e := range rlog.events {
		if e.evicted {
			evicted++
		}
	}
	if st.Evictions == 0 || st.Faults == 0 || evicted != int(st.Evictions) {
		t.Fatalf("before the restart: %d evictions, %d faults, %d eviction events; want some of each, one event per eviction", st.Evictions, st.Faults, evicted)
	}
	// The process dies: the space is never closed, the file stays.
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	restore := func(t *testing.T) (*Space, *FileStore, error) {
		reopened, err := OpenFileStore(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		rs := &replaySource{lease: node.lease(0), next: allocGrants}
		s := NewSpace(rs, 0)
		s.Oversubscribe(reopened, 2*FrameSize)
		if got, err := s.Alloc(0, chunks*FrameSize); err != nil || got != va {
			t.Fatalf("replayed allocation at %#x, %v; want %#x", got, err, va)
		}
		for _, e := range rlog.events {
			if e.evicted {
				if err := reopened.Adopt(e.key, e.sum); err != nil {
					return s, reopened, err
				}
				err = s.RestoreEvicted(e.va, e.key)
			} else {
				rs.next = [][]uint64{{e.frame}}
				err = s.RestoreResident(e.va, e.frame, e.keep)
			}
			if err != nil {
				return s, reopened, err
			}
		}
		return s, reopened, reopened.Verify()
	}

	t.Run("intact", func(t *testing.T) {
		s, reopened, err := restore(t)
		if err != nil {
			t.Fatal(err)
		}
		defer reopened.Close()
		if got, want := s.Stats().Frames, first.Stats().Frames; got != want {
			t.Fatalf("restored space holds %d frames, the first %d", got, want)
		}
		got := make([]byte, chunks*FrameSize)
		for i := 0; i < chunks; i++ {
			off := uint64(i) * FrameSize
			dev, xs, err := s.Translate(va+off, FrameSize)
			if err != nil {
				t.Fatal(err)
			}
			copyExtents(node, dev, xs, got[off:off+FrameSize], false)
		}
		if !bytes.Equal(got, want) {
			i := 0
			for got[i] == want[i] {
				i++
			}
			t.Fatalf("restored bytes differ from offset %d", i)
		}
		if s.Stats().Faults == 0 {
			t.Fatal("the restored space read everything without a fault: nothing came from the store file")
		}
	})

	t.Run("damaged", func(t *testing.T) {
		live := map[uint64]uint64{} // the key each evicted chunk holds at the end
		for _, e := range rlog.events {
			if e.evicted {
				live[e.va] = e.key
			} else if !e.keep {
				delete(live, e.va)
			}
		}
		var key uint64
		for _, k := range live {
			key = k
		}
		if key == 0 {
			t.Fatal("no chunk is evicted at the end")
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{0xff, 0x00, 0xff}, int64(key-1)*FrameSize+100); err != nil {
			t.Fatal(err)
		}
		f.Close()
		_, reopened, err := restore(t)
		defer reopened.Close()
		if !errors.Is(err, vocab.ErrInvalidArgument) || !strings.Contains(err.Error(), "CRC-32C") {
			t.Fatalf("restore from a damaged store file: %v, want a CRC-32C mismatch", err)
		}
		if _, err := reopened.Put(make([]byte, FrameSize)); err == nil {
			t.Fatal("a store whose restore failed took a new entry")
		}
	})
}
