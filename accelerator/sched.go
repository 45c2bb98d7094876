package accelerator

// The compute scheduler of a device: it shares device time among the tenants
// of every mediator connected to the node, by weight.
//
// A launch, or a run of consecutive launches of one connection (launch.go),
// becomes a job: a sequence of slices, each bounded in device time. A slice is
// a slice of a kernel (kernels.Plan), bounded in work, or, in a run of small
// launches, several kernel slices in a row, for at most stepTime plus one
// kernel slice (and a launch's preparation), so that tiny launches do not cost
// a dispatch each. A fill or a copy of more than one piece becomes a job
// too, whose slices move pieces of bounded bytes for at most stepTime plus
// one piece (memwork.go); smaller ones, like other work done off the
// runners, are charged as below.
// One runner per device runs one slice at a time and charges the time it
// measured around the slice to the slice's tenant (and with a job, the time
// its submitter spent preparing it). The policy is start-time fair queueing
// over measured time: every tenant has a virtual time that grows by the
// device time it used divided by its weight, and the runner always runs a
// slice of the backlogged tenant with the least virtual time. The time from
// a slice's end to the next dispatch, while the device does not idle (the
// finished job's hand-off, the pick), counts as the ended slice's tenant's
// too. So over any period in which tenants stay backlogged, they get device
// time in proportion to their weights, up to one slice each.
//
// Phases: a job's slices carry the phase of the work they belong to
// (api.Phase; a graph's launch says its own, plain launches, batches, fills
// and copies are api.PhaseOther), and latency-sensitive decode work is
// served ahead of bulk work (prefill, forward, backward, other) within the
// fair shares. Let v be the least virtual time of the backlogged tenants
// that are not throttled. If the next job of some of them (the head of its
// queue) is at a decode slice and its virtual time is at most v plus
// decodeLead, the one of those with the least virtual time runs next, and
// an anticipation (below) gives way to it; otherwise the tenant at v runs,
// as without phases. The empty job that charges a tenant's work done off
// the runners once it adds up (runCharge: preparing launches, the small
// reads and writes around a graph's run) is of the phase of the tenant's
// last slice, so that a decode step's reply does not wait behind bulk
// work for it (it did, for 1-2 ms, in one or two steps of a hundred beside
// a prefill flood). So, precisely:
//   - Decode work whose tenant is within its share (not decodeLead ahead)
//     waits for at most the slice in progress and the pick, whatever bulk
//     work is queued, then runs slice after slice until it is done, its
//     tenant is decodeLead ahead, or decode work of a tenant further behind
//     comes: decode tenants share among themselves by virtual time.
//   - Shares hold: virtual time is charged as always, and decode priority
//     only ever runs a tenant at most decodeLead ahead of v. A tenant that
//     calls all its work decode gains at most decodeLead·weight of device
//     time ahead of its fair share at any moment, and nothing in the long
//     run; caps apply to decode work as to any.
//
// Not guaranteed: decode work beyond its tenant's share waits like bulk
// once the lead is used up (its step time is then its share's). Slices are
// not preempted: a bulk slice in progress delays decode work by up to a
// slice, which sliceWork and stepTime bound (about 70 µs of sgemm on the
// sim); shortening bulk slices while decode work waits would cost bulk
// work a dispatch every few microseconds for little gain beside a decode
// step's several launches, so they are not. Only a tenant's next job
// counts: its decode job queued behind its own bulk job (another
// connection of the tenant) waits its turn. Nothing here covers time spent
// off the device (the network, the node reading requests, the mediator).
// docs/graphs.md ("Phases and scheduling") states the same for tenants.
//
// Invariants:
//   - Work conserving: while any tenant has a slice it may run, the device
//     does not idle, with one bounded exception (anticipation): right after
//     a job whose connection already has its next requests at the node, the
//     device waits up to anticipation for that tenant's next job if it is
//     next by virtual time anyway. The wait is charged to that tenant's
//     share and cap (not to the device time it is reported to have used)
//     when another tenant had work meanwhile.
//     A tenant alone gets the whole device, unless it is capped.
//   - No banked credit: a tenant that becomes backlogged, or comes back from
//     being throttled, starts at the system's virtual time (the start tag of
//     the slice last dispatched), never below it, so idling earns nothing.
//     One exception keeps a busy tenant's share: a tenant whose last job
//     ended less than reentryWindow ago, or less than busyWindow ago with
//     requests of its connection already waiting at the node, was not idle,
//     only between two launches (the node was replying and taking the next
//     request), and keeps its virtual time. What it can bank so is bounded
//     by the device time others used in that gap.
//   - Cap: a tenant with compute_max c (0 < c < 1; a c below minComputeMax
//     counts as minComputeMax) spends from a token bucket that refills at c
//     seconds of device time per second and holds at most c·capWindow;
//     while it is empty the tenant is throttled even if the device idles.
//     Over any interval T it uses at most c·(T + capWindow)
//     plus one slice and one piece of work done off the runners
//     (tenantShare.aside: a launch's preparation, a frame's hash or copy, a
//     small fill) per connection, and less than stepTime of such work
//     owed and not charged yet (account.owed).
//   - Tenants are keyed by name: connections of one tenant, from any
//     mediator, share one account; their jobs take turns slice by slice.
//     The weight and cap are the least that the tenant's live connections
//     were given (limits.go), as of its latest launch. At most
//     maxAccounts accounts are kept: beyond that, idle ones are dropped
//     (a dropped tenant comes back as new, without credit).
//   - A job's slices run in order, on the runner, one at a time; its submitter
//     blocks until the last one has run or one failed, so a connection's
//     requests stay in order. A job counts, in the tenant's launches, the
//     launches its steps report completed (a panicking step: one).
//   - After close, no slice starts; jobs still queued fail with
//     api.ErrUnavailable and close waits for the slice in progress.
//
// The runner is one of two goroutines, only one of which dispatches at a
// time (scheduler.busy says which). The quick runner, an ordinary goroutine,
// dispatches while no job is in progress, so jobs of one slice (a small
// launch) cost no thread hand-off, and while one tenant alone uses the
// device, which has nobody to be isolated from. While a job that ran a slice
// has more (a long kernel) and another tenant used the device within
// sharedWindow, the busy runner, a goroutine locked to a thread of its own,
// dispatches every tenant's slices, and hands back once either ends. On the
// sim backend slices burn host CPU back to back that a real device would
// not; on a goroutine of the Go scheduler they held up the node's network
// path (reading a victim's request, writing its reply) by milliseconds,
// while on a thread of their own the host's CPU scheduler shares the cores
// (BenchmarkNoisyNeighbour; the runs are in docs/benchmarks.md's git
// history). The thread keeps the node's CPU priority: at the
// lowest one, a victim's own slice, and the flood's slice it waits for,
// waited for a core behind the node's other threads, and its p99.9 went
// from about 0.5 ms to 1-4 ms. The runner
// holds scheduler.mu only briefly, but a host saturated by other work can
// leave it waiting for a core with it.
//
// Between two slices of a job, either runner yields its core to the host's
// threads queued on it (sched_yield(2)). Linux leaves a thread woken or
// preempted on the core of a thread that burns it, as a runner of the sim
// does, queued there until that thread's time slice ends, 3-4 ms on these
// 2-core hosts, even while the other core idles. Beside a flood of long
// kernels, such a thread of a decoding tenant's path (the node reading its
// request, planning its graph or answering it, the mediator, the tenant)
// added 3-4 ms to 6-10% of its steps, with or without phases; with the
// yield it waits for one slice (the decoder's prefill-flood runs in
// docs/benchmarks.md's git history). A yield with nobody
// queued costs a system call (about 0.3 µs), and what one gives away is
// nobody's device time: the slice is measured before it, the gap to the
// next dispatch after it.
//
// Lock order: scheduler.mu is a leaf; slices run without it.

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
)

