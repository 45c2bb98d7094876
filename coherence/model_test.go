package coherence

import (
	"flag"
	"fmt"
	"testing"
	"time"
)

var fullModel = flag.Bool("coherence.full", false, "also explore the larger model configurations (minutes)")

// The model checker: an explicit-state breadth-first search of every state
// the coherent protocol can reach in a small world (world_test.go), using
// the real Home and Cache. From each state any enabled action may come
// next: a client read or write on any live cache, delivery of any message
// in flight (so messages are reordered arbitrarily), a commit by the node,
// a clock tick, once per run the crash of a cache, which then processes
// nothing while its messages already sent are still delivered, and in one
// configuration a Drop of the object by a cache.
// In every reachable state it asserts the invariants (world.check):
//
//   - single writer, multiple readers: one write in progress per page, and
//     no reader registered while one waits;
//   - every copy a cache holds whose lease has not expired has the page's
//     latest committed version and data, so no read, local or remote,
//     returns data older than an acknowledged write;
//   - no acknowledged write is lost: each is in its page's data, at the
//     version its acknowledgement carried;
//
// and that from the state, delivering every message, committing what is
// ready and letting time pass lead within a lease to a state where every
// write has committed and every live cache's operations are answered,
// crash or not.

type path struct {
	parent *path
	a      action
}

// drainAction is the next step of a drain from w (as in world.drain):
// deliver a message (the one of least encoding, so that the choice hardly
// depends on the order of w.msgs), else commit the lowest ready page, else
// let a tick pass.
func drainAction(w *world) action {
	if len(w.msgs) > 0 {
		best, bestKey := 0, ""
		k := &keyer{now: w.now, oldest: w.conf.margin - w.conf.lease, rank: make([]int, len(w.caches))}
		for i, m := range w.msgs {
			if mk := k.msg(m, false); i == 0 || mk < bestKey {
				best, bestKey = i, mk
			}
		}
		return action{aDeliver, best, 0}
	}
	for p := range w.conf.pages {
		if !w.conf.eager && w.canCommit(uint32(p)) {
			return action{aCommit, p, 0}
		}
	}
	return action{aTick, 1, 0}
}

// coverage says which interesting cases a search reached.
type coverage struct {
	states, maxTicks, maxMsgs int
	expired                   bool // a write stopped waiting for an expired lease
	uncached                  bool // a reply was not cached
	evicted                   bool // a cache evicted a copy
}

// explore searches conf's state space.
//
// Rather than draining a copy of every state, it records each state's
// drain successor (which it reaches anyway, as drain actions are actions)
// and, once the search is over, follows those edges: a cycle through a
// state that is not quiet would be a write stuck forever.
func explore(t *testing.T, conf *wconf) (cov coverage) {
	t.Helper()
	w0, err := newWorld(conf, nil)
	if err != nil {
		t.Fatal(err)
	}
	fail := func(p *path, err error) {
		t.Helper()
		var as []action
		for ; p != nil; p = p.parent {
			as = append([]action{p.a}, as...)
		}
		w, _ := newWorld(conf, nil)
		w.trace = []string{}
		for _, a := range as {
			if w.do(a) != nil {
				break
			}
		}
		t.Fatalf("%v\nafter %d steps:\n%s", err, len(as), w.traceString())
	}
	type item struct {
		w  *world
		id int32
		p  *path
	}
	ids := map[string]int32{w0.key(): 0}
	paths := []*path{nil}
	var succ []int32 // drain successor by id
	var quiet, tick []bool
	queue := []item{{w0, 0, nil}}
	var as []action
	for len(queue) > 0 {
		it := queue[0]
		queue[0] = item{}
		queue = queue[1:]
		drain := drainAction(it.w)
		succ = append(succ, -1)
		quiet = append(quiet, it.w.quiet())
		tick = append(tick, drain.kind == aTick)
		as = it.w.actions(append(as[:0], action{aTick, 1, 0}))
		for _, a := range as {
			n := it.w.clone()
			p := &path{it.p, a}
			if err := n.do(a); err != nil {
				fail(p, err)
			}
			k := n.key()
			id, ok := ids[k]
			if !ok {
				if err := n.check(); err != nil {
					fail(p, err)
				}
				cov.note(n)
				id = int32(len(ids))
				ids[k] = id
				paths = append(paths, p)
				queue = append(queue, item{n, id, p})
			}
			if a == drain {
				succ[it.id] = id
			}
		}
	}
	// ticks[id]: ticks to quiet along drain edges; -1 not yet known, -2 on
	// the path being followed.
	ticks := make([]int, len(succ))
	for i := range ticks {
		ticks[i] = -1
	}
	var stack []int32
	for start := range succ {
		for id := int32(start); ticks[id] == -1; id = succ[id] {
			if quiet[id] {
				ticks[id] = 0
				break
			}
			ticks[id] = -2
			stack = append(stack, id)
		}
		if top := stack; len(top) > 0 && ticks[succ[top[len(top)-1]]] == -2 {
			fail(paths[top[len(top)-1]], fmt.Errorf("stuck: drain actions loop without quiet"))
		}
		for len(stack) > 0 {
			id := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			ticks[id] = ticks[succ[id]]
			if tick[id] {
				ticks[id]++
			}
			cov.maxTicks = max(cov.maxTicks, ticks[id])
		}
	}
	cov.states = len(ids)
	return cov
}

