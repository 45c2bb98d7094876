package coherence

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

const sec = time.Second

func newHome(t *testing.T, cfg HomeConfig) *Home {
	t.Helper()
	h, err := NewHome(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// wantErr fails unless err wraps want and its message names each of
// names.
func wantErr(t *testing.T, err, want error, names ...string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not name %q", err, n)
		}
	}
}

func TestNewHomeRefuses(t *testing.T) {
	for _, tc := range []struct {
		cfg  HomeConfig
		name string
	}{
		{HomeConfig{Mode: vocab.Mode(9), Pages: 1}, "mode(9)"},
		{HomeConfig{Mode: vocab.ModePrivate, Pages: 0}, "0 pages"},
		{HomeConfig{Mode: vocab.ModeCoherent, Pages: 1, Lease: 0}, "lease 0s"},
		{HomeConfig{Mode: vocab.ModeCoherent, Pages: 1, Lease: -sec}, "lease -1s"},
	} {
		_, err := NewHome(tc.cfg)
		wantErr(t, err, vocab.ErrInvalidArgument, tc.name)
	}
}

func TestHomeRefusesPagesOutOfRange(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeCoherent, Pages: 4, Lease: sec})
	_, err := h.Read(1, 4, 0, 0)
	wantErr(t, err, vocab.ErrInvalidArgument, "page 4", "4 pages")
	_, err = h.BeginWrite(1, 7, 0)
	wantErr(t, err, vocab.ErrInvalidArgument, "page 7")
	wantErr(t, h.InvalAck(1, 9, 1), vocab.ErrInvalidArgument, "page 9")
	if _, ok := h.Ready(9, 0); ok {
		t.Error("page 9 has a write ready")
	}
	_, err = h.Commit(3)
	wantErr(t, err, vocab.ErrInvalidArgument, "page 3")
	if st := h.Stats(); st != (HomeStats{}) {
		t.Errorf("refused calls counted: %+v", st)
	}
}

func TestCoherentReadLeases(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeCoherent, Pages: 2, Lease: sec})
	g, err := h.Read(1, 0, 0, 0)
	if err != nil || g != (ReadGrant{Version: 0, Lease: sec}) {
		t.Fatalf("Read = %+v, %v", g, err)
	}
	// Renewal extends the registration; another cache registers too.
	if _, err := h.Read(1, 0, 0, sec/2); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Read(2, 0, 0, sec/2); err != nil {
		t.Fatal(err)
	}
	w, err := h.BeginWrite(3, 0, sec)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.Inval, []CacheID{1, 2}) || w.Version != 1 || w.Deadline != sec*3/2 {
		t.Fatalf("BeginWrite = %+v, want Inval [1 2], version 1, deadline 1.5s", w)
	}
	// While the write is in progress, reads are current but not leased.
	g, err = h.Read(4, 0, 0, sec)
	if err != nil || g != (ReadGrant{Version: 0}) {
		t.Fatalf("Read during a write = %+v, %v", g, err)
	}
	// The other page is not affected.
	if g, _ := h.Read(4, 1, 0, sec); g.Lease != sec {
		t.Errorf("page 1 lease %v during a write of page 0", g.Lease)
	}
}