// sliceWork is the work, in kernels.Plan units (about one multiply-add), of a
// slice per worker: about 70 µs of sgemm on the sim backend, so a tenant's
// small kernel waits about that long at most for the device.
const sliceWork = 1 << 17

// sliceWorkers is how many goroutines a slice of the sim backend may use:
// all cores but one, which stays free for the node's network path (reading
// requests, replies), as a real device leaves the host's cores to the host.
// Without it a tenant's small launch would wait for a core at every hop.
func sliceWorkers() int { return max(1, runtime.GOMAXPROCS(0)-1) }

// reentryWindow is how soon after its last job a tenant's next job counts as
// the same busy period (see "No banked credit" above). It covers the gap
// between two launches of a connection, which on a loaded host can be a
// scheduling quantum of the OS.
const reentryWindow = 2 * time.Millisecond

// anticipation is how long the device may idle for a tenant whose job ended
// with its connection's next requests already at the node, when that tenant
// is next by virtual time: the gap is the node taking the next request, and
// running another tenant meanwhile would cost the waiting one its share.
const anticipation = time.Millisecond

// busyWindow is reentryWindow for a tenant whose connection had requests
// waiting at the node when its last job ended: the gap is the node's own
// doing, which on a loaded host can last a few scheduling quanta of the OS.
const busyWindow = 50 * time.Millisecond

