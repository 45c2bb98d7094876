package mediator

import (
	"io"
	"testing"

	"github.com/sirupsen/logrus"
)

// A journal whose compaction fell due and that then ended (given up,
// closed, or its session's snapshot refused) is due no more: the
// session's reader asks after every request, and would otherwise take a
// snapshot of the whole session at each one, for nothing.
func TestJournalNotDueOnceEnded(t *testing.T) {
	lowerJournalBounds(t, 1<<10, 32<<20)
	j, _, err := openJournal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	for id, end := range map[uint64]func(l *sessionLog){
		1: (*sessionLog).close,
		2: func(l *sessionLog) { l.postpone() }, // a snapshot refused: what compactJournal does
	} {
		l, err := j.begin(sessionRecord{ID: id, Tenant: "shared"}, log)
		if err != nil {
			t.Fatal(err)
		}
		for i := uint32(1); !l.due(); i++ {
			if i > 1000 {
				t.Fatal("1000 records and no compaction due")
			}
			l.add(journalOp{Op: opStream, Stream: i})
		}
		end(l)
		if id == 1 {
			if err := l.compact(nil); err != nil {
				t.Fatal(err)
			}
		}
		if l.due() {
			t.Fatalf("journal %d: still due after it ended", id)
		}
		l.add(journalOp{Op: opStream, Stream: 0})
		if l.due() {
			t.Fatalf("journal %d: due again one record later", id)
		}
	}
}
