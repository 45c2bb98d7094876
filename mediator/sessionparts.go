package mediator

import (
	"fmt"
	"slices"
	"sync"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// The parts of a session that hold a collection by id, each behind its own
// mutex (the tensor graphs behind none: only the session's reader touches
// them). Each part's methods keep its invariants; none of them takes
// another part's lock, calls a node or waits for a stream while holding
// its own, so the parts are siblings in the session's lock order (see the
// session type).

// streamSet is a session's streams, by id, and the allocations to free
// with each (api.MallocFreeWithStream).
//
// Invariants: at most MaxStreams streams; a new id never replaces a live
// stream (ids wrap); the default stream leaves only with all of them, as
// the session ends (takeAll); an allocation is listed under at most the
// one stream it was allocated with, and only while it is live.
type streamSet struct {
	mu         sync.Mutex
	byID       map[uint32]*stream  // guarded by mu
	next       uint32              // guarded by mu: the id a new stream tries first
	withStream map[uint32][]uint64 // guarded by mu: allocations freed with their stream, by stream
}

func newStreamSet() streamSet {
	return streamSet{byID: map[uint32]*stream{}, next: 1, withStream: map[uint32][]uint64{}}
}

// get returns stream id.
func (ss *streamSet) get(id uint32) (*stream, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st := ss.byID[id]
	if st == nil {
		return nil, fmt.Errorf("stream %d does not exist: %w", id, api.ErrInvalidArgument)
	}
	return st, nil
}

// create adds a stream, made by newStream, under a free id, which it
// returns.
func (ss *streamSet) create(newStream func(id uint32) *stream) (uint32, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.byID) >= MaxStreams {
		return 0, fmt.Errorf("session has %d streams, the limit: %w", len(ss.byID), api.ErrInvalidArgument)
	}
	id := ss.next
	for ss.byID[id] != nil { // ids wrap; never replace a live stream
		id++
	}
	ss.next = id + 1
	ss.byID[id] = newStream(id)
	return id, nil
}

// recreate adds stream id, made by newStream, as a journal's record made
// it (resume.go); a live id is refused.
func (ss *streamSet) recreate(id uint32, newStream func(id uint32) *stream) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.byID[id] != nil {
		return fmt.Errorf("stream %d made twice: %w", id, api.ErrInternal)
	}
	ss.byID[id] = newStream(id)
	ss.next = id + 1
	return nil
}

// remove takes stream id out of the set, with the allocations to free with
// it; st is nil if there was none. The caller stops it.
func (ss *streamSet) remove(id uint32) (st *stream, owned []uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st, owned = ss.byID[id], ss.withStream[id]
	delete(ss.byID, id)
	delete(ss.withStream, id)
	return st, owned
}

// list returns the live streams.
func (ss *streamSet) list() []*stream {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	streams := make([]*stream, 0, len(ss.byID))
	for _, st := range ss.byID {
		streams = append(streams, st)
	}
	return streams
}

// takeAll empties the set, as the session ends, and returns what it held.
func (ss *streamSet) takeAll() map[uint32]*stream {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	streams := ss.byID
	ss.byID = map[uint32]*stream{}
	return streams
}

// ids returns the ids of the live streams but the default one, ascending.
func (ss *streamSet) ids() []uint32 {
	ss.mu.Lock()
	var ids []uint32
	for id := range ss.byID {
		if id != api.DefaultStream {
			ids = append(ids, id)
		}
	}
	ss.mu.Unlock()
	slices.Sort(ids)
	return ids
}

// freeWith lists allocation va to be freed with stream id.
func (ss *streamSet) freeWith(id uint32, va uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.withStream[id] = append(ss.withStream[id], va)
}

// forget drops a freed allocation from the lists of those freed with their
// stream, so its address, once reused, is not freed with it.
func (ss *streamSet) forget(va uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for id, vas := range ss.withStream {
		if i := slices.Index(vas, va); i >= 0 {
			ss.withStream[id] = slices.Delete(vas, i, i+1)
		}
	}
}

// regionSet is a session's host regions (hostmem.go), by id.
//
// Invariants: at most MaxHostRegions regions (checked by the session's
// reader, which alone adds them, before it maps one); a new id is never 0
// and never a live region's.
type regionSet struct {
	mu   sync.Mutex
	byID map[uint32]*hostRegion // guarded by mu
	last uint32                 // guarded by mu: the id given last
}

// count is how many regions the session holds.
func (rs *regionSet) count() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.byID)
}

// add lists the mapping mem as a new region and returns its id.
func (rs *regionSet) add(mem []byte) uint32 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for rs.last++; rs.last == 0 || rs.byID[rs.last] != nil; rs.last++ {
	}
	rs.byID[rs.last] = &hostRegion{id: rs.last, mem: mem}
	return rs.last
}

// get returns region id, or nil.
func (rs *regionSet) get(id uint32) *hostRegion {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.byID[id]
}

