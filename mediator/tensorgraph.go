package mediator

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// Tensor graphs (docs/graphs.md): a model's work that a tenant registers
// once (api.OpGraphRegister) and invokes with its inputs in one round trip
// (api.OpGraphInvoke). Registration checks the graph whole
// (api.CheckGraph), resolves its bound tensors (weights, KV caches) to
// allocations of the session, lays its other tensors out in one arena
// allocation, translates every tensor to the physical runs that back it and
// registers the launches with the node of the graph's device as a
// NodeGraph, which keeps them. An invocation then writes the inputs, runs
// the node graph with its scalars and reads the outputs, all pipelined on
// the session's connection to that node.
//
// These are not the captured command sequences of graph.go, which are
// translated afresh at every replay.
//
// Invariants:
//   - A node graph's extents stay valid while it is registered. That needs
//     memory that does not move, so sessions that oversubscribe (and may
//     evict) cannot register graphs; and the allocations a graph binds,
//     and its arena, cannot be freed while it lives (freeShared refuses,
//     naming the graph), nor sealed or exported if the graph writes them.
//     Releasing the graph, or the session's end, lifts that.
//   - A registered graph was checked whole; an invocation checks its
//     scalars' values and its inputs' length before anything is sent, and
//     the node plans every launch before it runs the first, so a refused
//     or failed invocation leaves the KV caches as they were.
//   - A registered graph's request, id and arena are in the session's
//     journal, written after its arena's allocation and before its id is
//     answered; its release is written before its arena's free. So a
//     restore that replays the journal in order rebuilds every graph the
//     tenant was told of over the allocations it binds (resume.go).
//   - Only the session's reader registers, invokes and releases graphs and
//     frees memory, and teardown runs on it after the reader loop, so
//     session.tgraphs needs no lock. An invocation drains the session's
//     streams first, so work queued before it (a weight's upload, say) is
//     done, and it answers before the reader reads the next request.

// Bounds on what a session's tensor graphs hold in the mediator (each op
// keeps its definition and the node keeps its launches).
const (
	MaxTensorGraphs   = 64
	MaxTensorGraphOps = 1 << 14
)

// arenaAlign aligns each tensor in a graph's arena, as a GPU allocator
// aligns buffers, so vectorised kernels may assume it.
const arenaAlign = 256

// tensorGraph is a registered tensor graph.
type tensorGraph struct {
	id    uint32
	def   *api.GraphDef
	dev   uint32 // the session's virtual device
	node  uint32 // the node graph's id on that device's connection
	arena uint64 // the arena allocation's address; 0 if the graph has none
	epoch uint64 // connections the session had installed at its registration (graphGone, noderestart.go)
	// bound are the starts of the allocations that hold the graph's
	// bound tensors, with the first tensor in each (a weight's allocation
	// is sealed, a KV cache's is not, so no allocation holds both).
	bound map[uint64]int
	// inputs and outputs are the graph's input and output tensors in
	// tensor order, with their sizes and where they are.
	inputs, outputs []placed
	inBytes         uint64
	outBytes        uint64
	scalarUses      []scalarUse
	// nodeScalars is how many of an invocation's scalars the node graph
	// takes: 1 + the highest index its arguments use, or 0.
	nodeScalars int
	// restored is the node graph of a graph a restore rebuilt, until it
	// is registered with the node (registerRestored); nil otherwise.
	restored *api.NodeGraph
	// launches is the node graph as registered, kept to register it again
	// on a node connection that dropped and was reclaimed, whose node
	// forgot it (reregisterGraphs, noderestart.go).
	launches *api.NodeGraph
}

// placed is a tensor's index, size and the physical runs that back it.
type placed struct {
	tensor int
	bytes  uint64
	xs     []api.Extent
}

// scalarUse is an argument an invocation's scalars give: Mul × scalars[Scalar] + Add.
type scalarUse struct {
	op, param int
	arg       api.OpArg
}

func (g *tensorGraph) String() string { return fmt.Sprintf("tensor graph %d %q", g.id, g.def.Name) }

