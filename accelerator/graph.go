package accelerator

// Node graphs: a graph's launches, registered once by a connection
// (OpNodeGraphRegister), then run with an invocation's scalars
// (OpNodeGraphRun) as one run of launches on the device's scheduler
// (launch.go), each slice with its launch's phase (sched.go), until
// OpNodeGraphFree or the connection's end (docs/graphs.md).
//
// Registration checks every launch as a NodeLaunch is checked (kernel,
// argument kinds, device, every buffer's frames) and what only graphs
// have: a valid phase, scalar references only in i64 arguments and below
// api.MaxGraphScalars. A connection keeps at most graphLimits of graphs,
// their launches and their extents.
//
// A run goes in three steps, and writes nothing before the third:
//  1. Bind: every scalar-dependent argument gets its value, Mul ×
//     scalars[Scalar] + Add, refused where it overflows; the run must give
//     exactly the scalars the graph's references need.
//  2. Check: every buffer again against the frame table, as at
//     registration, then trimmed to what its kernel touches given the
//     run's values (trimBuffers). Frames are not pinned by a graph: the
//     mediator promises not to free what a registered graph uses, but the
//     node does not rely on it, and the ownership check at each run costs
//     a frame-table look-up per extent. A frame freed (or sealed, or
//     shared) since registration fails the run naming the launch; a frame
//     freed and handed to another connection is never touched. These
//     checks look at nothing but the bound values and the frame table, so
//     a launch whose values are those of the last run that got through
//     step 3's plans keeps that run's checked arguments while the table's
//     generation (frameTable.gen, changed by every alloc, free, seal,
//     unseal, share and unshare on the device, any connection's) is the
//     one that run read before its checks.
//  3. Plan every launch (kernels.Plan checks everything and writes
//     nothing), then run the launches in order; a failure is the first
//     failing launch's, as an *api.BatchError of op api.OpNodeLaunch whose
//     Index is the launch's. A launch kept from the last run as in step 2
//     is not planned here where the plan would only be a check (an after
//     or gathered one, below) and it reads no indices: with the same
//     arguments in the same frames, and no contents looked at, its plan
//     passes again.
//
// A plan made up front sees the bytes as they are before the run, which
// matters where a kernel checks contents: the indices of the embedding
// kernels, which are the buffers a kernel reads whose element type is
// api.DTypeI32 (kernels check no f32 contents: they define what NaNs and
// infinities give). So each launch is classified at registration by what
// the launches before it in the graph may write (writtenBefore, on the
// registered extents, which cover whatever a run trims them to):
//   - A launch that reads nothing an earlier launch writes is planned up
//     front conclusively, and that plan is the one run, unless a buffer of
//     it lies in several runs of memory, which its plan holds a copy of:
//     rather than hold every such launch's copies at once, it is prepared
//     again at its turn, from the same bytes, so it cannot fail then.
//   - A launch that reads f32 data an earlier launch writes is planned up
//     front too, which is conclusive as its checks do not look at f32
//     contents, and prepared again at its turn, to see that data.
//   - A launch that reads indices an earlier launch of the same graph
//     writes (an argmax feeding an embedding within one graph) is not
//     planned up front: stale indices would prove nothing either way. Its
//     sizes are checked up front (step 2), its plan at its turn, and if
//     that fails, the launches before it have written what they wrote. Graphs that take their indices from
//     inputs or from an earlier run (a decode step's token) have no such
//     launch, and a run of theirs that fails writes nothing.
//
// Invariants: a connection's graphs are used only by whichever goroutine
// executes its requests (one at a time, node.go), so they need no lock;
// a graph's launches, arguments and extents never change once registered
// (a run binds and trims copies); nodeGraph.checked holds what the last
// run that planned the whole graph checked, valid only with gen and ok.

