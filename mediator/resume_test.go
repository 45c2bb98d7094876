package mediator

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
)

// serveHost serves the running mediator on the host socket, made anew.
func (h *host) serveHost() string {
	h.t.Helper()
	sock := filepath.Join(h.dir, "m.sock")
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		h.t.Fatal(err)
	}
	go h.med.Serve(l)
	return sock
}

// dial opens a session of tenant "shared" on socket, closed with the test.
func (h *host) dial(socket string) *client.Client {
	h.t.Helper()
	c, err := client.Dial(client.Options{Socket: socket, Tenant: "shared"})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// crash stops the running mediator as its death would: its files keep
// what they hold (nothing more is written to them), and the nodes see its
// connections drop before it frees anything. Its sessions' teardown then
// fails to reach either.
func (h *host) crash() {
	h.t.Helper()
	m := h.med
	h.med = nil
	m.regs.db.Close()
	m.mu.Lock()
	var rpcs []*wire.RPC
	for _, s := range append(slices.Collect(maps.Values(m.sessions)), slices.Collect(maps.Values(m.restored))...) {
		for _, v := range s.vdevs {
			rpcs = append(rpcs, v.rpc)
		}
		s.shares.mu.Lock()
		rpcs = slices.AppendSeq(rpcs, maps.Values(s.shares.extra)) // its connections for imports only
		s.shares.mu.Unlock()
		s.jr.close() // its end deletes nothing
	}
	m.mu.Unlock()
	for _, r := range rpcs {
		r.Close()
	}
	m.Close()
}

// pattern is n bytes that depend on seed.
func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7+i>>9)
	}
	return b
}

// A session's allocations — their addresses, bytes and seals — survive a
// crash of its mediator: the next one rebuilds them from the journal and
// the frames the node kept, and the client's next calls resume it.
func TestSessionSurvivesACrash(t *testing.T) {
	h := newHost(t)
	h.start()
	c := h.dial(h.serveHost())
	sizes := []uint64{3 << 20, 100 << 10, 4 << 10, 40 << 10}
	var ptrs []client.Ptr
	for _, n := range sizes {
		p, err := c.Malloc(0, n)
		if err != nil {
			t.Fatal(err)
		}
		ptrs = append(ptrs, p)
	}
	if err := c.Free(ptrs[1]); err != nil { // its pages are free again: the replay must free them too
		t.Fatal(err)
	}
	w, err := c.MallocWith(0, 2<<20, client.AllocOptions{Hint: api.HintWeight})
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	for i, p := range ptrs {
		if i != 1 {
			s.CopyToDevice(p, pattern(byte(i), int(sizes[i])))
		}
	}
	s.CopyToDevice(w, pattern(9, 2<<20))
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Seal(w); err != nil {
		t.Fatal(err)
	}

	h.crash()
	out := h.start()
	if !strings.Contains(out, "session restored") {
		t.Fatalf("restart log does not restore the session:\n%s", out)
	}
	h.serveHost()

	for i, p := range ptrs {
		if i == 1 {
			continue
		}
		got := make([]byte, sizes[i])
		s.CopyFromDevice(got, p)
		if err := s.Synchronize(); err != nil {
			t.Fatalf("read of allocation %d after the restart: %v", i, err)
		}
		if !bytes.Equal(got, pattern(byte(i), int(sizes[i]))) {
			t.Fatalf("allocation %d (%d bytes at %#x) differs after the restart", i, sizes[i], p)
		}
	}
	// Still sealed, still allocated; the freed one stays freed.
	s.CopyToDevice(w, []byte{1})
	if err := s.Synchronize(); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("write to the sealed weight after the restart: %v, want permission denied", err)
	}
	if err := c.Free(ptrs[1]); !errors.Is(err, api.ErrInvalidAddress) {
		t.Fatalf("free of an allocation freed before the crash: %v, want invalid address", err)
	}
	p, err := c.Malloc(0, 8<<10)
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range ptrs {
		if i != 1 && p >= q && p < q.Add(sizes[i]) {
			t.Fatalf("new allocation %#x lies in allocation %d at %#x", p, i, q)
		}
	}
	// A second crash restores what the first restore and the calls since
	// journaled. The first call after it, a launch, is not safe to send
	// again: it fails alone, typed, and the session goes on.
	h.crash()
	h.start()
	h.serveHost()
	s.Launch("saxpy", client.I64(16), client.F32(2), client.Buf(ptrs[3]), client.Buf(ptrs[2]))
	if err := s.Synchronize(); !errors.Is(err, client.ErrInterrupted) || !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a launch sent as the mediator was gone: %v, want client.ErrInterrupted", err)
	}
	got := make([]byte, sizes[0])
	s.CopyFromDevice(got, ptrs[0])
	if err := s.Synchronize(); err != nil || !bytes.Equal(got, pattern(0, int(sizes[0]))) {
		t.Fatalf("after a second restart: %v, bytes equal %v", err, bytes.Equal(got, pattern(0, int(sizes[0]))))
	}
	if err := c.Free(p); err != nil {
		t.Fatalf("free of an allocation made between the restarts: %v", err)
	}
}