// registerGraph registers a GraphDef and returns the graph's id. Its
// record — the request, the id, the arena — goes to the session's journal,
// after the arena's allocation, so that a restore registers it again
// (restoreTensorGraph).
func (s *session) registerGraph(body []byte) (uint32, error) {
	g, err := s.buildTensorGraph(body, nil)
	if err != nil {
		return 0, err
	}
	s.tgraphs.add(g)
	s.jr.add(journalOp{Op: opTGraph, Graph: g.id, Body: body, VA: g.arena})
	return g.id, nil
}

// restoreTensorGraph rebuilds, for a session being restored, the tensor
// graph its journal record op names, under the same id and with the same
// arena, which the journal's records before it allocated. Its node graph
// is a new one, since a node forgets a connection's graphs when the
// connection drops (accelerator/reattach.go); it is registered once the
// whole journal is replayed (registerRestored), when the graph is known to
// live: a graph the journal releases later may have had frames the node
// has freed since.
func (s *session) restoreTensorGraph(op journalOp) error {
	if op.Graph == 0 || s.tgraphs.byID[op.Graph] != nil {
		return fmt.Errorf("tensor graph %d: no id, or a live graph's: %w", op.Graph, api.ErrInternal)
	}
	g, err := s.buildTensorGraph(op.Body, &op.VA)
	if err != nil {
		return err
	}
	g.id = op.Graph
	s.tgraphs.addAs(g)
	return nil
}

// buildTensorGraph checks the GraphDef in body, lays it out and registers
// its launches with its node. Its arena is allocated, unless arena is not
// nil: then it is the allocation at *arena (0: none) of a graph being
// restored, which must be the size the layout asks, and its launches are
// kept in g.restored for registerRestored.
func (s *session) buildTensorGraph(body []byte, arena *uint64) (*tensorGraph, error) {
	var def api.GraphDef
	if err := api.Decode(body, &def); err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	if s.evicts {
		return nil, fmt.Errorf("graph %q: this session oversubscribes its memory, which may then move, and a graph's launches keep where its tensors are: register graphs in a session without oversubscription: %w",
			def.Name, api.ErrInvalidArgument)
	}
	if err := s.tgraphs.room(def.Name, len(def.Ops)); err != nil {
		return nil, err
	}
	checked, err := api.CheckGraph(&def, s.m.catalog)
	if err != nil {
		return nil, fmt.Errorf("graph %q: %w", def.Name, err)
	}
	g := &tensorGraph{def: &def, bound: map[uint64]int{}, epoch: s.nodes.installs}
	if err := s.bindTensors(g, checked); err != nil {
		return nil, fmt.Errorf("graph %q: %w", def.Name, err)
	}
	if err := g.checkIO(checked); err != nil {
		return nil, err
	}
	largest, err := s.largestInArena(g, checked)
	if err != nil {
		return nil, err
	}
	// The arena is charged to the session's budget like any allocation.
	offsets, size := layArena(&def, checked)
	switch {
	case arena != nil:
		if err := s.checkRestoredArena(*arena, size); err != nil {
			return nil, fmt.Errorf("graph %q: %w", def.Name, err)
		}
		g.arena = *arena
	case size > 0:
		if g.arena, err = s.alloc(g.dev, size, api.HintActivation); err != nil {
			return nil, fmt.Errorf("graph %q: arena of %d bytes for its inputs, outputs and activations (the largest, %s, takes %d): %w",
				def.Name, size, def.TensorName(largest), checked.Bytes[largest], err)
		}
	}
	ng, err := s.translateGraph(g, checked, offsets)
	g.launches = ng
	switch {
	case err == nil && arena != nil:
		g.restored = ng
	case err == nil:
		g.node, err = s.registerNodeGraph(g, ng)
	}
	if err != nil {
		// A restored graph's arena is the journal's, and a session whose
		// graph fails to restore is not restored at all.
		if g.arena != 0 && arena == nil {
			if ferr := s.free(g.arena); ferr != nil {
				err = errors.Join(err, fmt.Errorf("free its arena: %w", ferr))
			}
		}
		return nil, fmt.Errorf("graph %q: %w", def.Name, err)
	}
	return g, nil
}

