package mediator_test

import (
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/linearize"
	"github.com/vgpu/vgpu/mediator"
)

// TestLinearizabilityCheckerCatchesStaleCache shows that the rig of the
// linearizability tests (internal/linearize, e2e/) can fail: the same
// workload on two mediators in this process is linearizable, and once
// their caches serve copies after acknowledging their invalidation (a bug
// planted through PlantStaleAfterInval) the checker reports histories that
// are not. Stale serves are counted, so the bug is known to have been
// exercised; the workload is run again, a bounded number of times, until
// one happened.
func TestLinearizabilityCheckerCatchesStaleCache(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	meds := []*system{sys, sys.another(t, "m1")}
	sockets := []string{meds[0].socket, meds[1].socket}
	opt := linearize.Options{Registers: 100, Ops: 4, InFlight: 16, MaxPause: 300 * time.Microsecond}
	// run records and checks opt.Registers histories on a fresh buffer
	// (registers start at 0), and returns how many reads the caches served.
	run := func() (res linearize.Result, hits uint64) {
		t.Helper()
		rig, err := linearize.Setup(sockets, opt.Registers)
		if err != nil {
			t.Fatal(err)
		}
		defer rig.Close()
		res, err = linearize.Run(rig, opt)
		if err != nil {
			t.Fatal(err)
		}
		if res.Histories != opt.Registers {
			t.Fatalf("%d histories recorded, want %d", res.Histories, opt.Registers)
		}
		for _, c := range rig.Clients {
			st, err := c.Stats()
			if err != nil {
				t.Fatal(err)
			}
			hits += st.SharedHits
		}
		return res, hits
	}

	// The correct protocol, its caches used: without hits the bug below
	// would have nothing to break.
	if res, hits := run(); res.Violations > 0 || hits == 0 {
		t.Fatalf("correct protocol: %d reads from the caches, %d histories not linearizable (want some and none), e.g. %s",
			hits, res.Violations, res.Example)
	}

	var stale []func() uint64
	for _, m := range meds {
		stale = append(stale, mediator.PlantStaleAfterInval(m.med))
	}
	served := func() (n uint64) {
		for _, s := range stale {
			n += s()
		}
		return n
	}
	const rounds = 10
	for r := range rounds {
		res, _ := run()
		t.Logf("round %d: %d stale copies served, %d of %d histories not linearizable", r, served(), res.Violations, res.Histories)
		if served() > 0 && res.Violations > 0 {
			return
		}
	}
	t.Fatalf("planted bug not caught in %d rounds: %d stale copies served", rounds, served())
}