// sharedWindow is how recently another tenant must have used the device for
// a long kernel to run on the busy runner (see the package comment): long
// enough to cover a victim's pauses between small launches.
const sharedWindow = time.Second

// decodeLead is how far, in virtual time (device time over weight), a
// tenant whose next slice is decode work may be ahead of the least virtual
// time of the backlogged tenants and still run first (see "Phases" in the
// package comment): a decode step of up to decodeLead·weight of device time
// runs without waiting behind other tenants' bulk slices, and no tenant
// runs more than that ahead of its fair share by calling its work decode.
const decodeLead = 10 * time.Millisecond

// capWindow is the burst a capped tenant may use at once, as device time at
// its cap: a tenant capped at c may run c·capWindow without pause.
const capWindow = 100 * time.Millisecond

// minComputeMax is the least cap a tenant has: a positive compute_max
// below it counts as it. It is the quota file's least compute_max
// (isolation.MinComputeMax), kept by the node for mediators that send less:
// at a smaller cap a throttled tenant's wait for its bucket to refill
// (deficit / cap) is beyond any horizon, and overflowed a time.Duration.
const minComputeMax = 0.001

// clock is the scheduler's time: wall time in the node, simulated in tests.
type clock interface {
	now() time.Duration
	// idle waits until d has passed or wake is signalled.
	idle(d time.Duration, wake <-chan struct{})
}

type wallClock struct{ start time.Time }

func (c wallClock) now() time.Duration { return time.Since(c.start) }

func (wallClock) idle(d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	}
}

// step runs the next slice of a job. It reports how many launches of the
// job it completed (with their last slice, or failed) and whether the job
// has more slices; an error ends the job.
type step func() (completed int, more bool, err error)

// job is one launch, or one run of launches: step runs its next slice.
type job struct {
	step step
	// phase, if set, is the phase of the job's next slice (a graph's runs
	// change phase from launch to launch); called on the dispatching
	// runner, with scheduler.mu held. Unset: api.PhaseOther.
	phase   func() api.Phase
	started bool        // a slice has run; it counts in scheduler.long
	waiting func() bool // from tenantShare
	done    chan error  // buffered; receives the job's result once
}

// nextPhase is the phase of j's next slice.
func (j *job) nextPhase() api.Phase {
	if j.phase == nil {
		return api.PhaseOther
	}
	return j.phase()
}

// decode says whether j's next slice is latency-sensitive decode work.
func (j *job) decode() bool { return j.nextPhase() == api.PhaseDecode }

// account is one tenant's queue and use of one device.
type account struct {
	name       string
	weight     float64
	computeMax float64 // 0: no cap
	vtime      float64 // device seconds / weight
	jobs       []*job  // round robin: the head runs next, then goes to the tail
	throttled  bool
	idleSince  time.Duration // clock time its last job ended, if ran
	ran        bool
	waiting    bool      // its connection had requests waiting when its last job ended
	phase      api.Phase // of the slice of it dispatched last (runCharge)

	budget   time.Duration // token bucket of a capped tenant
	owed     time.Duration // work off the runners not charged yet, less than stepTime (owe)
	refill   time.Duration // clock time of the last refill
	used     time.Duration // device time, ever
	slices   uint64
	launches uint64 // completed
}