// registerRestored registers with their nodes the launches of the tensor
// graphs a restore rebuilt, once the replayed space is reconciled with
// the frames the nodes kept.
func (s *session) registerRestored() error {
	for _, g := range s.tgraphs.byID {
		if g.restored == nil {
			continue
		}
		node, err := s.registerNodeGraph(g, g.restored)
		if err != nil {
			return fmt.Errorf("%v: %w", g, err)
		}
		g.node, g.restored = node, nil
	}
	return nil
}

// checkRestoredArena checks that the allocation at va, the arena the
// journal gives a graph being restored, is a whole allocation of size
// bytes on no other graph (va 0: the graph has no arena, size 0).
func (s *session) checkRestoredArena(va, size uint64) error {
	if va == 0 && size == 0 {
		return nil
	}
	a, err := s.space.AllocationAt(va)
	if err != nil || a.VA != va || a.End-a.VA != size || s.arenaOf(va) != nil {
		return fmt.Errorf("the journal's arena at %#x is not a %d-byte allocation of its own (%v): %w", va, size, err, api.ErrInternal)
	}
	return nil
}

// bindTensors resolves g's bound tensors to the session's allocations: the
// bytes of each lie within one live allocation (anywhere in it, so that a
// model's weights may share one: models.Upload), a weight's is sealed
// (sealing is what makes sharing a weight safe), a KV cache's is not
// exported (the node refuses kernels' writes to exported buffers), and all
// are on one device, which becomes the graph's (device 0 if none is
// bound). g.bound keys each allocation by its start, the address that
// free, seal and export take, so that they are refused while g lives.
func (s *session) bindTensors(g *tensorGraph, c *api.CheckedGraph) error {
	devSet := false
	for i, t := range g.def.Tensors {
		if !t.Residency.Bound() {
			continue
		}
		name := g.def.TensorName(i)
		a, err := s.space.AllocationAt(t.Addr)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if owner := s.arenaOf(a.VA); owner != nil {
			// An arena is its graph's own: releasing that graph frees it,
			// whoever else would still bind it.
			return fmt.Errorf("%s at %#x: the allocation at %#x is the arena of %v, which no other graph may bind: %w",
				name, t.Addr, a.VA, owner, api.ErrInvalidArgument)
		}
		switch {
		case c.Bytes[i] > a.End-t.Addr:
			return s.pastAllocation(name, t.Addr, c.Bytes[i], a)
		case t.Residency == api.ResWeight && !a.Sealed:
			return fmt.Errorf("%s at %#x: the weight's allocation at %#x is not sealed: seal weights once uploaded, which makes them read-only and shareable: %w",
				name, t.Addr, a.VA, api.ErrInvalidArgument)
		case devSet && a.Dev != g.dev:
			return fmt.Errorf("%s at %#x: the allocation at %#x is on device %d, the graph's earlier bound tensors on device %d: a graph runs on one device: %w",
				name, t.Addr, a.VA, a.Dev, g.dev, api.ErrInvalidArgument)
		}
		if t.Residency == api.ResKVCache {
			if r, _ := s.sharedAt(t.Addr, 1); r != nil {
				return fmt.Errorf("%s at %#x: the allocation at %#x is exported (object %d), and the node refuses kernels' writes to exported buffers: %w",
					name, t.Addr, a.VA, r.object, api.ErrInvalidArgument)
			}
		}
		g.dev, devSet = a.Dev, true
		if _, ok := g.bound[a.VA]; !ok {
			g.bound[a.VA] = i
		}
	}
	return nil
}

// pastAllocation refuses the bound tensor name of n bytes at va, whose
// allocation a ends before it does, naming the allocation it runs into if
// any: a kernel may never cross from one buffer into another.
func (s *session) pastAllocation(name string, va, n uint64, a memory.Allocation) error {
	into := ""
	if last := va + (n - 1); last > va { // n ≥ 1 element; no wrap past 2^64
		if b, err := s.space.AllocationAt(last); err == nil {
			into = fmt.Sprintf(" into the allocation at %#x", b.VA)
		}
	}
	return fmt.Errorf("%s of %d bytes at %#x, %d bytes into the %d-byte allocation at %#x, runs past its end %#x%s: a bound tensor lies within one allocation: %w",
		name, n, va, va-a.VA, a.End-a.VA, a.VA, a.End, into, api.ErrInvalidArgument)
}

