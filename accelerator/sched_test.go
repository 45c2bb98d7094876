package accelerator

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/isolation"
	"golang.org/x/sys/unix"
)

// fakeClock is simulated time: synthetic slices advance it by their cost,
// and an idle device lets it jump to when it would wake.
type fakeClock struct{ t atomic.Int64 }

func (c *fakeClock) now() time.Duration                      { return time.Duration(c.t.Load()) }
func (c *fakeClock) advance(d time.Duration)                 { c.t.Add(int64(d)) }
func (c *fakeClock) idle(d time.Duration, _ <-chan struct{}) { c.advance(d) }

// schedHarness drives a scheduler on simulated time.
type schedHarness struct {
	t     *testing.T
	clock *fakeClock
	s     *scheduler
	wg    sync.WaitGroup
	gate  chan struct{}
	mu    sync.Mutex
	done  map[string]time.Duration // work each tenant's jobs completed, by their slices' costs
}

func newSchedHarness(t *testing.T) *schedHarness {
	h := &schedHarness{t: t, clock: &fakeClock{}, done: map[string]time.Duration{}}
	h.s = newScheduler(h.clock)
	t.Cleanup(h.s.close)
	return h
}

// hold occupies the runner with a slice that lasts until release, so jobs
// submitted meanwhile all start together.
func (h *schedHarness) hold() {
	h.gate = make(chan struct{})
	running := make(chan struct{})
	h.wg.Go(func() {
		err := h.s.run(tenantShare{name: "~gate"}, func() (int, bool, error) {
			close(running)
			<-h.gate
			return 1, false, nil
		})
		if err != nil {
			h.t.Errorf("gate: %v", err)
		}
	})
	<-running
}

func (h *schedHarness) release() { close(h.gate) }

// submit runs a job for t in the background: slices of cost each while
// more says so. It returns a channel with the job's result.
func (h *schedHarness) submit(t tenantShare, cost time.Duration, more func(i int) bool) <-chan error {
	return h.submitPhase(t, api.PhaseOther, cost, more)
}

// submitPhase is submit for a job whose slices are of phase.
func (h *schedHarness) submitPhase(t tenantShare, phase api.Phase, cost time.Duration, more func(i int) bool) <-chan error {
	res := make(chan error, 1)
	i := 0
	h.wg.Go(func() {
		res <- h.s.runPhased(t, func() (int, bool, error) {
			h.clock.advance(cost)
			h.mu.Lock()
			h.done[t.name] += cost
			h.mu.Unlock()
			i++
			if more(i) {
				return 0, true, nil
			}
			return 1, false, nil
		}, func() api.Phase { return phase })
	})
	// Wait until the job is queued, so the order of submits is the order
	// of arrival.
	for !h.queued(t.name, res) {
		time.Sleep(50 * time.Microsecond)
	}
	return res
}

func (h *schedHarness) queued(name string, res chan error) bool {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	a := h.s.accounts[name]
	return a != nil && len(a.jobs) > 0 || len(res) > 0
}

func (h *schedHarness) until(horizon time.Duration) func(int) bool {
	return func(int) bool { return h.clock.now() < horizon }
}

func (h *schedHarness) used() map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, u := range h.s.usage(0) {
		m[u.Tenant] = u.DeviceTime
	}
	return m
}

// completed is the work each tenant's jobs completed, as they count it:
// the cost of each slice that ran. Fairness is checked on it, not on the
// scheduler's own accounting (used).
func (h *schedHarness) completed() map[string]time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.done)
}

func (h *schedHarness) wait() { h.wg.Wait() }

func TestSchedWeights(t *testing.T) {
	h := newSchedHarness(t)
	h.hold()
	// Different slice costs: shares are of time, not of slices.
	weights := map[string]uint32{"a": 1, "b": 2, "c": 3, "d": 4}
	costs := map[string]time.Duration{"a": 3 * time.Millisecond, "b": time.Millisecond, "c": 500 * time.Microsecond, "d": 2 * time.Millisecond}
	const horizon = 20 * time.Second
	for _, name := range []string{"a", "b", "c", "d"} {
		h.submit(tenantShare{name: name, weight: weights[name]}, costs[name], h.until(horizon))
	}
	h.release()
	h.wait()
	done := h.completed()
	var total time.Duration
	for _, u := range done {
		total += u
	}
	for name, w := range weights {
		share, want := done[name].Seconds()/total.Seconds(), float64(w)/10
		if math.Abs(share-want) > 0.01*want+0.001 {
			t.Errorf("tenant %s (weight %d): share %.4f, want %.4f", name, w, share, want)
		}
	}
}