// scheduler shares one device among tenants.
type scheduler struct {
	clock clock
	// yield gives the runner's core to the host's threads waiting for it
	// between two slices of a job (yieldCore; tests count the calls).
	yield func()
	// Capacity 1 each: a job arrived, the device was handed over, or close.
	wake, busyWake chan struct{}

	mu       sync.Mutex
	accounts map[string]*account
	vnow     float64 // start tag of the slice last dispatched
	// expect is a tenant whose job just ended with more of its requests
	// waiting at the node; until expectUntil the device waits for it
	// rather than run a tenant that comes after it in virtual time.
	expect      *account
	expectUntil time.Duration
	// holding says the device has idled for expect, since heldSince, while
	// another tenant had work; chargeHeld bills it to expect.
	holding   bool
	heldSince time.Duration
	// last is the account of the slice that ended last, at lastEnd, while
	// the device has not idled since (nil otherwise): the time from then to
	// the next dispatch (the job's hand-off to its submitter, the pick) is
	// charged to it, as a tenant of many tiny launches costs the device
	// that much per launch besides its slices.
	last    *account
	lastEnd time.Duration
	busy    bool // the busy runner dispatches, not the quick one
	long    int  // jobs that ran a slice and have more: long kernels
	shared  bool // at pick: tenants other than one used the device within sharedWindow
	started bool
	closed  bool
	runners sync.WaitGroup
}

func newScheduler(c clock) *scheduler {
	return &scheduler{clock: c, yield: yieldCore, wake: make(chan struct{}, 1), busyWake: make(chan struct{}, 1), accounts: map[string]*account{}}
}

// yieldCore lets the threads waiting for the calling thread's CPU core
// run first, if any (sched_yield(2)): a raw system call, as it does not
// block, so the runner keeps its P.
func yieldCore() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// tenantShare is who a launch is for.
type tenantShare struct {
	name string
	// limits, if set, are the weight and cap in force for the tenant on
	// this node (limits.go); else weight and computeMax.
	limits     *tenantLimits
	weight     uint32  // 0 means 1
	computeMax float32 // ≤ 0, ≥ 1 or NaN: no cap; below minComputeMax: minComputeMax
	// waiting, if set, reports whether the submitting connection has
	// further requests waiting at the node. Called with scheduler.mu held.
	waiting func() bool
	// ending: the connection is ending, and work done for it off the
	// runners (freeing its frames) is charged without waiting for the
	// tenant's turn (chargeOff), so that a throttled tenant's frames are
	// not held from others while it waits.
	ending bool
	// aside is device work done for the job off the runners (preparing
	// its first launch; for an empty job, hashing or copying a frame, a
	// small fill or copy: memwork.go), charged to t when the job is
	// queued, after any reset of its virtual time, as a slice that long
	// would be.
	aside time.Duration
}

func (t tenantShare) normalized() (weight, computeMax float64) {
	w, c := t.weight, t.computeMax
	if t.limits != nil {
		w, c = t.limits.get()
	}
	weight = float64(max(w, 1))
	if c := float64(c); c > 0 && c < 1 {
		computeMax = max(c, minComputeMax)
	}
	return weight, computeMax
}

// run queues a job for t and waits for it: st is called on the runner
// until it reports no more slices or fails. Its slices are of
// api.PhaseOther.
func (s *scheduler) run(t tenantShare, st step) error { return s.runPhased(t, st, nil) }