func TestCoherentWriteWaitsForAcksOrExpiry(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeCoherent, Pages: 1, Lease: sec})
	for c := CacheID(1); c <= 3; c++ {
		if _, err := h.Read(c, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	w, err := h.BeginWrite(1, 0, 0) // the writer's own registration needs no Inval
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.Inval, []CacheID{2, 3}) {
		t.Fatalf("Inval %v, want [2 3]", w.Inval)
	}
	_, err = h.Commit(0)
	wantErr(t, err, vocab.ErrInvalidArgument, "page 0")
	if err := h.InvalAck(2, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := h.InvalAck(3, 0, 7); err != nil { // not this write's: ignored
		t.Fatal(err)
	}
	if _, ok := h.Ready(0, sec/2); ok {
		t.Fatal("ready while cache 3 neither acknowledged nor expired")
	}
	// Cache 3 has crashed: the write goes ahead when its lease runs out.
	r, ok := h.Ready(0, sec)
	if !ok || r.ID != w.ID {
		t.Fatalf("Ready at the lease's end = %+v, %v", r, ok)
	}
	if r2, ok := h.Ready(0, sec); !ok || r2.ID != w.ID {
		t.Fatal("Ready not idempotent")
	}
	c, err := h.Commit(0)
	if err != nil || c.ID != w.ID || c.Writer != 1 || c.Version != 1 {
		t.Fatalf("Commit = %+v, %v", c, err)
	}
	if g, _ := h.Read(2, 0, 0, sec); g.Version != 1 || g.Lease != sec {
		t.Errorf("Read after commit = %+v", g)
	}
	if st := h.Stats(); st.Invals != 2 || st.InvalAcks != 2 || st.Expired != 1 || st.Commits != 1 || st.Writes != 1 || st.Reads != 4 {
		t.Errorf("stats %+v", st)
	}
}

func TestCoherentWritesQueue(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeCoherent, Pages: 1, Lease: sec})
	if _, err := h.Read(9, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	w1, _ := h.BeginWrite(1, 0, 0)
	w2, _ := h.BeginWrite(2, 0, 0)
	w3, _ := h.BeginWrite(1, 0, 0)
	if len(w2.Inval) != 0 || len(w3.Inval) != 0 || w2.Deadline != sec || w2.Version != 2 || w3.Version != 3 {
		t.Fatalf("queued writes %+v %+v", w2, w3)
	}
	if _, ok := h.Ready(0, 0); ok {
		t.Fatal("ready before cache 9 acknowledged")
	}
	if err := h.InvalAck(9, 0, w1.Version); err != nil {
		t.Fatal(err)
	}
	var got []WriteID
	for {
		if _, ok := h.Ready(0, 0); !ok {
			break
		}
		c, err := h.Commit(0)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.ID)
	}
	if !slices.Equal(got, []WriteID{w1.ID, w2.ID, w3.ID}) {
		t.Errorf("committed %v, want FIFO %v %v %v", got, w1.ID, w2.ID, w3.ID)
	}
	if g, _ := h.Read(9, 0, 0, 0); g.Version != 3 {
		t.Errorf("version %d after 3 writes", g.Version)
	}
}