import (
	"fmt"
	"math"
	"slices"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// Bounds on what one connection's graphs may hold, so that a mediator's
// registrations cost the node bounded memory: 16 bytes and more per extent,
// about 100 per launch.
const (
	MaxNodeGraphs        = 256
	MaxNodeGraphLaunches = 1 << 16
	MaxNodeGraphExtents  = 1 << 20
)

// graphLimits bounds one connection's graphs: the graphs, their launches
// in all and their buffers' extents in all.
type graphLimits struct{ graphs, launches, extents int }

// connGraphs is a connection's graphs.
type connGraphs struct {
	byID              map[uint32]*nodeGraph
	last              uint32 // the id given last
	launches, extents int    // over byID
}

// nodeGraph is a registered graph.
type nodeGraph struct {
	d        *device
	launches []graphLaunch
	phases   []api.Phase // by launch
	scalars  int         // a run's scalars: 1 + the highest index referenced, or 0
	extents  int
	// checked is, by launch, its arguments bound, checked and trimmed by
	// the last run that planned the whole graph (ok), when d's frame
	// table's generation was gen; the run after reuses those whose values
	// are its own while the generation is still gen.
	checked []checkedLaunch
	gen     uint64
	ok      bool
	// Scratch of a run, by launch: whether its check was reused, and the
	// plans made before the run.
	reused []bool
	plans  []*kernels.Plan
	// rechecks counts the launches checked in full, over all runs.
	rechecks int
}

// graphLaunch is one launch of a graph, checked at registration.
type graphLaunch struct {
	k     *kernels.Kernel
	phase api.Phase
	args  []api.NodeGraphArg
	// after: it reads bytes an earlier launch of the graph may write, so
	// a plan made before the run is not the one run.
	after bool
	// late: some of those bytes are indices, which its plan checks, so it
	// is not planned before the run at all.
	late bool
	// gathered: a buffer of it lies in several runs of memory.
	gathered bool
	// indices: it reads an i32 buffer, whose contents its plan checks.
	indices bool
}

// graphOp executes a graph request; false if r is none.
func (c *conn) graphOp(r request) (ok bool, err error) {
	switch r.h.Op {
	case api.OpNodeGraphRegister:
		var m api.NodeGraph
		if err := decode(r.h.Op, r.body, &m); err != nil {
			return true, err
		}
		id, err := c.registerGraph(&m)
		if err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h, api.Encode(&api.Graph{Graph: id}))
	case api.OpNodeGraphRun:
		var m api.NodeGraphRun
		if err := decode(r.h.Op, r.body, &m); err != nil {
			return true, err
		}
		if err := c.runGraph(&m); err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h)
	case api.OpNodeGraphFree:
		var m api.Graph
		if err := decode(r.h.Op, r.body, &m); err != nil {
			return true, err
		}
		if err := c.freeGraph(m.Graph); err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h)
	}
	return false, nil
}

// launchError is the failure of launch i of a graph.
func launchError(i int, err error) error {
	return &api.BatchError{Index: i, Op: api.OpNodeLaunch, Err: err}
}

// registerGraph checks m and keeps it for c, returning its id.
func (c *conn) registerGraph(m *api.NodeGraph) (uint32, error) {
	gs, lim := &c.graphs, c.node.graphLimits
	extents := 0
	for _, l := range m.Launches {
		for _, a := range l.Args {
			extents += len(a.Extents)
		}
	}
	switch {
	case len(gs.byID) >= lim.graphs:
		return 0, fmt.Errorf("register graph: this connection has %d graphs, the limit: %w", len(gs.byID), api.ErrQuotaExceeded)
	case len(m.Launches) > lim.launches-gs.launches:
		return 0, fmt.Errorf("register graph of %d launches: this connection's graphs have %d, and at most %d: %w",
			len(m.Launches), gs.launches, lim.launches, api.ErrQuotaExceeded)
	case extents > lim.extents-gs.extents:
		return 0, fmt.Errorf("register graph of %d extents: this connection's graphs have %d, and at most %d: %w",
			extents, gs.extents, lim.extents, api.ErrQuotaExceeded)
	}
	d, err := c.device(m.Device)
	if err != nil {
		return 0, err
	}
	n := len(m.Launches)
	g := &nodeGraph{d: d, launches: make([]graphLaunch, n), phases: make([]api.Phase, n), extents: extents,
		checked: make([]checkedLaunch, n), reused: make([]bool, n), plans: make([]*kernels.Plan, n)}
	for i, l := range m.Launches {
		gl, need, err := c.checkGraphLaunch(d, l)
		if err != nil {
			return 0, launchError(i, err)
		}
		g.launches[i], g.phases[i] = gl, gl.phase
		g.scalars = max(g.scalars, need)
	}
	g.classify()
	if gs.byID == nil {
		gs.byID = map[uint32]*nodeGraph{}
	}
	for gs.last++; gs.last == 0 || gs.byID[gs.last] != nil; gs.last++ {
	}
	gs.byID[gs.last] = g
	gs.launches += len(g.launches)
	gs.extents += g.extents
	return gs.last, nil
}