// runPhased is run for a job whose slices say their phase: phase, if not
// nil, returns the phase of the job's next slice (see job.phase).
func (s *scheduler) runPhased(t tenantShare, st step, phase func() api.Phase) error {
	j := &job{step: st, phase: phase, waiting: t.waiting, done: make(chan error, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("device scheduler closed: %w", api.ErrUnavailable)
	}
	if !s.started {
		s.started = true
		s.runners.Add(2)
		go s.runner(false)
		go s.runner(true)
	}
	a := s.chargeTo(t)
	a.jobs = append(a.jobs, j)
	wake := s.dispatcherWake()
	s.mu.Unlock()
	poke(wake)
	return <-j.done
}

// runCharge runs an empty job for t: it charges t.aside (chargeTo) and
// returns once t's turn has come. The job is of the phase of t's last
// slice, so the work off the runners of a decode tenant's invocations
// (preparing launches, the reads and writes around a graph's run) waits as
// its decode work would, not behind other tenants' bulk work. (t's account
// stays while the job is queued: prune drops only accounts without jobs.)
func (s *scheduler) runCharge(t tenantShare) error {
	return s.runPhased(t, func() (int, bool, error) { return 0, false, nil }, func() api.Phase { return s.accounts[t.name].phase })
}

// owe adds t.aside, device work done for t off the runners, to what t's
// account owes and, once that comes to stepTime or more, returns it, owed
// no more, for the caller to charge with a job; else it returns 0. So work
// too short to be worth a dispatch each is charged once it adds up.
func (s *scheduler) owe(t tenantShare) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.account(t)
	if a.owed += t.aside; a.owed < stepTime {
		return 0
	}
	owed := a.owed
	a.owed = 0
	return owed
}

// chargeNow charges t.aside, device work done for t off the runners, to
// t's account at once, as a slice that long would be, without a job: t's
// next work waits for it as after such a slice.
func (s *scheduler) chargeNow(t tenantShare) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.chargeTo(t)
}

// chargeTo returns t's account, its virtual time first brought up to
// the system's if it was idle (no banked credit), charged t.aside. Called
// with s.mu held.
func (s *scheduler) chargeTo(t tenantShare) *account {
	a := s.account(t)
	if len(a.jobs) == 0 {
		window := reentryWindow
		if a.waiting {
			window = busyWindow
		}
		if !a.ran || s.clock.now()-a.idleSince > window {
			a.vtime = max(a.vtime, s.vnow) // no banked credit
		}
	}
	a.used += t.aside
	a.charge(t.aside)
	return a
}

// account returns t's account, made if missing, with t's weight and cap.
// Called with s.mu held.
func (s *scheduler) account(t tenantShare) *account {
	a := s.accounts[t.name]
	if a == nil {
		s.prune()
		a = &account{name: t.name}
		s.accounts[t.name] = a
	}
	w, c := t.normalized()
	if c != a.computeMax {
		// A tenant newly capped starts with a full bucket; a changed cap
		// never refills it, so alternating caps gain nothing.
		limit := time.Duration(c * float64(capWindow))
		if a.computeMax == 0 {
			a.budget = limit
		} else {
			a.budget = min(a.budget, limit)
		}
		a.refill = s.clock.now()
	}
	a.weight, a.computeMax = w, c
	return a
}

// maxAccounts bounds the accounts a scheduler keeps: past it, accounts of
// tenants idle for longer than busyWindow are dropped (with their history
// in status) when a new tenant arrives.
const maxAccounts = 1024

// prune drops idle accounts when there are too many. Called with s.mu held.
func (s *scheduler) prune() {
	if len(s.accounts) < maxAccounts {
		return
	}
	now := s.clock.now()
	for name, a := range s.accounts {
		if len(a.jobs) == 0 && (!a.ran || now-a.idleSince > busyWindow) {
			delete(s.accounts, name)
		}
	}
}

// dispatched is the accounts whose queues the runner busy may touch: all of
// them if it dispatches, none otherwise. Called with s.mu held.
func (s *scheduler) dispatched(busy bool) map[string]*account {
	if s.busy != busy {
		return nil
	}
	return s.accounts
}

// dispatcherWake is the wake channel of the runner that dispatches. Called
// with s.mu held; every hand-over pokes the new dispatcher, so a job queued
// before one is never missed.
func (s *scheduler) dispatcherWake() chan struct{} {
	if s.busy {
		return s.busyWake
	}
	return s.wake
}

func poke(w chan struct{}) {
	select {
	case w <- struct{}{}:
	default:
	}
}

// close stops the runner after the slice in progress and fails queued jobs.
func (s *scheduler) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	poke(s.wake)
	poke(s.busyWake)
	s.runners.Wait()
}

