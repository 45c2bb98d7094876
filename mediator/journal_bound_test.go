package mediator

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// A session whose live state outgrows maxJournal — more live allocations
// than a journal of that bound can name, even compacted to a snapshot
// (TestJournalBoundedByLiveState) — has its journal given up (deleted,
// the session served on without surviving a restart), so no tenant fills
// the state directory's disk. A session within the bound keeps its
// journal.
func TestJournalBounded(t *testing.T) {
	lowerJournalBounds(t, 4<<10, 16<<10)
	h := newHost(t)
	h.start()
	sock := h.serveHost()
	dial := func() *client.Client {
		c, err := client.Dial(client.Options{Socket: sock, Tenant: "shared"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	path := func(c *client.Client) string { return journalPath(h, c) }
	churn, calm := dial(), dial()
	if _, err := calm.Malloc(0, 64<<10); err != nil {
		t.Fatal(err)
	}
	const live = 500 // 4 KiB each: some 40 bytes each in a snapshot, 20 KiB in all
	for i := range live {
		if _, err := churn.Malloc(0, 4<<10); err != nil {
			t.Fatal(err)
		}
		if i == 10 {
			fi, err := os.Stat(path(churn))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("journal after 11 allocations: %d bytes", fi.Size())
		}
	}
	if fi, err := os.Stat(path(churn)); err == nil {
		t.Fatalf("after %d live allocations the journal holds %d bytes, bound %d", live, fi.Size(), maxJournal)
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if !strings.Contains(h.log.String(), "session journal given up") || !strings.Contains(h.log.String(), "past its bound") {
		t.Fatalf("the log does not say the journal was given up for its bound:\n%s", h.log.String())
	}
	if _, err := churn.Malloc(0, 4<<10); err != nil {
		t.Fatalf("the session after its journal was given up: %v", err)
	}
	if _, err := os.Stat(path(calm)); err != nil {
		t.Fatalf("the journal of a session within the bound: %v", err)
	}
	h.crash()
	h.start()
	h.serveHost()
	if _, err := calm.Stats(); err != nil {
		t.Fatalf("the session within the bound after a restart: %v", err)
	}
	if _, err := churn.Stats(); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("the session whose journal was given up, after a restart: %v, want unavailable", err)
	}
}

// A tenant that allocates and frees in a loop, its space empty after each
// free, keeps a short journal: once past compactBytes, it is rewritten to
// a snapshot of the session, here little more than its stream. The
// session is restored from the compacted journal, with what it allocated
// since.
func TestJournalCompacted(t *testing.T) {
	h := newHost(t)
	h.start()
	c := h.dial(h.serveHost())
	st, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	path := journalPath(h, c)
	var most int64
	for range 2000 {
		p, err := c.Malloc(0, 4<<10)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Free(p); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, fi.Size())
	}
	if most > compactBytes+4<<10 {
		t.Fatalf("the journal grew to %d bytes, want it compacted past %d", most, compactBytes)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() >= 2000*100/4 {
		t.Fatalf("the journal holds %d bytes after 2000 rounds: never compacted", fi.Size())
	}
	p, err := c.Malloc(0, 100<<10)
	if err != nil {
		t.Fatal(err)
	}
	want := pattern(7, 100<<10)
	st.CopyToDevice(p, want)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	h.crash()
	h.start()
	h.serveHost()
	got := make([]byte, len(want))
	st.CopyFromDevice(got, p) // on the stream made before the compaction
	if err := st.Synchronize(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after a restart from a compacted journal: %v, bytes equal %v\n%s", err, bytes.Equal(got, want), h.log.String())
	}
}