// The messages a write costs in coherent mode with 3 other sharers: 3
// invalidations and 3 acknowledgements, besides the write and its ack.
func TestCoherentMessagesPerWrite(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeCoherent, Pages: 1, Lease: sec})
	caches := make([]*Cache, 4)
	for i := range caches {
		c, err := NewCache(1<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		caches[i] = c
	}
	const obj = 1
	read := func(i int, now time.Duration) {
		k := Key{Object: obj}
		if _, _, ok := caches[i].Lookup(k, now); ok {
			return
		}
		tk := caches[i].StartRead(k, now)
		g, err := h.Read(CacheID(i), 0, 0, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := caches[i].Fill(tk, g, []byte("x"), now); err != nil {
			t.Fatal(err)
		}
	}
	const writes = 10
	for n := range writes {
		now := time.Duration(n) * time.Millisecond
		for i := 1; i < 4; i++ {
			read(i, now)
		}
		if err := caches[0].StartWrite(obj, 0); err != nil {
			t.Fatal(err)
		}
		w, err := h.BeginWrite(0, 0, now)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range w.Inval {
			caches[c].Invalidate(obj, 0, w.Version)
			if err := h.InvalAck(c, 0, w.Version); err != nil {
				t.Fatal(err)
			}
		}
		if _, ok := h.Ready(0, now); !ok {
			t.Fatal("not ready after every ack")
		}
		c, err := h.Commit(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := caches[0].FinishWrite(obj, 0, c.Version); err != nil {
			t.Fatal(err)
		}
	}
	st := h.Stats()
	perWrite := float64(st.Invals+st.InvalAcks) / writes
	t.Logf("coherent, 3 sharers: %.1f coherence messages per write (%d Inval, %d InvalAck), besides the write and its ack", perWrite, st.Invals, st.InvalAcks)
	if perWrite != 6 {
		t.Errorf("%.1f coherence messages per write, want 6", perWrite)
	}
}

func TestImmutable(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeImmutable, Pages: 2})
	// Before the seal: written by anyone, read but never cached.
	w, err := h.BeginWrite(5, 0, 0)
	if err != nil || len(w.Inval) != 0 {
		t.Fatalf("BeginWrite = %+v, %v", w, err)
	}
	if g, _ := h.Read(6, 0, 0, 0); g.Lease != 0 || g.Sealed {
		t.Errorf("read during a write before the seal: %+v", g)
	}
	if _, ok := h.Ready(0, 0); !ok {
		t.Fatal("immutable write not ready at once")
	}
	if g, _ := h.Read(6, 0, 0, 0); g.Lease != 0 {
		t.Errorf("read before the seal leased %v", g.Lease)
	}
	if err := h.Seal(); err != nil {
		t.Fatal(err)
	}
	// A write that began before the seal still commits; until it does its
	// page is not cacheable.
	if g, _ := h.Read(6, 0, 0, 0); g.Lease != 0 || !g.Sealed {
		t.Errorf("read of a page still being written after the seal: %+v", g)
	}
	if c, err := h.Commit(0); err != nil || c.Version != 1 {
		t.Fatalf("Commit after seal = %+v, %v", c, err)
	}
	if g, _ := h.Read(6, 0, 0, 0); g != (ReadGrant{Version: 1, Lease: Forever, Sealed: true}) {
		t.Errorf("read after seal = %+v", g)
	}
	_, err = h.BeginWrite(5, 1, 0)
	wantErr(t, err, vocab.ErrPermissionDenied, "page 1", "sealed")
	if err := h.Seal(); err != nil {
		t.Errorf("second seal: %v", err)
	}
}

// Reads of a sealed object cost no message at all once cached, and the
// cache refuses writes to it without asking the home.
func TestImmutableMessagesPerReadAfterSeal(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeImmutable, Pages: 8})
	if err := h.Seal(); err != nil {
		t.Fatal(err)
	}
	c, _ := NewCache(1<<20, sec/100)
	const obj = 3
	for p := range uint32(8) {
		k := Key{Object: obj, Page: p}
		tk := c.StartRead(k, 0)
		g, err := h.Read(1, p, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.Fill(tk, g, []byte{byte(p)}, 0); !ok || err != nil {
			t.Fatalf("Fill = %v, %v", ok, err)
		}
	}
	before := h.Stats()
	const reads = 1000
	for i := range reads {
		now := time.Duration(i) * time.Hour
		if d, _, ok := c.Lookup(Key{Object: obj, Page: uint32(i % 8)}, now); !ok || d[0] != byte(i%8) {
			t.Fatalf("read %d missed", i)
		}
	}
	after := h.Stats()
	msgs := (after.Reads - before.Reads) + (after.Invals - before.Invals) + (after.InvalAcks - before.InvalAcks)
	t.Logf("immutable after seal: %d messages for %d reads", msgs, reads)
	if msgs != 0 {
		t.Errorf("%d messages for %d reads after seal, want 0", msgs, reads)
	}
	wantErr(t, c.StartWrite(obj, 2), vocab.ErrPermissionDenied, "object 3", "page 2")
}

func TestPrivate(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModePrivate, Pages: 1, Owner: 4})
	_, err := h.Read(5, 0, 0, 0)
	wantErr(t, err, vocab.ErrPermissionDenied, "cache 5", "cache 4")
	_, err = h.BeginWrite(5, 0, 0)
	wantErr(t, err, vocab.ErrPermissionDenied, "cache 5")
	if g, err := h.Read(4, 0, 0, 0); err != nil || g != (ReadGrant{Lease: Forever}) {
		t.Fatalf("owner's read = %+v, %v", g, err)
	}
	w, err := h.BeginWrite(4, 0, 0)
	if err != nil || len(w.Inval) != 0 {
		t.Fatalf("owner's write = %+v, %v", w, err)
	}
	if g, _ := h.Read(4, 0, 0, 0); g.Lease != 0 {
		t.Errorf("read during the owner's write leased %v", g.Lease)
	}
	if _, ok := h.Ready(0, 0); !ok {
		t.Fatal("private write not ready at once")
	}
	if c, _ := h.Commit(0); c.Version != 1 {
		t.Errorf("version %d", c.Version)
	}
	if st := h.Stats(); st.Invals+st.InvalAcks != 0 {
		t.Errorf("private object sent coherence messages: %+v", st)
	}
}