// pick returns the account whose slice runs next, or, when every backlogged
// tenant is throttled, how long until the first may run again (0: nothing
// is backlogged). Called with s.mu held.
func (s *scheduler) pick() (*account, time.Duration) {
	now := s.clock.now()
	var best *account
	// decode is the account of least virtual time whose next job is
	// decode work (see "Phases" in the package comment).
	var decode *account
	var wait time.Duration
	active := 0
	for _, a := range s.accounts {
		if len(a.jobs) == 0 {
			if a.ran && now-a.idleSince < sharedWindow {
				active++
			}
			continue
		}
		active++
		if a.computeMax > 0 {
			// The refill since the last whole nanosecond of it: a small
			// cap picked often must not lose its fraction at every pick.
			if inc := time.Duration(a.computeMax * float64(now-a.refill)); inc > 0 {
				limit := time.Duration(a.computeMax * float64(capWindow))
				a.budget = min(limit, a.budget+inc)
				a.refill = now
			}
			if a.budget <= 0 {
				a.throttled = true
				w := throttleWait(-a.budget, a.computeMax)
				if wait == 0 || w < wait {
					wait = w
				}
				continue
			}
		}
		if a.throttled {
			a.throttled = false
			a.vtime = max(a.vtime, s.vnow) // throttled time earns nothing either
		}
		if best == nil || a.before(best) {
			best = a
		}
		if a.jobs[0].decode() && (decode == nil || a.before(decode)) {
			decode = a
		}
	}
	s.shared = active > 1
	// Decode work within decodeLead of the least virtual time goes first;
	// it also ends any anticipation of another tenant's next job, which
	// would keep the device idle in front of it, also when it is next by
	// virtual time anyway.
	urgent := decode != nil && decode.vtime-best.vtime <= decodeLead.Seconds()
	if urgent {
		best = decode
	}
	if e := s.expect; e != nil {
		switch {
		case len(e.jobs) > 0 || now >= s.expectUntil || e.throttled:
			s.expect = nil
			s.chargeHeld(e, now)
		case best == nil || e.vtime <= best.vtime && !urgent:
			if best != nil && !s.holding {
				s.holding, s.heldSince = true, now
			}
			return nil, s.expectUntil - now
		default: // best runs: the device no longer waits for e
			s.chargeHeld(e, now)
		}
	}
	return best, wait
}

// before says whether a runs before b by virtual time: the lesser, or of
// equal ones the first by name.
func (a *account) before(b *account) bool {
	return a.vtime < b.vtime || a.vtime == b.vtime && a.name < b.name
}

// throttleWait is how long a tenant capped at c, which owes deficit of
// device time, waits for its bucket to refill: at least a microsecond and
// at most capWindow, after which the runner picks again and waits more if
// need be. Computed in float64 and bounded before the conversion, so that
// no cap, however small, makes it overflow into a negative wait (which the
// runner would take for none to run, and idle untimed, stalling the other
// throttled tenants of the device).
func throttleWait(deficit time.Duration, c float64) time.Duration {
	w := float64(deficit) / c
	if !(w < float64(capWindow)) { // NaN too
		return capWindow
	}
	return max(time.Duration(w), 0) + time.Microsecond
}

// chargeHeld charges e, whose anticipation has ended, for the time the
// device idled for it while another tenant had work: that time was e's, or
// a tenant could keep the device idle, at the cost of nobody, by keeping
// requests queued behind each tiny launch. Called with s.mu held.
func (s *scheduler) chargeHeld(e *account, now time.Duration) {
	if !s.holding {
		return
	}
	s.holding = false
	e.charge(now - s.heldSince)
}

// charge counts d of device time against a: its virtual time (its share)
// and its cap, not the device time it is reported to have used.
func (a *account) charge(d time.Duration) {
	a.vtime += d.Seconds() / a.weight
	if a.computeMax > 0 {
		a.budget -= d
	}
}