// checkIO notes g's inputs and outputs and checks that an invocation's
// request and reply can carry them (wire.MaxChunk each way).
func (g *tensorGraph) checkIO(c *api.CheckedGraph) error {
	for i, t := range g.def.Tensors {
		var list *[]placed
		var sum *uint64
		switch t.Residency {
		case api.ResInput:
			list, sum = &g.inputs, &g.inBytes
		case api.ResOutput:
			list, sum = &g.outputs, &g.outBytes
		default:
			continue
		}
		if c.Bytes[i] > wire.MaxChunk-*sum {
			return fmt.Errorf("graph %q: its %vs up to %s take more than the %d bytes an invocation carries each way: %w",
				g.def.Name, t.Residency, g.def.TensorName(i), wire.MaxChunk, api.ErrInvalidArgument)
		}
		*list = append(*list, placed{tensor: i, bytes: c.Bytes[i]})
		*sum += c.Bytes[i]
	}
	return nil
}

// largestInArena returns g's largest tensor that is not bound (-1 if
// none), refusing it by name if it is larger than the graph's device.
func (s *session) largestInArena(g *tensorGraph, c *api.CheckedGraph) (int, error) {
	largest := -1
	for i, t := range g.def.Tensors {
		if !t.Residency.Bound() && (largest < 0 || c.Bytes[i] > c.Bytes[largest]) {
			largest = i
		}
	}
	if info := s.vdevs[g.dev].dev.info; largest >= 0 && c.Bytes[largest] > info.Memory {
		return 0, fmt.Errorf("graph %q: %s takes %d bytes, more than device %d (%s) has (%d): %w",
			g.def.Name, g.def.TensorName(largest), c.Bytes[largest], g.dev, info.Name, info.Memory, api.ErrOutOfMemory)
	}
	return largest, nil
}

// layArena places the graph's unbound tensors in its arena and returns each
// one's offset (bound tensors' are unused) and the arena's size. Tensors
// whose lifetimes do not overlap share bytes: an input lives from the
// invocation's writes to its last reader, an output from its first writer
// to the invocation's reads, an activation from its first writer to its
// last reader; one no op uses takes no room. Largest first, each goes at
// the lowest aligned offset free of the tensors already placed that it
// lives beside, which is deterministic and near the peak of live bytes for
// the chains of layers a model is.
func layArena(def *api.GraphDef, c *api.CheckedGraph) ([]uint64, uint64) {
	type life struct {
		i        int
		from, to int // op indices; -1 the input writes, len(ops) the output reads
	}
	var lives []life
	for i, t := range def.Tensors {
		l := life{i: i, from: c.First[i], to: c.Last[i]}
		switch t.Residency {
		case api.ResInput:
			l.from, l.to = -1, max(l.to, -1)
		case api.ResOutput:
			l.to = len(def.Ops)
		case api.ResActivation:
			if l.from < 0 {
				continue
			}
		default:
			continue
		}
		lives = append(lives, l)
	}
	slices.SortStableFunc(lives, func(a, b life) int { return cmp.Compare(c.Bytes[b.i], c.Bytes[a.i]) })
	offsets := make([]uint64, len(def.Tensors))
	type block struct{ off, end uint64 }
	var size uint64
	for k, l := range lives {
		var busy []block
		for _, o := range lives[:k] {
			if o.from <= l.to && l.from <= o.to {
				busy = append(busy, block{offsets[o.i], offsets[o.i] + c.Bytes[o.i]})
			}
		}
		slices.SortFunc(busy, func(a, b block) int { return cmp.Compare(a.off, b.off) })
		var off uint64
		for _, b := range busy {
			if off+c.Bytes[l.i] <= b.off {
				break
			}
			off = max(off, alignArena(b.end))
		}
		offsets[l.i] = off
		size = max(size, off+c.Bytes[l.i])
	}
	return offsets, size
}

