package coherence

import (
	"fmt"
	"testing"
	"time"
)

// The model checker: an explicit-state breadth-first search of every state
// the coherent protocol can reach in a small world (world_test.go), using
// the real Home and Cache. From each state any enabled action may come
// next: a client read or write on any live cache, delivery of any message
// in flight (so messages are reordered arbitrarily), a commit by the node,
// a clock tick, and, once per run, the crash of a cache, which then
// processes nothing while its messages already sent are still delivered.
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
// ready and letting time pass lead within a lease and a few ticks to a
// state where every write has committed and every live cache's operations
// are answered (world.drain), crash or not.

type path struct {
	parent *path
	a      action
}

// explore searches conf's state space and returns the number of states.
func explore(t *testing.T, conf *wconf) int {
	t.Helper()
	w0, err := newWorld(conf, nil)
	if err != nil {
		t.Fatal(err)
	}
	type item struct {
		w *world
		p *path
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
	seen := map[string]struct{}{w0.key(): {}}
	queue := []item{{w0, nil}}
	rounds := int(conf.lease) + 3
	var as []action
	for len(queue) > 0 {
		it := queue[0]
		queue[0] = item{}
		queue = queue[1:]
		if err := it.w.clone().drain(1, rounds); err != nil {
			fail(it.p, fmt.Errorf("drain: %w", err))
		}
		as = it.w.actions(append(as[:0], action{aTick, 1, 0}))
		for _, a := range as {
			n := it.w.clone()
			p := &path{it.p, a}
			if err := n.do(a); err != nil {
				fail(p, err)
			}
			k := n.key()
			if _, ok := seen[k]; ok {
				continue
			}
			seen[k] = struct{}{}
			if err := n.check(); err != nil {
				fail(p, err)
			}
			queue = append(queue, item{n, p})
		}
	}
	return len(seen)
}

func TestModel(t *testing.T) {
	const lease = 3 // ticks
	for _, conf := range []wconf{
		{caches: 2, pages: 1, writes: 2},
		{caches: 3, pages: 1, writes: 2},
		{caches: 2, pages: 2, writes: 2},
		{caches: 3, pages: 2, writes: 1},
		{caches: 2, pages: 2, writes: 2, capacity: 1},
		{caches: 2, pages: 1, writes: 2, margin: 1},
	} {
		conf.lease, conf.crash, conf.maxReads, conf.maxWrites = lease, true, 1, 1
		if conf.capacity == 0 {
			conf.capacity = 1 << 10
		}
		name := fmt.Sprintf("caches=%d,pages=%d,writes=%d,capacity=%d,margin=%d", conf.caches, conf.pages, conf.writes, conf.capacity, conf.margin)
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			n := explore(t, &conf)
			t.Logf("%d states, lease %d ticks, one crash, in %v", n, lease, time.Since(start).Round(time.Millisecond))
		})
	}
}
