package mediator

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/memory"
)

// oversubscribed makes host sessions keep at most 8 MiB resident and
// allocate 4 times that.
func oversubscribed(c *Config) { c.TenantMemory, c.Oversubscribe = 8<<20, 4 }

// writeOversubscribed gives a session a 24 MiB buffer, three times what it
// may keep resident, filled with pattern(3, …), and checks that chunks of
// it were evicted to the session's store file.
func writeOversubscribed(t *testing.T, h *host) (*client.Client, client.Ptr, []byte) {
	t.Helper()
	c := h.dial(h.serveHost())
	const size = 24 << 20
	p, err := c.Malloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	want := pattern(3, size)
	s := c.Stream()
	for off := 0; off < size; off += 4 << 20 {
		s.CopyToDevice(p.Add(uint64(off)), want[off:off+4<<20])
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	h.med.mu.Lock()
	ss := h.med.sessions[c.Session()]
	h.med.mu.Unlock()
	if st := ss.space.Stats(); st.Evictions == 0 || st.Evicted == 0 || ss.durable == nil {
		t.Fatalf("before the crash: %d evictions, %d bytes evicted, store file %v; want chunks evicted to a store file", st.Evictions, st.Evicted, ss.durable != nil)
	}
	return c, p, want
}

func storeFile(h *host, c *client.Client) string {
	return filepath.Join(h.stateDir(), journalDir, strconv.FormatUint(c.Session(), 10)+storeSuffix)
}

// An oversubscribing session survives a crash of its mediator with its
// evicted chunks: the next mediator rebuilds its residency from the
// journal and the store file, every byte reads back, and the evicted
// chunks fault in from the file in the new process.
func TestOversubscribedSessionSurvivesACrash(t *testing.T) {
	h := newHostOf(t, 64<<20)
	h.startWith(oversubscribed)
	c, p, want := writeOversubscribed(t, h)

	h.crash()
	out := h.startWith(oversubscribed)
	if !strings.Contains(out, "session restored") {
		t.Fatalf("restart log does not restore the session:\n%s", out)
	}
	h.med.mu.Lock()
	rs := h.med.restored
	var restored *session
	for _, s := range rs {
		restored = s
	}
	h.med.mu.Unlock()
	if restored == nil {
		t.Fatal("no restored session")
	}
	before := restored.space.Stats()
	if before.Evicted == 0 {
		t.Fatalf("the restored session has nothing evicted: %+v", before)
	}
	h.serveHost()

	got := make([]byte, len(want))
	s := c.Stream()
	s.CopyFromDevice(got, p)
	if err := s.Synchronize(); err != nil {
		t.Fatalf("read after the restart: %v", err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("bytes differ after the restart from offset %d (chunk %d)", i, i/memory.FrameSize)
	}
	if after := restored.space.Stats(); after.Faults == before.Faults {
		t.Fatalf("the read faulted nothing in on the new mediator: %+v", after)
	}
	// The session goes on evicting into its store, and ends with it.
	s.CopyToDevice(p, want[:4<<20])
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := os.Stat(storeFile(h, c))
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store file of an ended session stays: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A damaged store file drops its session whole, saying why; its tenant
// is told the session is gone.
func TestOversubscribedSessionDamagedStore(t *testing.T) {
	h := newHostOf(t, 64<<20)
	h.startWith(oversubscribed)
	c, _, _ := writeOversubscribed(t, h)
	h.crash()
	path := storeFile(h, c)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(4096); off < fi.Size(); off += memory.FrameSize { // a byte of every slot
		if _, err := f.WriteAt([]byte{0x5a}, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	out := h.startWith(oversubscribed)
	if !strings.Contains(out, "CRC-32C") || !strings.Contains(out, path) || strings.Contains(out, "session restored") {
		t.Fatalf("restart log does not drop the session for its damaged store file:\n%s", out)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dropped session's store file stays: %v", err)
	}
	h.serveHost()
	if _, err := c.Stats(); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "no session to resume") {
		t.Fatalf("the dropped session: %v, want unavailable: no session to resume", err)
	}
}

// A mediator that dies before any one record of an oversubscribing
// session — its allocation, an eviction, a fault-in — leaves a journal and
// store file the next one restores from, with every write answered before
// the death intact: whatever an eviction or a fault-in did past its last
// record, the frame or slot it used is one that no record names.
func TestDeathAtEachResidencyRecord(t *testing.T) {
	defer func() { dieBeforeRecord = nil; stopRedials.Store(false) }()
	const size, piece = 16 << 20, 2 << 20 // 8 chunks through 4 resident
	want := pattern(4, size)
	// Records: the allocation, then an eviction and a fault-in for each
	// of the last four pieces and again for the first four.
	order := []int{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}
	const records = 1 + 2*8
	for k := 1; k <= records+1; k++ { // the last: no death, every record written
		t.Run(fmt.Sprint("before record ", k), func(t *testing.T) {
			h := newHostOf(t, 64<<20)
			h.startWith(oversubscribed)
			c := h.dial(h.serveHost())
			n := 0
			dieBeforeRecord = func(l *sessionLog) bool {
				if n++; n < k {
					return false
				}
				stopRedials.Store(true) // the process is gone: no node call, no redial
				for _, v := range h.med.sessions[l.id].vdevs {
					v.rpc.Close()
				}
				return true
			}
			s := c.Stream()
			acked := map[int]bool{}
			p, err := c.Malloc(0, size)
			for _, i := range order {
				if err != nil {
					break
				}
				s.CopyToDevice(p.Add(uint64(i*piece)), want[i*piece:(i+1)*piece])
				if err = s.Synchronize(); err == nil {
					acked[i] = true
				}
			}
			if got := n; k <= records && err == nil || k > records && (err != nil || got != records) {
				t.Fatalf("death before record %d: %d records, last error %v", k, got, err)
			}
			dieBeforeRecord = nil
			h.crash()
			stopRedials.Store(false)
			out := h.startWith(oversubscribed)
			h.serveHost()
			if !strings.Contains(out, "session restored") {
				t.Fatalf("death before record %d: not restored:\n%s", k, out)
			}
			for i := range acked {
				got := make([]byte, piece)
				s.CopyFromDevice(got, p.Add(uint64(i*piece)))
				if err := s.Synchronize(); err != nil || !bytes.Equal(got, want[i*piece:(i+1)*piece]) {
					t.Fatalf("death before record %d: piece %d, answered before it: %v, bytes equal %v", k, i, err, bytes.Equal(got, want[i*piece:(i+1)*piece]))
				}
			}
		})
	}
}

// A handover (an upgrade) keeps an oversubscribing session's store file
// for the next mediator, as a crash does.
func TestOversubscribedSessionHandover(t *testing.T) {
	h := newHostOf(t, 64<<20)
	h.startWith(oversubscribed)
	c, p, want := writeOversubscribed(t, h)
	if err := h.med.Handover(); err != nil {
		t.Fatal(err)
	}
	h.med = nil
	if _, err := os.Stat(storeFile(h, c)); err != nil {
		t.Fatalf("the store file after a handover: %v", err)
	}
	h.startWith(oversubscribed)
	h.serveHost()
	got := make([]byte, len(want))
	c.Stream().CopyFromDevice(got, p)
	if err := c.Stream().Synchronize(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after a handover: %v, bytes equal %v", err, bytes.Equal(got, want))
	}
}