// alignArena rounds n up to arenaAlign; arena sizes stay far below overflow.
func alignArena(n uint64) uint64 { return (n + arenaAlign - 1) &^ (arenaAlign - 1) }

// translateGraph translates every tensor of g that an op or the invocation
// uses (bound ones at their addresses, the others in the arena at
// offsets), exactly its bytes, and builds the node graph's launches: a
// kernel's extents cover its tensor and nothing beside it, even where the
// tensor shares its allocation with others. The session's memory does
// not move (no eviction), so the runs stay valid while the allocations live.
func (s *session) translateGraph(g *tensorGraph, c *api.CheckedGraph, offsets []uint64) (*api.NodeGraph, error) {
	var ranges []memory.Range
	var which []int
	for i, t := range g.def.Tensors {
		if c.First[i] < 0 && t.Residency != api.ResInput {
			continue // no op uses it, nor does the invocation
		}
		va := t.Addr
		if !t.Residency.Bound() {
			va = g.arena + offsets[i]
		}
		ranges = append(ranges, memory.Range{VA: va, Len: c.Bytes[i], Write: t.Residency != api.ResWeight})
		which = append(which, i)
	}
	s.issueMu.Lock()
	ts, err := s.space.TranslateAll(ranges)
	s.issueMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("translate its tensors: %w", err)
	}
	xs := make([][]api.Extent, len(g.def.Tensors))
	for k, i := range which {
		xs[i] = ts[k].Extents
	}
	for _, io := range [][]placed{g.inputs, g.outputs} {
		for k := range io {
			io[k].xs = xs[io[k].tensor]
		}
	}
	ng := &api.NodeGraph{Device: s.vdevs[g.dev].dev.info.Index, Launches: make([]api.NodeGraphLaunch, len(g.def.Ops))}
	for j, op := range g.def.Ops {
		args := make([]api.NodeGraphArg, len(op.Args))
		for i, a := range op.Args {
			na := api.NodeGraphArg{Scalar: -1}
			switch a.Kind {
			case api.OpArgTensor:
				na.Kind, na.Extents = api.ArgBuffer, xs[a.Tensor]
			case api.OpArgI64:
				na.Kind, na.Bits = api.ArgI64, uint64(a.I64)
			case api.OpArgF32:
				na.Kind, na.Bits = api.ArgF32, api.F32Bits(a.F32)
			case api.OpArgScalar:
				na.Kind, na.Scalar, na.Mul, na.Add = api.ArgI64, int32(a.Scalar), a.Mul, a.I64
				g.scalarUses = append(g.scalarUses, scalarUse{op: j, param: i, arg: a})
				g.nodeScalars = max(g.nodeScalars, int(a.Scalar)+1)
			}
			args[i] = na
		}
		ng.Launches[j] = api.NodeGraphLaunch{Kernel: op.Kernel, Phase: op.Phase, Args: args}
	}
	return ng, nil
}

// registerNodeGraph registers ng with the node of g's device.
func (s *session) registerNodeGraph(g *tensorGraph, ng *api.NodeGraph) (uint32, error) {
	body := api.Encode(ng)
	if len(body) > wire.MaxBody {
		return 0, fmt.Errorf("its %d launches take %d bytes to describe to the node, more than the %d of a request: split the graph: %w",
			len(ng.Launches), len(body), wire.MaxBody, api.ErrInvalidArgument)
	}
	v := s.vdevs[g.dev]
	reply, err := v.rpc.Call(api.OpNodeGraphRegister, nil, body)
	if err != nil {
		return 0, fmt.Errorf("register its launches with node %s: %w", s.m.node(v.dev.node).addr, err)
	}
	var id api.Graph
	if err := api.Decode(reply, &id); err != nil {
		return 0, fmt.Errorf("node %s's answer to the graph's registration: %w", s.m.node(v.dev.node).addr, err)
	}
	return id.Graph, nil
}