// checkGraphLaunch checks launch l of a graph on d for c and returns it,
// with the count of scalars its references need.
func (c *conn) checkGraphLaunch(d *device, l api.NodeGraphLaunch) (graphLaunch, int, error) {
	k, err := kernels.Lookup(l.Kernel)
	if err != nil {
		return graphLaunch{}, 0, err
	}
	if !l.Phase.Valid() {
		return graphLaunch{}, 0, fmt.Errorf("%s: %v is no phase: %w", l.Kernel, l.Phase, api.ErrInvalidArgument)
	}
	kinds := make([]api.ArgKind, len(l.Args))
	args := make([]api.NodeArg, len(l.Args))
	for i, a := range l.Args {
		kinds[i], args[i] = a.Kind, a.NodeArg
	}
	if err := k.CheckKinds(kinds); err != nil {
		return graphLaunch{}, 0, err
	}
	need := 0
	gathered, indices := false, false
	for i, a := range l.Args {
		p := k.Info.Params[i]
		gathered = gathered || len(a.Extents) > 1
		indices = indices || a.Kind == api.ArgBuffer && p.DType == api.DTypeI32 && (p.Access == api.AccessRead || p.Access == api.AccessReadWrite)
		if a.Scalar < 0 {
			continue
		}
		if a.Kind != api.ArgI64 {
			return graphLaunch{}, 0, fmt.Errorf("%s: argument %d (%s) is %v and cannot come from scalar %d: only i64 arguments can: %w",
				l.Kernel, i, p.Name, a.Kind, a.Scalar, api.ErrInvalidArgument)
		}
		if a.Scalar >= api.MaxGraphScalars {
			return graphLaunch{}, 0, fmt.Errorf("%s: argument %d (%s) comes from scalar %d; a graph has at most %d: %w",
				l.Kernel, i, p.Name, a.Scalar, api.MaxGraphScalars, api.ErrInvalidArgument)
		}
		need = max(need, int(a.Scalar)+1)
	}
	if err := c.checkBuffers(d, k, args); err != nil {
		return graphLaunch{}, 0, err
	}
	return graphLaunch{k: k, phase: l.Phase, args: l.Args, gathered: gathered, indices: indices}, need, nil
}

// classify marks the launches of g that read bytes an earlier launch
// writes (graphLaunch.after, .late).
func (g *nodeGraph) classify() {
	var writes, reads []byteRange
	var readBy [][2]int // launch and argument of each of reads
	for i, l := range g.launches {
		for j, a := range l.args {
			if a.Kind != api.ArgBuffer {
				continue
			}
			access := l.k.Info.Params[j].Access
			for _, x := range a.Extents {
				if x.Len == 0 {
					continue
				}
				r := byteRange{x.Addr, x.Addr + x.Len, i}
				if access >= api.AccessWrite {
					writes = append(writes, r)
				}
				if access == api.AccessRead || access == api.AccessReadWrite {
					reads = append(reads, r)
					readBy = append(readBy, [2]int{i, j})
				}
			}
		}
	}
	for r, written := range writtenBefore(writes, reads) {
		if !written {
			continue
		}
		l := &g.launches[readBy[r][0]]
		l.after = true
		l.late = l.late || l.k.Info.Params[readBy[r][1]].DType == api.DTypeI32
	}
}

