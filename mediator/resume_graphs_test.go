package mediator

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// A graph outlives the compaction of its session's journal: the journal
// rewritten when the space empties keeps the graph's record, so that a
// restart from it still launches the graph under its id.
func TestJournalCompactedKeepsGraphs(t *testing.T) {
	h := newHost(t)
	h.start()
	c := h.dial(h.serveHost())
	const n = 64 << 10
	// Where the session's next allocation of n bytes goes while its space
	// is empty: the address the graph names.
	p, err := c.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Free(p); err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	s.Memset(p, 0x5a, n)
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(h.stateDir(), journalDir, strconv.FormatUint(c.Session(), 10)+".journal")
	compacted := false
	var last int64
	for range 1000 {
		q, err := c.Malloc(0, 4<<10)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Free(q); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		compacted = compacted || fi.Size() < last
		last = fi.Size()
	}
	if !compacted {
		t.Fatalf("the journal (%d bytes) was never compacted", last)
	}
	q, err := c.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	if q != p {
		t.Fatalf("an empty space placed %d bytes at %#x, then at %#x", n, p, q)
	}
	h.crash()
	h.start()
	h.serveHost()
	got := make([]byte, n)
	s.CopyFromDevice(got, q) // a read resumes the session
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	s.Replay(g)
	s.CopyFromDevice(got, q)
	if err := s.Synchronize(); err != nil {
		t.Fatalf("launch of the graph after a restart from a compacted journal: %v\n%s", err, h.log.String())
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, n)) {
		t.Fatal("the graph launched after the restart did not set the memory it names")
	}
}