// tensorGraph returns the registered graph id.
func (s *session) tensorGraph(id uint32) (*tensorGraph, error) {
	g := s.tgraphs.byID[id]
	if g == nil {
		return nil, fmt.Errorf("tensor graph %d does not exist: %w", id, api.ErrInvalidArgument)
	}
	return g, nil
}

// invokeGraph runs a graph as an api.GraphInvoke in body asks and answers h
// with its outputs. Everything the request decides is checked before the
// first byte is sent; the node checks every launch before it runs one.
func (s *session) invokeGraph(h wire.Header, body []byte) error {
	var m api.GraphInvoke
	if err := api.Decode(body, &m); err != nil {
		return fmt.Errorf("invoke: %w", err)
	}
	g, err := s.tensorGraph(m.Graph)
	if err != nil {
		return fmt.Errorf("invoke: %w", err)
	}
	if err := s.graphGone(g); err != nil {
		return fmt.Errorf("invoke %v: %w", g, err)
	}
	if err := g.checkInvocation(&m); err != nil {
		return err
	}
	if err := s.bw.wait(g.inBytes+g.outBytes, s.ending, nil); err != nil {
		return fmt.Errorf("invoke %v: %w", g, err)
	}
	s.drainAll() // the weights and caches that work queued before writes are in place
	out := getOut(g.outBytes)
	defer putOut(out)
	v := s.vdevs[g.dev]
	dev := v.dev.info.Index
	n := len(g.inputs) + 1 + len(g.outputs)
	calls := make([]*wire.Call, 0, n)
	// The writes, the run and the reads leave in one system call, not one
	// each: the connection is held while they are sent, and all but the
	// last stay in its buffer (GoThen) until the last (Go) flushes them.
	// A failed flush fails the connection, and so every one of them.
	v.rpc.Hold()
	send := func(op wire.Op, into []byte, parts ...[]byte) {
		if len(calls)+1 == n {
			calls = append(calls, v.rpc.Go(op, into, parts...))
		} else {
			calls = append(calls, v.rpc.GoThen(op, into, nil, parts...))
		}
	}
	in := m.Inputs
	for _, t := range g.inputs {
		send(api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Device: dev, Extents: t.xs}), in[:t.bytes])
		in = in[t.bytes:]
	}
	run := len(calls)
	send(api.OpNodeGraphRun, nil, api.Encode(&api.NodeGraphRun{Graph: g.node, Scalars: m.Scalars[:g.nodeScalars]}))
	var off uint64
	for _, t := range g.outputs {
		send(api.OpNodeRead, (*out)[off:off+t.bytes], api.Encode(&api.NodeAccess{Device: dev, Extents: t.xs}))
		off += t.bytes
	}
	// Release flushes what other goroutines wrote after our last frame
	// while we held the connection: their calls learn of a failed flush
	// as of any broken connection, from its reader.
	_ = v.rpc.Release()
	// The first failure in order is the one to report: the run's (the
	// first failing op's) unless an input failed to land before it.
	var first error
	for k, call := range calls {
		if err := call.Wait(); err != nil && first == nil {
			first = err
			if k == run {
				first = g.opError(err)
			}
		}
	}
	if first != nil {
		return fmt.Errorf("invoke %v: %w", g, first)
	}
	s.copiedIn.Add(g.inBytes)
	s.copiedOut.Add(g.outBytes)
	s.launches.Add(uint64(len(g.def.Ops)))
	return s.c.Reply(h, (*out)[:g.outBytes])
}

// opError names the op of g whose launch failed a node's run, as the
// node's error names it (api.BatchError: the launch's index).
func (g *tensorGraph) opError(err error) error {
	i, opErr, ok := api.SplitBatchError(err)
	if !ok || i >= len(g.def.Ops) {
		return err
	}
	op := g.def.Ops[i]
	return fmt.Errorf("op %d (%s, %v): %w", i, op.Kernel, op.Phase, opErr)
}