func (cov *coverage) note(w *world) {
	cov.maxMsgs = max(cov.maxMsgs, len(w.msgs))
	cov.expired = cov.expired || w.home.Stats().Expired > 0
	for _, c := range w.caches {
		st := c.Stats()
		cov.uncached = cov.uncached || st.Uncached > 0
		cov.evicted = cov.evicted || st.Evictions > 0
	}
}

// TestModel explores small configurations, each with a lease of 2 ticks,
// reads of every cache and page in flight one at a time, one write in
// flight per cache, a budget of client writes in all, and one crash; one
// also lets a cache Drop the object once, as a mediator does when another
// of its tenants is revoked, with reads and writes in flight. Some
// give caches roles (only read, only write) or limit a cache to one read
// in flight to keep the state space small; -short keeps the first two,
// -coherence.full adds larger ones without those limits.
func TestModel(t *testing.T) {
	const lease = 2 // ticks
	confs := []wconf{
		{caches: 2, pages: 1, writes: 1},
		{caches: 2, pages: 1, writes: 1, eager: true, margin: 1},
		{caches: 2, pages: 1, writes: 2, eager: true, writeOnly: 1},
		{caches: 2, pages: 1, writes: 2, eager: true, readOnly: 1},
		{caches: 3, pages: 1, writes: 1, eager: true, readOnly: 2, writeOnly: 1},
		{caches: 2, pages: 2, writes: 1, eager: true, writeOnly: 1, maxCacheReads: 1},
		{caches: 2, pages: 2, writes: 1, eager: true, writeOnly: 1, maxCacheReads: 1, capacity: 2},
		{caches: 2, pages: 1, writes: 1, drops: 1},
	}
	if testing.Short() {
		confs = confs[:2]
	}
	if *fullModel {
		confs = append(confs,
			wconf{caches: 2, pages: 1, writes: 2, eager: true},
			wconf{caches: 3, pages: 1, writes: 1, eager: true, readOnly: 2},
			wconf{caches: 2, pages: 2, writes: 1, eager: true, maxCacheReads: 1},
			wconf{caches: 2, pages: 2, writes: 2, eager: true, writeOnly: 1, maxCacheReads: 1, capacity: 3},
		)
	}
	for _, conf := range confs {
		conf.lease, conf.crash, conf.maxReads, conf.maxWrites = lease, true, 1, 1
		if conf.capacity == 0 {
			conf.capacity = 1 << 10
		}
		name := fmt.Sprintf("caches=%d,pages=%d,writes=%d", conf.caches, conf.pages, conf.writes)
		if conf.readOnly+conf.writeOnly > 0 {
			name += fmt.Sprintf(",readonly=%d,writeonly=%d", conf.readOnly, conf.writeOnly)
		}
		if conf.maxCacheReads > 0 {
			name += fmt.Sprintf(",cachereads=%d", conf.maxCacheReads)
		}
		if conf.capacity < 1<<10 {
			name += fmt.Sprintf(",capacity=%d", conf.capacity)
		}
		if conf.margin > 0 {
			name += fmt.Sprintf(",margin=%d", conf.margin)
		}
		if !conf.eager {
			name += ",delayedcommit"
		}
		if conf.drops > 0 {
			name += fmt.Sprintf(",drops=%d", conf.drops)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			cov := explore(t, &conf)
			t.Logf("%d states in %v; up to %d messages in flight; quiet within %d ticks from any state; lease expiry seen %v, uncached replies %v, evictions %v",
				cov.states, time.Since(start).Round(time.Millisecond), cov.maxMsgs, cov.maxTicks, cov.expired, cov.uncached, cov.evicted)
			if cov.maxTicks > lease {
				t.Errorf("a state needs %d ticks to become quiet, more than a lease", cov.maxTicks)
			}
			if !cov.expired || !cov.uncached || conf.capacity < 1<<10 && !cov.evicted {
				t.Errorf("the search missed cases it should reach: %+v", cov)
			}
		})
	}
}