func TestSchedWorkConserving(t *testing.T) {
	h := newSchedHarness(t)
	// Alone: every slice back to back, no idle time.
	if err := <-h.submit(tenantShare{name: "solo", weight: 5}, time.Millisecond, func(i int) bool { return i < 100 }); err != nil {
		t.Fatal(err)
	}
	if got := h.clock.now(); got != 100*time.Millisecond {
		t.Fatalf("lone tenant: 100 slices of 1ms took %v of device time", got)
	}
	// Two tenants; when the light one is done, the heavy one gets the rest
	// at once.
	h.hold()
	start := h.clock.now()
	a := h.submit(tenantShare{name: "a", weight: 1}, time.Millisecond, func(i int) bool { return i < 50 })
	b := h.submit(tenantShare{name: "b", weight: 1}, time.Millisecond, func(i int) bool { return i < 200 })
	h.release()
	if err := errors.Join(<-a, <-b); err != nil {
		t.Fatal(err)
	}
	if got := h.clock.now() - start; got != 250*time.Millisecond {
		t.Fatalf("250 slices of 1ms took %v: the device idled", got)
	}
}

func TestSchedComputeMax(t *testing.T) {
	t.Run("alone", func(t *testing.T) {
		h := newSchedHarness(t)
		// A capped tenant alone is throttled even though the device idles.
		err := <-h.submit(tenantShare{name: "capped", computeMax: 0.25}, time.Millisecond, func(i int) bool { return i < 2000 })
		if err != nil {
			t.Fatal(err)
		}
		elapsed := h.clock.now()
		used := h.used()["capped"]
		if used != 2*time.Second {
			t.Fatalf("used %v, want 2s", used)
		}
		// At most 0.25 of the elapsed time, apart from the first burst.
		if min := time.Duration(float64(used-capWindow/4) / 0.25); elapsed < min-10*time.Millisecond || elapsed > min+100*time.Millisecond {
			t.Fatalf("2s of device time at cap 0.25 took %v, want about %v", elapsed, min)
		}
	})
	t.Run("with others", func(t *testing.T) {
		h := newSchedHarness(t)
		h.hold()
		const horizon = 10 * time.Second
		// A heavy weight does not lift the cap.
		h.submit(tenantShare{name: "capped", weight: 9, computeMax: 0.1}, time.Millisecond, h.until(horizon))
		h.submit(tenantShare{name: "other", weight: 1}, time.Millisecond, h.until(horizon))
		h.release()
		h.wait()
		// By the work each completed, over the time the device took.
		done, elapsed := h.completed(), h.clock.now()
		capped, other := done["capped"].Seconds()/elapsed.Seconds(), done["other"].Seconds()/elapsed.Seconds()
		t.Logf("capped tenant's work %.4f of %v, the other's %.4f", capped, elapsed, other)
		if capped > 0.1+0.005 || capped < 0.09 {
			t.Errorf("capped tenant's work %.4f of the time, want 0.1", capped)
		}
		if other < 0.895 {
			t.Errorf("uncapped tenant's work %.4f of the time beside a tenant capped at 0.1, want the rest, 0.9", other)
		}
	})
	t.Run("not capped", func(t *testing.T) {
		// 0, 1, negative and NaN mean no cap.
		for _, c := range []float32{0, 1, -0.5, float32(math.NaN()), 7} {
			h := newSchedHarness(t)
			if err := <-h.submit(tenantShare{name: "t", computeMax: c}, time.Millisecond, func(i int) bool { return i < 500 }); err != nil {
				t.Fatal(err)
			}
			if got := h.clock.now(); got != 500*time.Millisecond {
				t.Errorf("compute_max %v: 500 ms of slices took %v", c, got)
			}
		}
	})
}

