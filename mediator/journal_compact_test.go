package mediator

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// lowerJournalBounds sets compactBytes and maxJournal for one test.
func lowerJournalBounds(t *testing.T, compact, most int64) {
	was, wasMost := compactBytes, maxJournal
	compactBytes, maxJournal = compact, most
	t.Cleanup(func() { compactBytes, maxJournal = was, wasMost })
}

func journalPath(h *host, c *client.Client) string {
	return filepath.Join(h.stateDir(), journalDir, strconv.FormatUint(c.Session(), 10)+".journal")
}

// journalGrowth follows a journal's size: the bytes its records added,
// and how many times it shrank (a compaction).
type journalGrowth struct {
	last, most, written int64
	shrunk              int
}

func (g *journalGrowth) look(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("the journal: %v", err)
	}
	if n := fi.Size(); n < g.last {
		g.shrunk++
	} else {
		g.written += n - g.last
	}
	g.last = fi.Size()
	g.most = max(g.most, g.last)
}

// A session that allocates and frees in a loop while it holds live
// allocations — filled, one sealed, one freed with a stream — writes many
// times maxJournal of records, yet its journal stays within the bound,
// compacted again and again to a snapshot of what is live; a mediator
// killed after it rebuilds the session from the last snapshot and the
// records after it: every byte reads back, the seal holds, and the
// allocation freed with its stream goes with it.
func TestJournalBoundedByLiveState(t *testing.T) {
	lowerJournalBounds(t, 4<<10, 16<<10)
	h := newHost(t)
	h.start()
	c := h.dial(h.serveHost())
	st, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	want := map[client.Ptr][]byte{}
	var ptrs []client.Ptr
	for i := range 6 {
		p, err := c.Malloc(0, uint64(i+1)*40<<10)
		if err != nil {
			t.Fatal(err)
		}
		want[p] = pattern(byte(i+1), (i+1)*40<<10)
		ptrs = append(ptrs, p)
		st.CopyToDevice(p, want[p])
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Seal(ptrs[2]); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(ptrs[4]); err != nil { // a hole among the live ones
		t.Fatal(err)
	}
	delete(want, ptrs[4])
	temp, err := c.MallocWith(0, 8<<10, client.AllocOptions{FreeWith: st})
	if err != nil {
		t.Fatal(err)
	}
	path := journalPath(h, c)
	var g journalGrowth
	const rounds = 1500
	for i := range rounds {
		p, err := c.Malloc(0, uint64(4<<10*(1+i%5)))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Free(p); err != nil {
			t.Fatal(err)
		}
		g.look(t, path)
	}
	t.Logf("%d rounds: %d bytes of records, journal at most %d bytes, compacted %d times", rounds, g.written, g.most, g.shrunk)
	if g.written < 4*maxJournal || g.shrunk < 4 {
		t.Fatalf("%d bytes of records, %d compactions: the test did not outgrow the bound %d many times over", g.written, g.shrunk, maxJournal)
	}
	if g.most > maxJournal {
		t.Fatalf("the journal grew to %d bytes, past the bound %d", g.most, maxJournal)
	}
	if strings.Contains(h.log.String(), "given up") || strings.Contains(h.log.String(), "compacting the session's journal failed") {
		t.Fatalf("the journal was given up or not compacted:\n%s", h.log.String())
	}
	p, err := c.Malloc(0, 100<<10) // after the last compaction: a record of its own
	if err != nil {
		t.Fatal(err)
	}
	want[p] = pattern(9, 100<<10)
	st.CopyToDevice(p, want[p])
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}

	h.crash()
	out := h.start()
	h.serveHost()
	if !strings.Contains(out, "session restored") {
		t.Fatalf("not restored:\n%s", out)
	}
	for p, w := range want {
		got := make([]byte, len(w))
		st.CopyFromDevice(got, p) // on the stream made before any compaction
		if err := st.Synchronize(); err != nil || !bytes.Equal(got, w) {
			t.Fatalf("allocation %#x after the restart: %v, bytes equal %v", uint64(p), err, bytes.Equal(got, w))
		}
	}
	st.CopyToDevice(ptrs[2], []byte{1})
	if err := st.Synchronize(); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("a write to the sealed allocation after the restart: %v, want it refused", err)
	}
	h.med.mu.Lock()
	s := h.med.sessions[c.Session()]
	h.med.mu.Unlock()
	before := s.space.Stats().Allocations
	if err := st.Destroy(); err != nil {
		t.Fatal(err)
	}
	if after := s.space.Stats().Allocations; after != before-1 {
		t.Fatalf("destroying the stream after the restart left %d allocations of %d: the one freed with it stays", after, before)
	}
	if err := c.Free(temp); !errors.Is(err, api.ErrInvalidAddress) {
		t.Fatalf("freeing the allocation freed with its stream: %v, want invalid address", err)
	}
}

