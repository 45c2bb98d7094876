package mediator

import (
	"strings"
	"testing"
	"time"
)

// A session whose journal is given up (past its bound) attaches its node
// connections again under the mediator's drop grace: when the mediator
// then dies, nothing can reclaim its frames, and the node frees them
// after the drop grace, not after its own reattach grace (60 s here).
func TestGivenUpJournalFreesAfterDropGrace(t *testing.T) {
	const grace = time.Second
	lowerJournalBounds(t, 4<<10, 16<<10)
	h := newHost(t)
	h.startWith(func(c *Config) { c.DropGrace = grace })
	c := h.dial(h.serveHost())
	for range 500 { // more live allocations than the bound can name
		if _, err := c.Malloc(0, 4<<10); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(h.log.String(), "session journal given up") {
		t.Fatalf("the journal was not given up:\n%s", h.log.String())
	}
	if _, err := c.Stats(); err != nil { // a request after: the reader attaches again
		t.Fatal(err)
	}
	if used := nodeUsed(t, h.node); used == 0 {
		t.Fatal("the node holds nothing of the session")
	}

	h.crash()
	waitFreedAfterDropGrace(t, h.node, time.Now(), grace)
}