func TestSchedNoStarvation(t *testing.T) {
	h := newSchedHarness(t)
	h.hold()
	const horizon = 5 * time.Second
	h.submit(tenantShare{name: "heavy", weight: 1000}, 10*time.Millisecond, h.until(horizon))
	var finished time.Duration // runner's until light is done
	light := h.submit(tenantShare{name: "light", weight: 1}, time.Millisecond, func(i int) bool {
		finished = h.clock.now()
		return i < 3
	})
	h.release()
	select {
	case err := <-light:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("light tenant starved")
	}
	// Its three slices cost 3 ms of virtual time, at weight 1000 about 3 s
	// of the heavy tenant's: it finishes long before the heavy one.
	if finished > 2500*time.Millisecond {
		t.Fatalf("light tenant's 3 slices finished at %v", finished)
	}
	h.wait()
}

func TestSchedNoBankedCredit(t *testing.T) {
	h := newSchedHarness(t)
	const horizon = 4 * time.Second
	// busy runs alone for 2s, then pauses the runner while late arrives.
	pause, resume := make(chan struct{}), make(chan struct{})
	paused := false // runner's
	h.submit(tenantShare{name: "busy"}, time.Millisecond, func(int) bool {
		now := h.clock.now()
		if now >= 2*time.Second && !paused {
			paused = true
			close(pause)
			<-resume
		}
		return now < horizon
	})
	<-pause
	before := h.used()
	at := h.clock.now()
	// late must not get the device to itself to make up for the time it
	// did not ask for.
	late := h.submit(tenantShare{name: "late"}, time.Millisecond, func(i int) bool { return i < 200 })
	close(resume)
	if err := <-late; err != nil {
		t.Fatal(err)
	}
	took := h.clock.now() - at
	busy := h.used()["busy"] - before["busy"]
	// While late ran its 200 ms, busy kept about half the device.
	if took < 395*time.Millisecond || busy < 195*time.Millisecond {
		t.Fatalf("late tenant's 200 ms took %v of device time, busy got %v meanwhile: late was banking credit", took, busy)
	}
	h.wait()
}

func TestSchedTenantSharesAcrossConnections(t *testing.T) {
	h := newSchedHarness(t)
	h.hold()
	const horizon = 4 * time.Second
	// Two connections of tenant a share one account against one of b.
	h.submit(tenantShare{name: "a"}, time.Millisecond, h.until(horizon))
	h.submit(tenantShare{name: "a"}, time.Millisecond, h.until(horizon))
	h.submit(tenantShare{name: "b"}, time.Millisecond, h.until(horizon))
	h.release()
	h.wait()
	done := h.completed()
	if d := done["a"] - done["b"]; d > 2*time.Millisecond || d < -2*time.Millisecond {
		t.Fatalf("tenant a with two connections did %v of work, b with one %v: want equal", done["a"], done["b"])
	}
}

func TestSchedSliceOrderAndErrors(t *testing.T) {
	h := newSchedHarness(t)
	var order []int
	err := h.s.run(tenantShare{name: "t"}, func() (int, bool, error) {
		order = append(order, len(order))
		if len(order) == 3 {
			return 1, true, api.ErrInvalidArgument // an error ends the job
		}
		return 0, true, nil
	})
	if !errors.Is(err, api.ErrInvalidArgument) || len(order) != 3 {
		t.Fatalf("job failing at slice 3: err %v after %d slices", err, len(order))
	}
	err = h.s.run(tenantShare{name: "t"}, func() (int, bool, error) { panic("boom") })
	if !errors.Is(err, api.ErrInternal) {
		t.Fatalf("panicking slice: %v, want internal error", err)
	}
	// The runner survived.
	// A job of several launches counts each as its steps complete them.
	steps := 0
	if err := h.s.run(tenantShare{name: "t"}, func() (int, bool, error) {
		steps++
		return 2, steps < 3, nil
	}); err != nil {
		t.Fatal(err)
	}
	// The failed job and the panicked one count one launch each.
	if u := h.s.usage(0); len(u) != 1 || u[0].Launches != 8 || u[0].Slices != 7 {
		t.Fatalf("usage %+v, want 8 launches in 7 slices", u)
	}
}