// runner is the quick runner, or with busy the busy one (see the package
// comment): each dispatches only while it holds the device.
func (s *scheduler) runner(busy bool) {
	defer s.runners.Done()
	wake := s.wake
	if busy {
		wake = s.busyWake
		runtime.LockOSThread() // never unlocked: the thread ends with the runner
	}
	for {
		s.mu.Lock()
		var a *account
		for !s.closed {
			var wait time.Duration
			if s.busy == busy {
				a, wait = s.pick()
				switch {
				case !busy && a != nil && s.long > 0 && s.shared:
					s.busy = true // a long kernel beside others: hand the device over
					poke(s.busyWake)
				case busy && (a == nil || s.long == 0 || !s.shared):
					s.busy = false // the quick runner takes over
					poke(s.wake)
				}
			}
			if a != nil && s.busy == busy {
				break
			}
			a = nil
			timed := wait > 0 && s.busy == busy
			if s.busy == busy {
				s.last = nil // the device idles: the gap is nobody's
			}
			s.mu.Unlock()
			if timed {
				s.clock.idle(wait, wake)
			} else {
				<-wake
			}
			s.mu.Lock()
		}
		if s.closed {
			// The other runner may be amid a slice; the dispatcher
			// fails the queue once its own slice has ended.
			for _, a := range s.dispatched(busy) {
				for _, j := range a.jobs {
					j.done <- fmt.Errorf("device scheduler closed: %w", api.ErrUnavailable)
				}
				a.jobs = nil
			}
			s.mu.Unlock()
			return
		}
		if l := s.last; l != nil {
			gap := s.clock.now() - s.lastEnd
			l.used += gap
			l.charge(gap)
		}
		s.vnow = a.vtime
		j := a.jobs[0]
		a.phase = j.nextPhase()
		s.mu.Unlock()

		start := s.clock.now()
		completed, more, err := guardStep(j.step)
		end := s.clock.now()
		used := end - start
		resumed := end
		if more && err == nil {
			// Threads of the host queued on this core (the network
			// path, the mediator, tenants) run now rather than after
			// the host's time slice; what they take is nobody's
			// device time (see the package comment).
			s.yield()
			resumed = s.clock.now()
		}

		s.mu.Lock()
		s.last, s.lastEnd = a, resumed
		a.used += used
		a.slices++
		a.launches += uint64(completed)
		a.charge(used)
		// Only the runner that holds the device removes jobs and
		// submitters append, so j is still the head.
		a.jobs = a.jobs[1:]
		finished := !more || err != nil
		switch {
		case !finished && !j.started:
			j.started = true
			s.long++
		case finished && j.started:
			s.long--
		}
		if !finished {
			a.jobs = append(a.jobs, j)
		} else {
			j.done <- err
			if len(a.jobs) == 0 {
				a.ran, a.idleSince = true, s.clock.now()
				a.waiting = j.waiting != nil && j.waiting()
				if a.waiting {
					s.expect, s.expectUntil = a, a.idleSince+anticipation
				}
			}
		}
		s.mu.Unlock()
		if finished {
			// The submitter was readied onto this goroutine's P, where it
			// would wait for the next slice to end: let it reply first.
			runtime.Gosched()
		}
	}
}

// guardStep runs one slice, turning a panic into an error that completes
// the launch in progress: the runner serves every tenant of the device and
// must survive any one launch.
func guardStep(st step) (completed int, more bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			completed, more, err = 1, false, fmt.Errorf("kernel slice panicked: %v: %w", p, api.ErrInternal)
		}
	}()
	return st()
}

// usage reports each tenant's use of the device, which is device dev,
// sorted by tenant.
func (s *scheduler) usage(dev uint32) []api.DeviceTenant {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]api.DeviceTenant, 0, len(s.accounts))
	for _, a := range s.accounts {
		out = append(out, api.DeviceTenant{
			Device: dev, Tenant: a.name, Weight: uint32(math.Round(a.weight)), ComputeMax: a.computeMax,
			DeviceTime: a.used, Slices: a.slices, Launches: a.launches, Throttled: a.throttled,
		})
	}
	slices.SortFunc(out, func(x, y api.DeviceTenant) int { return strings.Compare(x.Tenant, y.Tenant) })
	return out
}