// Journals with a damaged record or a record cut short restore the other
// sessions and say which ones they dropped; the dropped sessions' clients
// are told they are gone.
func TestJournalDamagedRecord(t *testing.T) {
	h := newHost(t)
	h.start()
	sock := h.serveHost()
	var cs []*client.Client
	var gs []*client.Graph
	for range 3 {
		c := h.dial(sock)
		p, err := c.Malloc(0, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		s := c.Stream()
		s.CopyToDevice(p, pattern(5, 64<<10))
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		// A graph, whose record is the session's last.
		if err := s.BeginCapture(); err != nil {
			t.Fatal(err)
		}
		s.Memset(p, 1, 64<<10)
		g, err := s.EndCapture()
		if err != nil {
			t.Fatal(err)
		}
		cs, gs = append(cs, c), append(gs, g)
	}
	h.crash()
	// Flip a byte of the second session's last record, its graph's.
	path := filepath.Join(h.stateDir(), journalDir, strconv.FormatUint(cs[1].Session(), 10)+".journal")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"op":"graph"`)) {
		t.Fatalf("the journal holds no graph record:\n%q", b)
	}
	b[len(b)-2] ^= 0x20
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// Cut the third one's last record short.
	path = filepath.Join(h.stateDir(), journalDir, strconv.FormatUint(cs[2].Session(), 10)+".journal")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()-3); err != nil {
		t.Fatal(err)
	}
	out := h.start()
	h.serveHost()
	if !strings.Contains(out, "failed its checks") || !strings.Contains(out, "checksum") || !strings.Contains(out, "cut short") || !strings.Contains(out, "restored=1") {
		t.Fatalf("restart log does not report the damaged record, or restores other than one session:\n%s", out)
	}
	if _, err := cs[0].Stats(); err != nil {
		t.Fatalf("the undamaged session: %v", err)
	}
	cs[0].Stream().Replay(gs[0])
	if err := cs[0].Stream().Synchronize(); err != nil {
		t.Fatalf("the undamaged session's graph: %v", err)
	}
	for _, c := range cs[1:] {
		if _, err := c.Stats(); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "no session to resume") {
			t.Fatalf("a damaged session: %v, want unavailable: no session to resume", err)
		}
	}
}

// A mediator that hands over (an upgrade) keeps its sessions for the next
// one, as a crash does, and ends the others as Close does.
func TestHandover(t *testing.T) {
	h := newHost(t)
	h.start()
	c := h.dial(h.serveHost())
	p, err := c.Malloc(0, 5<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := pattern(3, 5<<20)
	c.Stream().CopyToDevice(p, want)
	if err := c.Stream().Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := h.med.Handover(); err != nil {
		t.Fatal(err)
	}
	h.med = nil
	h.start()
	h.serveHost()
	got := make([]byte, len(want))
	c.Stream().CopyFromDevice(got, p)
	if err := c.Stream().Synchronize(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after a handover: %v, bytes equal %v", err, bytes.Equal(got, want))
	}
}

// A session whose journal cannot be written is served on, without it: a
// restart does not restore it from a journal that misses what it did.
func TestJournalWriteFails(t *testing.T) {
	h := newHost(t)
	h.start()
	c := h.dial(h.serveHost())
	if _, err := c.Malloc(0, 4<<10); err != nil {
		t.Fatal(err)
	}
	h.med.mu.Lock()
	s := h.med.sessions[c.Session()]
	h.med.mu.Unlock()
	s.jr.mu.Lock()
	s.jr.f.Close() // its next write fails
	s.jr.mu.Unlock()
	if _, err := c.Malloc(0, 4<<10); err != nil {
		t.Fatalf("malloc once the journal failed: %v, want it served", err)
	}
	if _, err := os.Stat(filepath.Join(h.stateDir(), journalDir, strconv.FormatUint(c.Session(), 10)+".journal")); !os.IsNotExist(err) {
		t.Fatalf("the failed journal: %v, want it deleted", err)
	}
	if !strings.Contains(h.log.String(), "session journal given up") {
		t.Fatalf("the failed journal was not logged:\n%s", h.log.String())
	}
	h.crash()
	h.start()
	h.serveHost()
	if _, err := c.Stats(); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("call after the restart: %v, want unavailable: the session was not restored", err)
	}
}

// The mediator dies before each record of a session's journal in turn —
// an allocation granted but not journaled, a free journaled but not sent,
// a seal — and what the restart restores is consistent: the session is
// restored, every allocation answered before the death reads back its
// bytes, and frames the journal does not map are freed.
func TestDeathAtEachJournalRecord(t *testing.T) {
	defer func() { dieBeforeRecord = nil; stopRedials.Store(false) }()
	a, b := pattern(1, 4<<10), pattern(2, 3<<20)
	for k := 1; k <= 5; k++ {
		t.Run(fmt.Sprint("before record ", k), func(t *testing.T) {
			h := newHost(t)
			h.start()
			c := h.dial(h.serveHost())
			records := 0
			dieBeforeRecord = func(l *sessionLog) bool {
				if records++; records < k {
					return false
				}
				// The process is gone: the session reaches no node, and
				// does not dial one again.
				stopRedials.Store(true)
				for _, v := range h.med.sessions[l.id].vdevs {
					v.rpc.Close()
				}
				return true
			}
			s := c.Stream()
			type live struct {
				p    client.Ptr
				want []byte
			}
			var acked []live
			pa, err := c.Malloc(0, uint64(len(a))) // record 1
			if err == nil {
				s.CopyToDevice(pa, a)
				if err = s.Synchronize(); err == nil {
					acked = append(acked, live{pa, a})
				}
			}
			var pb client.Ptr
			if err == nil {
				pb, err = c.MallocWith(0, uint64(len(b)), client.AllocOptions{Hint: api.HintWeight}) // record 2
			}
			if err == nil {
				s.CopyToDevice(pb, b)
				if err = s.Synchronize(); err == nil {
					acked = append(acked, live{pb, b})
				}
			}
			if err == nil {
				err = c.Seal(pb) // record 3
			}
			if err == nil {
				if err = c.Free(pa); err == nil { // record 4
					acked = acked[1:]
				}
			}
			if err == nil {
				_, err = c.Malloc(0, 64<<10) // record 5
			}
			if err == nil {
				t.Fatalf("every call succeeded though the mediator died before record %d", k)
			}
			dieBeforeRecord = nil
			h.crash()
			stopRedials.Store(false)
			out := h.start()
			h.serveHost()
			if !strings.Contains(out, "session restored") {
				t.Fatalf("death before record %d: not restored:\n%s", k, out)
			}
			for _, x := range acked {
				got := make([]byte, len(x.want))
				s.CopyFromDevice(got, x.p)
				if err := s.Synchronize(); err != nil || !bytes.Equal(got, x.want) {
					t.Fatalf("death before record %d: allocation %#x answered before it: %v, bytes equal %v", k, x.p, err, bytes.Equal(got, x.want))
				}
			}
			// What the restart holds is what its space maps: after the
			// tenant frees all, the node holds nothing of it.
			for _, x := range acked {
				if err := c.Free(x.p); err != nil {
					t.Fatal(err)
				}
			}
			c.Close()
			h.stop()
			h.start()
			if used := h.med.Status().Nodes[0].Devices[0].Used; used != 0 {
				t.Fatalf("death before record %d: the node still holds %d bytes once the session freed all and ended", k, used)
			}
		})
	}
}

// A session restored after a crash counts in the tenants' listing before
// its tenant resumes it: vgpuctl tenants shows, right after the restart,
// the memory and charge it showed before the crash.
func TestRestoredSessionListedBeforeResume(t *testing.T) {
	h := newHost(t)
	h.start()
	c := h.dial(h.serveHost())
	if _, err := c.Malloc(0, 5<<20); err != nil {
		t.Fatal(err)
	}
	listed := func() api.TenantInfo {
		for _, ti := range h.med.Tenants() {
			if ti.Name == "shared" {
				return ti
			}
		}
		t.Fatal("tenant shared not listed")
		return api.TenantInfo{}
	}
	before := listed()
	if before.Allocated < 5<<20 || before.Charged < 5<<20 {
		t.Fatalf("tenant shared before the crash: %+v, want its 5 MiB allocated and charged", before)
	}
	h.crash()
	if out := h.start(); !strings.Contains(out, "session restored") {
		t.Fatalf("restart log does not restore the session:\n%s", out)
	}
	if after := listed(); after != before {
		t.Fatalf("tenant shared after the restart, before its session resumed: %+v, want %+v as before the crash", after, before)
	}
}