// remove takes region id out of the set and returns it, or nil.
func (rs *regionSet) remove(id uint32) *hostRegion {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := rs.byID[id]
	delete(rs.byID, id)
	return r
}

// takeAll empties the set and returns what it held.
func (rs *regionSet) takeAll() []*hostRegion {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]*hostRegion, 0, len(rs.byID))
	for id, r := range rs.byID {
		out = append(out, r)
		delete(rs.byID, id)
	}
	return out
}

// graphSet is a session's graphs (graph.go), by id.
//
// Invariants: at most MaxGraphs graphs, of at most MaxGraphCommands
// commands together (cmds is their sum); a new id is never 0 and never a
// live graph's; a graph's commands never change once added.
type graphSet struct {
	mu   sync.Mutex
	byID map[uint32][]command // guarded by mu
	cmds int                  // guarded by mu: commands of all graphs
	last uint32               // guarded by mu: the id given last
	// lost are graphs a restore could not recreate, with why; their ids
	// stay taken until they are destroyed. Guarded by mu.
	lost map[uint32]error
}

// add lists a graph of cmds and returns its id.
func (gs *graphSet) add(cmds []command) (uint32, error) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if len(gs.byID) >= MaxGraphs {
		return 0, fmt.Errorf("session has %d graphs, the limit: %w", len(gs.byID), api.ErrInvalidArgument)
	}
	if gs.cmds+len(cmds) > MaxGraphCommands {
		return 0, fmt.Errorf("graph of %d commands: the session's graphs hold %d, and may hold %d in all: %w",
			len(cmds), gs.cmds, MaxGraphCommands, api.ErrQuotaExceeded)
	}
	gs.cmds += len(cmds)
	id := gs.last + 1
	for gs.byID[id] != nil || gs.lost[id] != nil || id == 0 { // ids wrap; never replace a live graph
		id++
	}
	gs.last = id
	gs.byID[id] = cmds
	return id, nil
}

// addAs lists a graph of cmds as id, which a session being restored had:
// its journal names them in the order they were given.
func (gs *graphSet) addAs(id uint32, cmds []command) error {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if id == 0 || gs.byID[id] != nil || gs.lost[id] != nil || len(gs.byID) >= MaxGraphs || gs.cmds+len(cmds) > MaxGraphCommands {
		return fmt.Errorf("graph %d: taken, or past the bounds: %w", id, api.ErrInternal)
	}
	gs.cmds += len(cmds)
	gs.last = id
	gs.byID[id] = cmds
	return nil
}

// lose lists id as a graph a restore lost, for why.
func (gs *graphSet) lose(id uint32, why error) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.lost == nil {
		gs.lost = map[uint32]error{}
	}
	gs.lost[id] = why
	gs.last = id
}

// remove forgets graph id.
func (gs *graphSet) remove(id uint32) error {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.lost[id] != nil {
		delete(gs.lost, id)
		return nil
	}
	if gs.byID[id] == nil {
		return fmt.Errorf("graph %d does not exist: %w", id, api.ErrInvalidArgument)
	}
	gs.cmds -= len(gs.byID[id])
	delete(gs.byID, id)
	return nil
}

// get returns graph id's commands, for a replay.
func (gs *graphSet) get(id uint32) ([]command, error) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	cmds := gs.byID[id]
	if cmds == nil {
		if why := gs.lost[id]; why != nil {
			return nil, why
		}
		return nil, fmt.Errorf("graph %d does not exist: %w", id, api.ErrInvalidArgument)
	}
	return cmds, nil
}

// tensorGraphSet is a session's tensor graphs (tensorgraph.go), by id.
// Only the session's reader touches it (tensorgraph.go says why), so it
// has no lock.
//
// Invariants: at most MaxTensorGraphs graphs, of at most MaxTensorGraphOps
// ops together (ops is their sum); a new id is never 0 and never a live
// graph's.
type tensorGraphSet struct {
	byID map[uint32]*tensorGraph
	ops  int
	last uint32 // the id given last
}

// room refuses a graph named name of n ops that would pass the bounds.
func (ts *tensorGraphSet) room(name string, n int) error {
	if len(ts.byID) >= MaxTensorGraphs {
		return fmt.Errorf("graph %q: session has %d tensor graphs, the limit: %w", name, len(ts.byID), api.ErrInvalidArgument)
	}
	if ts.ops+n > MaxTensorGraphOps {
		return fmt.Errorf("graph %q of %d ops: the session's tensor graphs hold %d, and may hold %d in all: %w",
			name, n, ts.ops, MaxTensorGraphOps, api.ErrQuotaExceeded)
	}
	return nil
}

// add lists g under a new id, which it sets; room has passed it.
func (ts *tensorGraphSet) add(g *tensorGraph) {
	g.id = ts.last + 1
	for ts.byID[g.id] != nil || g.id == 0 { // ids wrap; never replace a live graph
		g.id++
	}
	ts.addAs(g)
}