// freeGraph forgets c's graph id.
func (c *conn) freeGraph(id uint32) error {
	gs := &c.graphs
	g := gs.byID[id]
	if g == nil {
		return fmt.Errorf("graph %d: not registered on this connection (%d are): %w", id, len(gs.byID), api.ErrInvalidArgument)
	}
	delete(gs.byID, id)
	gs.launches -= len(g.launches)
	gs.extents -= g.extents
	return nil
}

// runGraph runs c's graph m.Graph with m.Scalars (see the file comment).
func (c *conn) runGraph(m *api.NodeGraphRun) error {
	g := c.graphs.byID[m.Graph]
	if g == nil {
		return fmt.Errorf("run graph %d: not registered on this connection: %w", m.Graph, api.ErrInvalidArgument)
	}
	if len(m.Scalars) != g.scalars {
		return fmt.Errorf("run graph %d: it takes %d scalars, the run gives %d: %w", m.Graph, g.scalars, len(m.Scalars), api.ErrInvalidArgument)
	}
	d := g.d
	start := d.sched.clock.now()
	err := c.planGraph(g, m.Scalars)
	t := c.share
	t.aside = d.sched.clock.now() - start // device work of the run's, as a launch's preparation
	if err != nil {
		d.chargeAside(t)
		return err
	}
	errs := d.runLaunches(t, &launchRun{d: d, ls: g.checked, plans: g.plans, phases: g.phases, stop: true})
	clear(g.plans) // those of launches a failure left unrun
	for i, err := range errs {
		if err != nil {
			return launchError(i, err)
		}
	}
	return nil
}

// planGraph binds and checks every launch of g with scalars into
// g.checked and plans into g.plans those it may plan before the run (see
// the file comment), writing nothing; a nil plan is prepared at its turn.
//
// What the last run that got this far checked is not checked again while
// the frame table has not changed since (its generation is the same), for
// every launch whose bound values are the same: the checks look at nothing
// else. Nor is such a launch planned before the run if that plan is only a
// check (an after or gathered launch: it is prepared again at its turn
// anyway) and it reads no indices, whose contents a run's inputs may have
// changed: given its arguments and the frames they lie in, a plan that
// passed passes again.
func (c *conn) planGraph(g *nodeGraph, scalars []int64) error {
	d := g.d
	gen := d.frames.gen.Load() // before any check: a change after it is seen by the next run
	valid := g.ok && g.gen == gen
	g.ok = false // until every launch is checked and planned again
	for i := range g.launches {
		l := &g.launches[i]
		g.reused[i] = valid && l.bound(g.checked[i].args, scalars)
		if g.reused[i] {
			continue
		}
		g.rechecks++
		args, err := l.bind(scalars)
		if err == nil {
			err = c.checkBuffers(d, l.k, args)
		}
		if err == nil {
			if err = c.trimBuffers(d, l.k, args); err != nil {
				err = fmt.Errorf("%s: %s: %w", d.Info().Name, l.k.Info.Name, err)
			}
		}
		if err != nil {
			return launchError(i, err)
		}
		g.checked[i] = checkedLaunch{k: l.k, args: args}
	}
	// With every launch checked, aliased frames to be written get memory
	// of their own (which changes no byte), before any plan takes a view
	// of them. A dedup may alias a frame between two runs without changing
	// the frame table, so this is done at every run.
	for i, l := range g.checked {
		if err := c.ownWritten(d, l.k, l.args); err != nil {
			return launchError(i, err)
		}
	}
	for i, l := range g.checked {
		gl := &g.launches[i]
		g.plans[i] = nil
		if gl.late || g.reused[i] && (gl.after || gl.gathered) && !gl.indices {
			continue
		}
		p, finish, err := d.prepare(l)
		if err != nil {
			clear(g.plans)
			return launchError(i, fmt.Errorf("%s: %w", d.Info().Name, err))
		}
		if !gl.after && !gl.gathered && finish == nil {
			g.plans[i] = p
		}
	}
	g.gen, g.ok = gen, true
	return nil
}