func TestSchedClose(t *testing.T) {
	h := newSchedHarness(t)
	h.hold()
	queued := h.submit(tenantShare{name: "q"}, time.Millisecond, func(int) bool { return true })
	closed := make(chan struct{})
	go func() { h.s.close(); close(closed) }()
	// close waits for the slice in progress.
	select {
	case <-closed:
		t.Fatal("close returned while a slice ran")
	case <-time.After(20 * time.Millisecond):
	}
	h.release()
	<-closed
	if err := <-queued; !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("job queued at close: %v, want unavailable", err)
	}
	if err := h.s.run(tenantShare{name: "q"}, func() (int, bool, error) { return 1, false, nil }); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("run after close: %v, want unavailable", err)
	}
	h.wait()
}

// TestSchedReentry: a tenant back soon after its last job, or a little
// later with requests of its connection waiting at the node, keeps its
// virtual time; later than that it starts at the system's.
func TestSchedReentry(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gap     time.Duration
		waiting bool
		keeps   bool
	}{
		{"back at once", reentryWindow / 2, false, true},
		{"idle", 3 * reentryWindow, false, false},
		{"requests waiting", busyWindow / 2, true, true},
		{"requests waiting, long gap", 2 * busyWindow, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSchedHarness(t)
			// a's virtual time ends at 0.1 ms; b's passes it during the gap.
			share := tenantShare{name: "a", weight: 10, waiting: func() bool { return tc.waiting }}
			if err := <-h.submit(share, time.Millisecond, func(int) bool { return false }); err != nil {
				t.Fatal(err)
			}
			slices := int(tc.gap / (250 * time.Microsecond))
			if err := <-h.submit(tenantShare{name: "b"}, 250*time.Microsecond, func(i int) bool { return i < slices }); err != nil {
				t.Fatal(err)
			}
			h.hold()
			h.submit(share, time.Millisecond, func(int) bool { return false })
			h.s.mu.Lock()
			kept := h.s.accounts["a"].vtime < h.s.vnow
			h.s.mu.Unlock()
			h.release()
			h.wait()
			if kept != tc.keeps {
				t.Fatalf("after a gap of %v (requests waiting: %v): kept its virtual time %v, want %v", tc.gap, tc.waiting, kept, tc.keeps)
			}
		})
	}
}