func TestVersioned(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeVersioned, Pages: 2})
	v1, err := h.Pin(1)
	if err != nil || v1 != 1 {
		t.Fatalf("Pin = %d, %v", v1, err)
	}
	_, err = h.Read(2, 0, v1, 0)
	wantErr(t, err, vocab.ErrInvalidArgument, "version 1", "cache 2")
	if g, err := h.Read(1, 0, v1, 0); err != nil || g != (ReadGrant{Version: 1, Lease: Forever}) {
		t.Fatalf("Read = %+v, %v", g, err)
	}
	// Writes land in the draft (version 2) with no invalidation, even of
	// a reader that has the page.
	w, err := h.BeginWrite(2, 0, 0)
	if err != nil || len(w.Inval) != 0 || w.Version != 0 {
		t.Fatalf("BeginWrite = %+v, %v", w, err)
	}
	r, ok := h.Ready(0, 0)
	if !ok || r.Version != 2 {
		t.Fatalf("Ready = %+v, %v", r, ok)
	}
	_, err = h.Publish()
	wantErr(t, err, vocab.ErrUnavailable, "page 0")
	if c, err := h.Commit(0); err != nil || c.Version != 2 {
		t.Fatalf("Commit = %+v, %v", c, err)
	}
	if g, _ := h.Read(1, 0, v1, 0); g.Version != 1 {
		t.Errorf("pinned reader sees version %d", g.Version)
	}
	v2, err := h.Publish()
	if err != nil || v2 != 2 {
		t.Fatalf("Publish = %d, %v", v2, err)
	}
	if got := h.Live(); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("Live = %v, want [1 2]", got)
	}
	if _, err := h.Pin(3); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Pin(3); err != nil {
		t.Fatal(err)
	}
	if n := h.Pins(3); n != 2 {
		t.Errorf("Pins(3) = %d after two pins, want 2", n)
	}
	if err := h.Unpin(1, v1); err != nil {
		t.Fatal(err)
	}
	wantErr(t, h.Unpin(1, v1), vocab.ErrInvalidArgument, "version 1", "cache 1")
	if got := h.Live(); !slices.Equal(got, []uint64{2}) {
		t.Errorf("Live = %v after unpinning version 1, want [2]", got)
	}
	h.Forget(3)
	if _, err := h.Read(3, 0, v2, 0); !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Errorf("read of a forgotten pin: %v", err)
	}
	if st := h.Stats(); st.Invals+st.InvalAcks != 0 {
		t.Errorf("versioned object sent coherence messages: %+v", st)
	}
}

func TestModeOnlyOperations(t *testing.T) {
	for _, m := range []vocab.Mode{vocab.ModePrivate, vocab.ModeImmutable, vocab.ModeVersioned, vocab.ModeCoherent} {
		h := newHome(t, HomeConfig{Mode: m, Pages: 1, Lease: sec})
		if h.Mode() != m {
			t.Errorf("Mode() = %v, want %v", h.Mode(), m)
		}
		if m != vocab.ModeImmutable {
			wantErr(t, h.Seal(), vocab.ErrInvalidArgument, m.String())
		}
		if m != vocab.ModeVersioned {
			_, err := h.Pin(1)
			wantErr(t, err, vocab.ErrInvalidArgument, m.String())
			_, err = h.Publish()
			wantErr(t, err, vocab.ErrInvalidArgument, m.String())
			if h.Live() != nil {
				t.Errorf("%v object has live versions %v", m, h.Live())
			}
		}
	}
}