// bound says whether args, l's arguments bound and trimmed for a run,
// have the values scalars give them.
func (l *graphLaunch) bound(args []api.NodeArg, scalars []int64) bool {
	for i, a := range l.args {
		if a.Scalar < 0 {
			continue
		}
		v, ok := api.ScalarValue(a.Mul, scalars[a.Scalar], a.Add)
		if !ok || uint64(v) != args[i].Bits {
			return false
		}
	}
	return true
}

// bind returns l's arguments with the values scalars give them: copies,
// the buffers' extents shared with l.
func (l *graphLaunch) bind(scalars []int64) ([]api.NodeArg, error) {
	args := make([]api.NodeArg, len(l.args))
	for i, a := range l.args {
		args[i] = a.NodeArg
		if a.Scalar < 0 {
			continue
		}
		s := scalars[a.Scalar]
		v, ok := api.ScalarValue(a.Mul, s, a.Add)
		if !ok {
			return nil, fmt.Errorf("%s: argument %d (%s) = %d × scalar %d (%d) + %d overflows int64: %w",
				l.k.Info.Name, i, l.k.Info.Params[i].Name, a.Mul, a.Scalar, s, a.Add, api.ErrInvalidArgument)
		}
		args[i].Bits = uint64(v)
	}
	return args, nil
}

// byteRange is the bytes [lo, hi) of device memory a launch touches.
type byteRange struct {
	lo, hi uint64
	launch int
}

// writtenBefore says, for each of reads, whether one of writes, of a
// launch before the read's, overlaps it, in O((w + r) log(w + r)): a
// segment tree over the elementary ranges between the ranges' ends holds,
// for each, the first launch that writes it.
func writtenBefore(writes, reads []byteRange) []bool {
	out := make([]bool, len(reads))
	if len(writes) == 0 || len(reads) == 0 {
		return out
	}
	ends := make([]uint64, 0, 2*(len(writes)+len(reads)))
	for _, rs := range [][]byteRange{writes, reads} {
		for _, r := range rs {
			ends = append(ends, r.lo, r.hi)
		}
	}
	slices.Sort(ends)
	ends = slices.Compact(ends)
	// Leaf n+k is [ends[k], ends[k+1]); node p < n covers its children
	// 2p and 2p+1. A range's nodes are found bottom-up (cover).
	n := len(ends) - 1
	first := make([]int, 2*n)
	for i := range first {
		first[i] = math.MaxInt
	}
	leaf := func(v uint64) int {
		k, _ := slices.BinarySearch(ends, v)
		return n + k
	}
	cover := func(r byteRange, visit func(node int)) {
		for lo, hi := leaf(r.lo), leaf(r.hi); lo < hi; lo, hi = lo/2, hi/2 {
			if lo&1 == 1 {
				visit(lo)
				lo++
			}
			if hi&1 == 1 {
				hi--
				visit(hi)
			}
		}
	}
	for _, w := range writes {
		cover(w, func(p int) { first[p] = min(first[p], w.launch) })
	}
	// Each node's mark holds for every leaf below it: push the marks down
	// to the leaves, then take each node's least leaf back up.
	for p := 1; p < n; p++ {
		first[2*p] = min(first[2*p], first[p])
		first[2*p+1] = min(first[2*p+1], first[p])
	}
	for p := n - 1; p >= 1; p-- {
		first[p] = min(first[2*p], first[2*p+1])
	}
	for i, r := range reads {
		cover(r, func(p int) { out[i] = out[i] || first[p] < r.launch })
	}
	return out
}