func TestSchedPrunesIdleAccounts(t *testing.T) {
	h := newSchedHarness(t)
	for i := range maxAccounts + 10 {
		if err := h.s.run(tenantShare{name: fmt.Sprint("t", i)}, func() (int, bool, error) {
			h.clock.advance(busyWindow)
			return 1, false, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.s.usage(0)); n > maxAccounts {
		t.Fatalf("%d accounts kept, want at most %d", n, maxAccounts)
	}
}

// TestSchedAnticipation: after a job whose connection has its next request
// at the node, the device waits (boundedly) for that tenant if it is next by
// virtual time; otherwise it never idles.
func TestSchedAnticipation(t *testing.T) {
	for _, waiting := range []bool{false, true} {
		h := newSchedHarness(t)
		h.hold()
		start := h.clock.now()
		b := h.submit(tenantShare{name: "b"}, time.Millisecond, func(i int) bool { return i < 10 })
		c := h.submit(tenantShare{name: "c", weight: 10, waiting: func() bool { return waiting }}, time.Millisecond, func(int) bool { return false })
		h.release()
		if err := errors.Join(<-b, <-c); err != nil {
			t.Fatal(err)
		}
		idle := h.clock.now() - start - 11*time.Millisecond
		want := time.Duration(0)
		if waiting {
			want = anticipation
		}
		if idle != want {
			t.Errorf("requests waiting %v: device idled %v, want %v", waiting, idle, want)
		}
	}
}

// TestSchedBusyRunnerOwnsAThread: a job of one slice runs on the quick
// runner (no thread hand-off), and so does a tenant alone; once a job has
// more slices beside another tenant, the device's slices run on the busy
// runner, always on its one thread, so the host's CPU scheduler, not Go's,
// shares the cores between them and the node's network path; with no such
// job left, the quick runner dispatches again.
func TestSchedBusyRunnerOwnsAThread(t *testing.T) {
	h := newSchedHarness(t)
	var seen []bool // per slice: the busy runner ran it
	busyTids := map[int]bool{}
	job := func(tenant string, slices int) {
		t.Helper()
		i := 0
		err := h.s.run(tenantShare{name: tenant}, func() (int, bool, error) {
			h.s.mu.Lock()
			busy := h.s.busy
			h.s.mu.Unlock()
			seen = append(seen, busy)
			if busy {
				busyTids[unix.Gettid()] = true
			}
			i++
			return 1, i < slices, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Alone on the device: nobody to isolate from.
	job("a", 1)
	job("a", 4)
	if want := []bool{false, false, false, false, false}; !slices.Equal(seen, want) {
		t.Errorf("one tenant's slices ran on the busy runner %v, want %v", seen, want)
	}
	for range 2 {
		seen = nil
		job("b", 1)
		job("a", 4)
		job("a", 1)
		if want := []bool{false, false, true, true, true, false}; !slices.Equal(seen, want) {
			t.Errorf("beside another tenant, slices ran on the busy runner %v, want %v", seen, want)
		}
	}
	if len(busyTids) != 1 {
		t.Errorf("the busy runner ran slices on threads %v, want one", busyTids)
	}
	// A tenant idle for longer than sharedWindow no longer counts.
	h.clock.advance(sharedWindow)
	seen = nil
	job("a", 3)
	if want := []bool{false, false, false}; !slices.Equal(seen, want) {
		t.Errorf("after the other tenant left, slices ran on the busy runner %v, want %v", seen, want)
	}
}

// TestSchedYieldsBetweenSlices: between two slices of a job the runner
// yields its core to the host's threads waiting for it, whichever runner
// dispatches, and not after a job's last slice or a failed one; the host
// time a yield gives away is no tenant's device time.
func TestSchedYieldsBetweenSlices(t *testing.T) {
	const cost, away = 100 * time.Microsecond, time.Millisecond
	for _, tc := range []struct {
		name   string
		beside bool // another tenant used the device just before: the busy runner dispatches
		slices int
		failAt int // the slice that fails (and says it has more), or 0
		yields int
	}{
		{"one slice", false, 1, 0, 0},
		{"long job alone", false, 4, 0, 3},
		{"long job beside another tenant", true, 4, 0, 3},
		{"failed slice", false, 4, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSchedHarness(t)
			yields := 0
			h.s.yield = func() { yields++; h.clock.advance(away) } // the host takes the core a while
			if tc.beside {
				if err := h.s.run(tenantShare{name: "b"}, func() (int, bool, error) { h.clock.advance(cost); return 1, false, nil }); err != nil {
					t.Fatal(err)
				}
				yields = 0
			}
			ran, busy := 0, false
			err := h.s.run(tenantShare{name: "a"}, func() (int, bool, error) {
				h.clock.advance(cost)
				ran++
				h.s.mu.Lock()
				busy = busy || h.s.busy
				h.s.mu.Unlock()
				if ran == tc.failAt {
					return 1, true, errors.New("slice failed")
				}
				return 1, ran < tc.slices, nil
			})
			if (err != nil) != (tc.failAt > 0) {
				t.Fatalf("job: %v", err)
			}
			if yields != tc.yields {
				t.Errorf("%d slices run, %d yields, want %d", ran, yields, tc.yields)
			}
			if busy != tc.beside {
				t.Errorf("the busy runner dispatched: %v, want %v", busy, tc.beside)
			}
			if got, want := h.used()["a"], time.Duration(ran)*cost; got != want {
				t.Errorf("device time charged %v for %d slices of %v, want %v: the yields' time counted", got, ran, cost, want)
			}
		})
	}
}

// The time the device idles for an anticipated tenant while another has
// work is that tenant's: it is charged to its virtual time (and to its cap),
// so a tenant that keeps requests queued behind tiny launches cannot hold
// the device idle at nobody's cost.
func TestSchedAnticipationIsCharged(t *testing.T) {
	clock := &fakeClock{}
	s := &scheduler{clock: clock, accounts: map[string]*account{}}
	a := &account{name: "a", weight: 2, computeMax: 0.5, budget: time.Millisecond}
	b := &account{name: "b", weight: 1, vtime: 1, jobs: []*job{{}}}
	s.accounts["a"], s.accounts["b"] = a, b
	s.expect, s.expectUntil = a, clock.now()+anticipation

	if got, wait := s.pick(); got != nil || wait != anticipation {
		t.Fatalf("pick while anticipating a: %v, %v; want nothing for %v", got, wait, anticipation)
	}
	clock.advance(800 * time.Microsecond)
	a.jobs = []*job{{}} // a's next job arrives
	if got, _ := s.pick(); got != a {
		t.Fatalf("pick once a's job arrived: %v, want a", got)
	}
	if want := (800 * time.Microsecond).Seconds() / 2; math.Abs(a.vtime-want) > 1e-12 {
		t.Errorf("a's virtual time after the device idled 800 µs for it: %g, want %g", a.vtime, want)
	}
	// Refilled at half the 800 µs (its cap), less the 800 µs it held.
	if want := min(time.Duration(0.5*float64(capWindow)), 1400*time.Microsecond) - 800*time.Microsecond; a.budget != want {
		t.Errorf("a's cap budget: %v, want %v", a.budget, want)
	}
	// Once another tenant runs before a, the device no longer waits for a:
	// the time after that is not a's.
	s.expect, s.expectUntil = a, clock.now()+anticipation
	a.jobs = nil
	s.pick() // holding for a
	clock.advance(100 * time.Microsecond)
	b.vtime = a.vtime - 1 // b is next, anticipation or not
	before := a.vtime
	if got, _ := s.pick(); got != b {
		t.Fatalf("pick with b ahead of the anticipated a: %v, want b", got)
	}
	if want := (100 * time.Microsecond).Seconds() / 2; math.Abs(a.vtime-before-want) > 1e-12 {
		t.Errorf("a was charged %g for the 100 µs the device waited for it, want %g", a.vtime-before, want)
	}
	charged := a.vtime
	clock.advance(700 * time.Microsecond)
	a.jobs = []*job{{}}
	s.pick()
	if a.vtime != charged {
		t.Errorf("a was charged %g more after b ran in its place", a.vtime-charged)
	}
	// Idling with nobody else waiting costs nothing.
	b.jobs = nil
	s.expect, s.expectUntil = a, clock.now()+anticipation
	a.jobs = nil
	s.pick()
	clock.advance(500 * time.Microsecond)
	a.jobs = []*job{{}}
	before = a.vtime
	s.pick()
	if a.vtime != before {
		t.Errorf("a was charged %g for idling that kept nobody waiting", a.vtime-before)
	}
}

// A small cap, picked often, still refills: the fraction of a nanosecond
// each pick would add is not lost.
func TestSchedSmallCapRefills(t *testing.T) {
	clock := &fakeClock{}
	s := &scheduler{clock: clock, accounts: map[string]*account{}}
	a := &account{name: "a", weight: 1, computeMax: 1e-5, jobs: []*job{{}}}
	s.accounts["a"] = a
	s.pick() // throttled: the bucket starts empty
	for range 2000 {
		clock.advance(70 * time.Microsecond) // others' slices
		if got, _ := s.pick(); got == a {
			return
		}
	}
	t.Fatalf("a tenant capped at 1e-5 never ran in %v of others' slices (budget %v)", clock.now(), a.budget)
}

// The time between a slice's end and the next dispatch, while the device
// does not idle (handing the finished job to its submitter, picking the
// next), is charged to the tenant whose slice ended: a tenant of many tiny
// launches pays for what each costs the device besides its slice. A gap
// after which the device idles is nobody's.
func TestSchedDispatchGapIsCharged(t *testing.T) {
	h := newSchedHarness(t)
	const gap = 40 * time.Microsecond
	afterJob := func() bool { h.clock.advance(gap); return false } // runs as the job ends
	h.hold()
	a := h.submit(tenantShare{name: "a", waiting: afterJob}, 10*time.Microsecond, func(int) bool { return false })
	b := h.submit(tenantShare{name: "b"}, 100*time.Microsecond, func(int) bool { return false })
	h.release()
	if err := errors.Join(<-a, <-b); err != nil {
		t.Fatal(err)
	}
	used := h.used()
	if used["a"] != 10*time.Microsecond+gap || used["b"] != 100*time.Microsecond {
		t.Fatalf("device time a %v, b %v; want a's slice and the gap after it (%v), and b's slice (%v)",
			used["a"], used["b"], 10*time.Microsecond+gap, 100*time.Microsecond)
	}
	// Alone: the gap after a's last job, before the device idles, is not charged.
	c := h.submit(tenantShare{name: "c", waiting: afterJob}, 10*time.Microsecond, func(int) bool { return false })
	if err := <-c; err != nil {
		t.Fatal(err)
	}
	for idle := false; !idle; time.Sleep(50 * time.Microsecond) { // the runner finds no work
		h.s.mu.Lock()
		idle = h.s.last == nil
		h.s.mu.Unlock()
	}
	c = h.submit(tenantShare{name: "c"}, 10*time.Microsecond, func(int) bool { return false })
	if err := <-c; err != nil {
		t.Fatal(err)
	}
	if got := h.used()["c"]; got != 20*time.Microsecond {
		t.Fatalf("device time of c, alone: %v, want its two slices, 20µs", got)
	}
}

// A cap below the least one (as from a mediator that sends 1e-20) counts
// as the least: the tiny tenant's wait for its bucket, which at such a cap
// overflowed into a negative duration that left the runner idle with no
// timer, stays bounded, so the device's other throttled tenants still run.
func TestSchedTinyCap(t *testing.T) {
	h := newSchedHarness(t)
	h.hold()
	// Work done aside puts the tiny tenant's bucket in deficit at once.
	tiny := h.submit(tenantShare{name: "tiny", computeMax: 1e-20, aside: time.Millisecond}, time.Millisecond, func(int) bool { return false })
	half := h.submit(tenantShare{name: "half", computeMax: 0.5}, time.Millisecond, func(i int) bool { return i < 500 })
	h.release()
	for name, res := range map[string]<-chan error{"half": half, "tiny": tiny} {
		select {
		case err := <-res:
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("tenant %q capped beside one capped at 1e-20 never finished (simulated clock at %v)", name, h.clock.now())
		}
	}
	for _, u := range h.s.usage(0) {
		if u.Tenant == "tiny" && u.ComputeMax != minComputeMax {
			t.Errorf("cap of 1e-20 taken as %v, want %v", u.ComputeMax, minComputeMax)
		}
	}
	if used := h.used()["half"]; used != 500*time.Millisecond {
		t.Errorf("tenant capped at 0.5 used %v, want 500ms", used)
	}
}

func TestTenantShareLeastCap(t *testing.T) {
	if minComputeMax != isolation.MinComputeMax {
		t.Errorf("the node's least cap %v is not the quota file's, %v", minComputeMax, isolation.MinComputeMax)
	}
	for _, tc := range []struct{ in, want float32 }{
		{math.SmallestNonzeroFloat32, minComputeMax},
		{1e-20, minComputeMax},
		{1e-14, minComputeMax},
		{0.0005, minComputeMax},
		{0.001, 0.001},
		{0.25, 0.25},
	} {
		if _, got := (tenantShare{computeMax: tc.in}).normalized(); got != max(float64(tc.in), minComputeMax) || float32(got) != tc.want {
			t.Errorf("compute_max %v: normalized to %v, want %v", tc.in, got, tc.want)
		}
	}
}

// The wait for a throttled tenant's bucket is positive and at most
// capWindow whatever the deficit and the cap, even caps that normalized
// never gives.
func TestSchedThrottleWaitBounded(t *testing.T) {
	for _, c := range []float64{math.SmallestNonzeroFloat64, 1e-20, 1e-14, minComputeMax, 0.5, 0.999} {
		for _, d := range []time.Duration{0, 1, time.Microsecond, time.Millisecond, time.Hour, math.MaxInt64} {
			if w := throttleWait(d, c); w <= 0 || w > capWindow {
				t.Errorf("deficit %v at cap %v: wait %v", d, c, w)
			}
		}
	}
	if w, want := throttleWait(time.Millisecond, 0.5), 2*time.Millisecond+time.Microsecond; w != want {
		t.Errorf("1ms at cap 0.5: wait %v, want %v", w, want)
	}
}