// addAs lists g under its id, which is no live graph's; room has passed
// it. A restore lists the graphs its journal names in the order they were
// given, so the last is the id given last.
func (ts *tensorGraphSet) addAs(g *tensorGraph) {
	ts.last = g.id
	ts.byID[g.id] = g
	ts.ops += len(g.def.Ops)
}

// remove forgets g.
func (ts *tensorGraphSet) remove(g *tensorGraph) {
	delete(ts.byID, g.id)
	ts.ops -= len(g.def.Ops)
}

// shareSet is a session's exported and imported buffers (shared.go), the
// import in progress, and the connections to nodes it dialled for imports
// only.
//
// Invariants: at most MaxShared ranges (checked by the session's reader,
// which alone adds them, before a node pins one); imported ranges lie from
// importBase up, each at a 2 MiB boundary past the one before, so they
// never overlap; a revocation that arrives while an import is in flight
// is kept for it (importing) and ends its range once recorded.
type shareSet struct {
	mu         sync.Mutex
	ranges     []*sharedRange    // guarded by mu
	importing  *pendingImport    // guarded by mu: the import in progress, if any
	nextImport uint64            // guarded by mu: where the next import goes; 0: importBase
	extra      map[int]*wire.RPC // guarded by mu: connections to nodes for imports only, by node
}

// count is how many buffers the session exports and imports.
func (sh *shareSet) count() int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return len(sh.ranges)
}

// find returns the range that holds va, or nil.
func (sh *shareSet) find(va uint64) *sharedRange {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, r := range sh.ranges {
		if va >= r.base && va < r.base+r.size {
			return r
		}
	}
	return nil
}

// add lists r, whose base is set: an export's is the allocation's, an
// import's that a restore made again its old address (placeRestored).
func (sh *shareSet) add(r *sharedRange) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.ranges = append(sh.ranges, r)
}

// addImport places r, the import of the object pending named, of size
// bytes, at the next import address, lists it, and ends it at once if a
// revocation came meanwhile.
func (sh *shareSet) addImport(r *sharedRange, size uint64, pending *pendingImport) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r.base = sh.nextImport
	if r.base == 0 {
		r.base = importBase
	}
	sh.nextImport = importEnd(r.base, size)
	if pending.err != nil {
		r.ended.Store(pending.err)
	}
	sh.ranges = append(sh.ranges, r)
}

// importEnd is where the import after one of size bytes at base goes.
func importEnd(base, size uint64) uint64 { return base + (size+(2<<20)-1)&^((2<<20)-1) }

// placeRestored makes room for an import a restore replays at base, of
// size bytes: later imports go past it.
func (sh *shareSet) placeRestored(base, size uint64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.nextImport = max(sh.nextImport, importEnd(base, size))
}

// setImporting records the import in progress (nil: none).
func (sh *shareSet) setImporting(p *pendingImport) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.importing = p
}

// revoked ends the imports of object reached through rpc with err, and the
// import of it in progress, if any; with all (the object ended) their pins
// end too.
func (sh *shareSet) revoked(rpc *wire.RPC, object uint64, all bool, err *error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.importing != nil && sh.importing.rpc == rpc && sh.importing.object == object {
		sh.importing.err = err // it arrived before the import was recorded
	}
	for _, r := range sh.ranges {
		if r.conn() == rpc && r.object == object && r.imported {
			r.ended.Store(err)
			if all {
				r.version.Store(0) // the object's pins ended with it: nothing to unpin
			}
		}
	}
}

// remove takes the range at va (only an import, if importsOnly) out of the
// set and returns it, or nil.
func (sh *shareSet) remove(va uint64, importsOnly bool) *sharedRange {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for i, x := range sh.ranges {
		if x.base == va && (x.imported || !importsOnly) {
			sh.ranges = append(sh.ranges[:i], sh.ranges[i+1:]...)
			return x
		}
	}
	return nil
}

// conn returns the connection dialled for imports from node idx, or nil.
func (sh *shareSet) conn(idx int) *wire.RPC {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.extra[idx]
}

// keepConn keeps rpc as the connection for imports from node idx, unless
// another has a live one there already: then rpc is closed and that one
// returned.
func (sh *shareSet) keepConn(idx int, rpc *wire.RPC) *wire.RPC {
	sh.mu.Lock()
	old := sh.extra[idx]
	if old == nil || closed(old) {
		sh.extra[idx], old = rpc, nil
	}
	sh.mu.Unlock()
	if old != nil {
		rpc.Close() // unlocked: a close finishes the calls in flight, running their continuations
		return old
	}
	return rpc
}

// closeConns closes the connections dialled for imports.
func (sh *shareSet) closeConns() {
	sh.mu.Lock()
	conns := make([]*wire.RPC, 0, len(sh.extra))
	for _, rpc := range sh.extra {
		conns = append(conns, rpc)
	}
	sh.mu.Unlock()
	for _, rpc := range conns {
		rpc.Close()
	}
}
