package coherence

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestPropertyCoherent runs random operation sequences on larger worlds
// than the model checker can explore: up to 4 caches and 3 pages, several
// reads and writes in flight per cache, small caches that evict, a crash,
// Drops of the object with reads and writes in flight, and clocks that
// each run at their own rate (±1%) from their own offset, with a margin
// that covers the drift. The world's invariants hold after every step,
// and once it is left to drain, every write commits.
func TestPropertyCoherent(t *testing.T) {
	const lease = 100
	rapid.Check(t, func(t *rapid.T) {
		conf := &wconf{
			caches:    rapid.IntRange(2, 4).Draw(t, "caches"),
			pages:     rapid.IntRange(1, 3).Draw(t, "pages"),
			writes:    rapid.IntRange(0, 12).Draw(t, "writes"),
			lease:     lease,
			margin:    5, // ≥ 2·1%·lease, and the clocks' rounding
			crash:     rapid.Bool().Draw(t, "crash"),
			drops:     rapid.IntRange(0, 2).Draw(t, "drops"),
			maxReads:  rapid.IntRange(1, 3).Draw(t, "maxReads"),
			maxWrites: rapid.IntRange(1, 2).Draw(t, "maxWrites"),
			eager:     rapid.Bool().Draw(t, "eager"),
		}
		conf.capacity = rapid.Int64Range(1, int64(2*(conf.pages+conf.writes))).Draw(t, "capacity")
		clocks := make([]clock, 1+conf.caches)
		for i := range clocks {
			clocks[i] = clock{offset: rapid.Int64Range(0, 1e6).Draw(t, "offset"), rate: rapid.Int64Range(99, 101).Draw(t, "rate")}
		}
		w, err := newWorld(conf, clocks)
		if err != nil {
			t.Fatal(err)
		}
		w.trace = []string{}
		var as []action
		for range rapid.IntRange(0, 400).Draw(t, "steps") {
			as = w.actions(append(as[:0], action{aTick, 1, 0}))
			a := as[rapid.IntRange(0, len(as)-1).Draw(t, "action")]
			if a.kind == aTick {
				a.i = rapid.SampledFrom([]int{1, 5, 20, 50, lease}).Draw(t, "tick")
			}
			if err := w.do(a); err != nil {
				t.Fatalf("%v\n%s", err, w.traceString())
			}
			if err := w.check(); err != nil {
				t.Fatalf("%v\n%s", err, w.traceString())
			}
		}
		if err := w.drain(10, 2*lease/10+4); err != nil {
			t.Fatalf("drain: %v\n%s", err, w.traceString())
		}
	})
}

// TestLeaseMarginCoversClockDrift: a reader whose clock runs 1% slow
// against a home whose clock runs 1% fast keeps a copy past the home's
// expiry of its lease unless the margin covers the drift. A write waiting
// only on that expired lease then commits under the stale copy.
func TestLeaseMarginCoversClockDrift(t *testing.T) {
	const lease = 1000
	for _, tc := range []struct {
		margin time.Duration
		stale  bool
	}{{0, true}, {25, false}} {
		conf := &wconf{caches: 2, pages: 1, writes: 1, lease: lease, margin: tc.margin, capacity: 64, maxReads: 1, maxWrites: 1}
		w, err := newWorld(conf, []clock{{rate: 101}, {rate: 100}, {rate: 99}})
		if err != nil {
			t.Fatal(err)
		}
		steps := []action{
			{aRead, 1, 0},    // cache 1 reads the page at real time 0
			{aDeliver, 0, 0}, // the home serves it: lease to 1000 on its clock, real 990
			{aDeliver, 0, 0}, // cache 1 caches it: valid to 1000-margin on its clock
			{aWrite, 0, 0},
			{aDeliver, 0, 0}, // the home begins the write and sends Inval to cache 1
			{aTick, 995, 0},  // the Inval is slow; the lease expires at the home
			{aCommit, 0, 0},  // and the write commits
			{aDeliver, 1, 0}, // WriteAck to cache 0, leaving the Inval in flight
		}
		for _, a := range steps {
			if err := w.do(a); err != nil {
				t.Fatal(err)
			}
		}
		err = w.check()
		if stale := err != nil; stale != tc.stale {
			t.Errorf("margin %v: stale copy %v, want %v (%v)", tc.margin, stale, tc.stale, err)
		}
	}
}