// An oversubscribing session that pages for a long time — each pass
// faulting in and evicting every chunk of a buffer three times what it
// may keep resident — writes many times maxJournal of residency records,
// yet its journal stays within the bound: each compaction writes down
// which chunk is in which frame or store slot. A mediator killed after it
// rebuilds the session from that: every byte of the last pass reads back.
func TestJournalBoundedWhilePaging(t *testing.T) {
	lowerJournalBounds(t, 2<<10, 6<<10)
	h := newHostOf(t, 64<<20)
	h.startWith(oversubscribed)
	c := h.dial(h.serveHost())
	const size, piece = 24 << 20, 2 << 20
	p, err := c.Malloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	s := c.Stream()
	path := journalPath(h, c)
	var g journalGrowth
	const passes = 20
	for pass := range passes {
		for off := 0; off < size; off += piece { // a write in each chunk
			w := pattern(byte(pass*16+off/piece), 4<<10)
			copy(want[off:], w)
			s.CopyToDevice(p.Add(uint64(off)), w)
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			g.look(t, path)
		}
	}
	h.med.mu.Lock()
	ss := h.med.sessions[c.Session()]
	h.med.mu.Unlock()
	st := ss.space.Stats()
	t.Logf("%d passes: %d evictions, %d faults, %d bytes of records, journal at most %d bytes, compacted %d times", passes, st.Evictions, st.Faults, g.written, g.most, g.shrunk)
	if g.written < 3*maxJournal || g.shrunk < 3 || st.Evictions < passes*8 {
		t.Fatalf("%d bytes of records, %d compactions, %d evictions: the test did not page past the bound %d many times over", g.written, g.shrunk, st.Evictions, maxJournal)
	}
	if g.most > maxJournal {
		t.Fatalf("the journal grew to %d bytes, past the bound %d", g.most, maxJournal)
	}
	h.crash()
	out := h.startWith(oversubscribed)
	h.serveHost()
	if !strings.Contains(out, "session restored") {
		t.Fatalf("not restored:\n%s", out)
	}
	if _, err := c.Stats(); err != nil { // the client resumes on a call it may retry
		t.Fatal(err)
	}
	got := make([]byte, piece)
	for off := 0; off < size; off += piece {
		s.CopyFromDevice(got, p.Add(uint64(off)))
		if err := s.Synchronize(); err != nil || !bytes.Equal(got, want[off:off+piece]) {
			t.Fatalf("chunk %d after the restart: %v, bytes equal %v", off/piece, err, bytes.Equal(got, want[off:off+piece]))
		}
	}
}

// A mediator that dies at any step of a compaction — before it writes,
// halfway through <id>.journal.new, with it written but not renamed, or
// just after the rename — leaves a state directory the next one restores
// the session from whole: the old journal while the new one is not in
// place (the leftover .new deleted, never read), the snapshot once it is.
// Every byte the tenant wrote before reads back, evicted chunks included.
func TestDeathAtEachCompactionStep(t *testing.T) {
	defer func() { dieInCompaction = nil; stopRedials.Store(false) }()
	for step := range compactSteps {
		t.Run(fmt.Sprint("step ", step), func(t *testing.T) {
			lowerJournalBounds(t, 2<<10, 32<<20)
			h := newHostOf(t, 64<<20)
			h.startWith(oversubscribed)
			c, p, want := writeOversubscribed(t, h)
			var died atomic.Bool
			dieInCompaction = func(l *sessionLog, at compactStep) bool {
				if at != step || died.Load() {
					return false
				}
				died.Store(true)
				stopRedials.Store(true) // the process is gone: no node call, no redial
				for _, v := range h.med.sessions[l.id].vdevs {
					v.rpc.Close()
				}
				return true
			}
			small, err := c.Malloc(0, 8<<10)
			if err != nil {
				t.Fatal(err)
			}
			// Allocations and frees journal records until a compaction
			// is due; the mediator dies in it, after the request's
			// answer. What it serves after is not journaled, as a dead
			// one would not have answered.
			for i := 0; !died.Load(); i++ {
				if i == 1000 {
					t.Fatal("no compaction in 1000 allocations")
				}
				q, err := c.Malloc(0, 4<<10)
				if err == nil {
					err = c.Free(q)
				}
				if err != nil && !died.Load() {
					t.Fatal(err)
				}
			}
			dieInCompaction = nil
			_, newErr := os.Stat(journalPath(h, c) + ".new")
			if left := newErr == nil; left != (step == stepHalfWritten || step == stepWritten) {
				t.Fatalf("after a death at step %d, a .new file left: %v", step, left)
			}
			h.crash()
			stopRedials.Store(false)
			out := h.startWith(oversubscribed)
			h.serveHost()
			if !strings.Contains(out, "session restored") {
				t.Fatalf("death at step %d: not restored:\n%s", step, out)
			}
			if _, err := os.Stat(journalPath(h, c) + ".new"); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the leftover .new file after the restart: %v", err)
			}
			j := (&journal{dir: filepath.Join(h.stateDir(), journalDir)}).read(strconv.FormatUint(c.Session(), 10) + ".journal")
			if j.err != nil {
				t.Fatal(j.err)
			}
			if snap := len(j.ops) > 0 && j.ops[0].Op == opLayout; snap != (step == stepRenamed) {
				t.Fatalf("death at step %d: the journal begins with a snapshot: %v", step, snap)
			}
			got := make([]byte, len(want))
			c.Stream().CopyFromDevice(got, p)
			if err := c.Stream().Synchronize(); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("death at step %d: %v, bytes equal %v", step, err, bytes.Equal(got, want))
			}
			if err := c.Free(small); err != nil {
				t.Fatalf("death at step %d: the allocation made before it: %v", step, err)
			}
		})
	}
}