// checkInvocation checks what an invocation gives against g: the count of
// scalars, the value of every argument they give (Mul × scalar + Add, which
// must not overflow nor be negative) and the length of the input bytes.
func (g *tensorGraph) checkInvocation(m *api.GraphInvoke) error {
	if len(m.Scalars) != len(g.def.Scalars) {
		names := ""
		if len(g.def.Scalars) > 0 {
			names = " (" + strings.Join(g.def.Scalars, ", ") + ")"
		}
		return fmt.Errorf("invoke %v: %d scalars given, it takes %d%s: %w",
			g, len(m.Scalars), len(g.def.Scalars), names, api.ErrInvalidArgument)
	}
	for _, u := range g.scalarUses {
		s := m.Scalars[u.arg.Scalar]
		v, ok := api.ScalarValue(u.arg.Mul, s, u.arg.I64)
		if !ok || v < 0 {
			op := g.def.Ops[u.op]
			what := "overflows"
			if ok {
				what = fmt.Sprintf("is %d, negative", v)
			}
			return fmt.Errorf("invoke %v: op %d (%s) parameter %d: %d × %s (%d) + %d %s: %w",
				g, u.op, op.Kernel, u.param, u.arg.Mul, g.def.Scalars[u.arg.Scalar], s, u.arg.I64, what, api.ErrInvalidArgument)
		}
	}
	if uint64(len(m.Inputs)) != g.inBytes {
		sizes := make([]string, len(g.inputs))
		for k, t := range g.inputs {
			sizes[k] = fmt.Sprintf("%s: %d", g.def.TensorName(t.tensor), t.bytes)
		}
		return fmt.Errorf("invoke %v: %d input bytes given, it takes %d (%s): %w",
			g, len(m.Inputs), g.inBytes, strings.Join(sizes, ", "), api.ErrInvalidArgument)
	}
	return nil
}

// releaseGraph releases a graph as an api.Graph in body asks.
func (s *session) releaseGraph(body []byte) error {
	var m api.Graph
	if err := api.Decode(body, &m); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	g, err := s.tensorGraph(m.Graph)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	s.tgraphs.remove(g)
	s.jr.add(journalOp{Op: opUntgraph, Graph: g.id}) // before its arena's free
	// The node is never asked to run it again, so its arena may go even
	// if the node's answer is lost; a node forgets a connection's graphs
	// with the connection.
	v := s.vdevs[g.dev]
	if err := s.graphGone(g); err != nil {
		s.log.WithError(err).WithField("graph", g.String()).Debug("node graph not freed: its node forgot it, and its id may be another's now")
	} else if _, err := v.rpc.Call(api.OpNodeGraphFree, nil, api.Encode(&api.Graph{Graph: g.node})); err != nil {
		s.log.WithError(err).WithField("graph", g.String()).Info("freeing a node graph failed; the node frees it with the connection")
	}
	if g.arena != 0 {
		s.drainAll() // a stream's command may name the arena, as it may any allocation
		if err := s.free(g.arena); err != nil {
			return fmt.Errorf("release %v: free its arena: %w", g, err)
		}
	}
	return nil
}

// arenaOf is the tensor graph whose arena is the allocation at va, if any.
func (s *session) arenaOf(va uint64) *tensorGraph {
	for _, g := range s.tgraphs.byID {
		if g.arena == va {
			return g
		}
	}
	return nil
}

// graphHolding names the tensor graph that holds the allocation at va —
// binds it, or has it as its arena — if any; writes says whether the
// graph's ops write it.
func (s *session) graphHolding(va uint64) (what string, writes bool) {
	if g := s.arenaOf(va); g != nil {
		return fmt.Sprintf("%v has it as its arena", g), true
	}
	for _, g := range s.tgraphs.byID {
		if i, ok := g.bound[va]; ok {
			return fmt.Sprintf("%v binds it as %s", g, g.def.TensorName(i)), g.def.Tensors[i].Residency == api.ResKVCache
		}
	}
	return "", false
}

// checkUnheld refuses op on the allocation at va while a tensor graph holds
// it (any graph for a free, one that writes it otherwise).
func (s *session) checkUnheld(op string, va uint64, anyUse bool) error {
	if what, writes := s.graphHolding(va); what != "" && (anyUse || writes) {
		return fmt.Errorf("%s %#x: %s: release the graph first: %w", op, va, what, api.ErrInvalidArgument)
	}
	return nil
}
