package accelerator

import (
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestLimitsAreTheLeast: a tenant's weight and cap in force are the least
// that its live connections were given, normalized as the scheduler counts
// them, and the connections disagree exactly when two were given different
// ones when one joins; a connection that ends counts no more.
func TestLimitsAreTheLeast(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := &Node{tenants: map[string]*tenantLimits{}}
		live := map[owner]limit{}
		var tl *tenantLimits
		for i := range rapid.IntRange(1, 20).Draw(rt, "steps") {
			o := owner(rapid.IntRange(1, 5).Draw(rt, "connection"))
			joined, disagree := false, false
			if _, ok := live[o]; ok {
				n.leaveTenant("t", o)
				delete(live, o)
			} else {
				joined = true
				l := limit{rapid.Uint32Range(0, 4).Draw(rt, "weight"),
					rapid.SampledFrom([]float32{0, -1, 0.25, 0.5, 1, 2, float32(math.NaN())}).Draw(rt, "cap")}
				tl, disagree = n.joinTenant("t", o, l)
				live[o] = l
			}
			if len(live) == 0 {
				if n.tenants["t"] != nil {
					rt.Fatalf("step %d: the tenant is kept with no connection", i)
				}
				continue
			}
			least := limit{math.MaxUint32, 1}
			distinct := map[limit]bool{}
			for _, l := range live {
				l = l.normalized()
				distinct[l] = true
				least = limit{min(least.weight, l.weight), min(least.computeMax, l.computeMax)}
			}
			if w, c := tl.get(); w != least.weight || c != least.computeMax {
				rt.Fatalf("step %d: weight %d, cap %v in force; the least of %v is %v", i, w, c, live, least)
			}
			if joined && disagree != (len(distinct) > 1) {
				rt.Fatalf("step %d: disagree %v with %v", i, disagree, live)
			}
		}
	})
}

// TestNodeUsesTheLeastLimits: connections of one tenant whose mediators
// give it different weights and caps all count with the least; once the
// one that gave them ends, the others' count.
func TestNodeUsesTheLeastLimits(t *testing.T) {
	tn := startNode(t)
	generous := tn.connectShare(t, "alice", 4, 0)
	strict := tn.connectShare(t, "alice", 1, 0.5)
	share := func() (uint32, float64) {
		f := generous.alloc(0, 1)[0]
		if err := generous.launch(0, "fill_f32", bufArg(ext(f, 0, 4096)), i64Arg(1024), f32Arg(1)); err != nil {
			t.Fatal(err)
		}
		if err := generous.free(0, f); err != nil {
			t.Fatal(err)
		}
		for _, s := range generous.status().Shares {
			if s.Tenant == "alice" && s.Device == 0 {
				return s.Weight, s.ComputeMax
			}
		}
		t.Fatal("no share of alice on device 0")
		return 0, 0
	}
	// A connection joins its tenant just after its hello's reply, and
	// leaves it after it ends: waitJoined waits until n have joined.
	waitJoined := func(n int, when string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			tn.node.mu.Lock()
			got := len(tn.node.tenants["alice"].from)
			tn.node.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("alice has %d connections counted 5 s %s, want %d", got, when, n)
			}
		}
	}
	waitJoined(2, "after two said hello")
	if w, c := share(); w != 1 || c != 0.5 {
		t.Fatalf("with a connection given weight 1 and cap 0.5 live: weight %d, cap %v", w, c)
	}
	strict.rpc.Close()
	waitJoined(1, "after one of two ended")
	if w, c := share(); w != 4 || c != 0 {
		t.Fatalf("after it ended: weight %d, cap %v, want 4 and no cap", w, c)
	}
}