// compactedWith churns allocations through c until its session's journal
// is a snapshot that holds a record of op, and returns that record.
func compactedWith(t *testing.T, h *host, c *client.Client, op string) journalOp {
	t.Helper()
	jr := &journal{dir: filepath.Join(h.stateDir(), journalDir)}
	for range 2000 {
		q, err := c.Malloc(0, 4<<10)
		if err == nil {
			err = c.Free(q)
		}
		if err != nil {
			t.Fatal(err)
		}
		j := jr.read(strconv.FormatUint(c.Session(), 10) + ".journal")
		if j.err != nil {
			t.Fatal(j.err)
		}
		if len(j.ops) == 0 || j.ops[0].Op != opLayout {
			continue
		}
		for _, o := range j.ops {
			if o.Op == op {
				return o
			}
		}
		t.Fatalf("a compacted journal without its %s record: %+v", op, j.ops)
	}
	t.Fatalf("no compaction in 2000 allocations")
	return journalOp{}
}

// sharedBetween has a allocate n bytes, write pattern(1, n) there and
// export them, coherent, to tenant "shared" for writing, and b import
// them; it returns the exporter's and the importer's addresses, the bytes
// and the export.
func sharedBetween(t *testing.T, a, b *client.Client, n int) (p, q client.Ptr, data []byte, sh api.Shared) {
	t.Helper()
	p, err := a.Malloc(0, uint64(n))
	if err != nil {
		t.Fatal(err)
	}
	data = pattern(1, n)
	if err := writeAt(a, p, data); err != nil {
		t.Fatal(err)
	}
	if sh, err = a.Export(p, api.ModeCoherent, api.Grant{Tenant: "shared", Write: true}); err != nil {
		t.Fatal(err)
	}
	q, info, err := b.Import(sh)
	if err != nil || info.Size != uint64(n) {
		t.Fatalf("import: %+v, %v", info, err)
	}
	return p, q, data, sh
}

// A shared buffer's exporter and importer, in two mediators, whose
// journals were compacted to snapshots naming the export and the import,
// go on across both mediators' crash as from a full journal: the
// importer reads the exporter's writes and the exporter the importer's,
// and the import, freed after, stays freed.
func TestSharedBuffersSurviveCompaction(t *testing.T) {
	lowerJournalBounds(t, 2<<10, 32<<20)
	ha, hb, a, b := twoHosts(t, nil)
	const n = 200 << 10
	p, q, data, sh := sharedBetween(t, a, b, n)
	if x := compactedWith(t, ha, a, opExport); x.VA != uint64(p) || x.Object != sh.Object {
		t.Fatalf("the snapshot's export %+v, want allocation %#x as object %d", x, uint64(p), sh.Object)
	}
	if x := compactedWith(t, hb, b, opImport); x.VA != uint64(q) || x.Object != sh.Object || x.Size != n {
		t.Fatalf("the snapshot's import %+v, want object %d at %#x, %d bytes", x, sh.Object, uint64(q), n)
	}
	ha.crash()
	hb.crash()
	for _, h := range []*host{ha, hb} {
		if out := h.start(); !strings.Contains(out, "session restored") {
			t.Fatalf("not restored from the compacted journal:\n%s", out)
		}
		h.serveHost()
	}
	if _, err := b.Stats(); err != nil { // the clients resume on calls they may retry
		t.Fatal(err)
	}
	if _, err := a.Stats(); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(b, q, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the importer after both restarts: %v, equal %v", err, bytes.Equal(got, data))
	}
	copy(data[1000:], pattern(2, 70<<10))
	if err := writeAt(b, q.Add(1000), data[1000:1000+70<<10]); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(a, p, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the exporter reads the importer's write: %v, equal %v", err, bytes.Equal(got, data))
	}
	if err := b.Free(q); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(b, q, 1); !errors.Is(err, api.ErrInvalidAddress) {
		t.Fatalf("the freed import: %v, want invalid address", err)
	}
}
