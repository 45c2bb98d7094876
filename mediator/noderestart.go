package mediator

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// A node that restarts takes the session's device memory there with it; a
// node that only drops a session's connection (a network blip, a reset, its
// peer timeout) parks its frames for its reattach grace, since every
// session's node connections attach (accelerator/reattach.go): a journaled
// session's under the node's own grace, to outlast this mediator's restart
// (resume.go); any other's, which nothing could reclaim after this
// mediator's restart, asking for only Config.DropGrace, long enough to
// outlast a network blip, so that the frames of a mediator that died
// without a journal count against its tenants' share of the node no
// longer than that. The session goes on:
//
//   - A watcher per node connection (watchNodes) notices the connection
//     closing and dials the node again, backing off from redialFirst to
//     redialMax, until it answers or the session ends. If the node reports
//     the boot id it had (it did not restart) and the old connection had
//     attached, the watcher reclaims the parked frames on the new
//     connection at once, with the owner id and token the attach gave,
//     which this process holds (and a journal records), as a restore does
//     (attach), before the grace can end. It leaves the new connection
//     pending, with what it reclaimed or why it could not.
//   - The session's reader installs a pending connection before the next
//     request it serves (installRedialled): it waits for the streams and
//     points the node's devices at the new connection under issueMu. A
//     reclaim is checked as a restore's is (reconcile: every frame the
//     space maps was kept, those kept beyond are freed); then every
//     allocation keeps its bytes, and the journal stays valid, since the
//     reclaimed connection goes on under the same owner id and token.
//     The shared buffers reached through the dropped connection are
//     rebuilt on the new one, as a restore rebuilds them (dropshared.go).
//     Otherwise — the node restarted, refused the reclaim (grace over,
//     token wrong), or the connection had not attached (its attach
//     failed) — it records
//     that the devices of that node lost their memory (memory.Space.Lose;
//     the frame source forgets their frames). New allocations there work;
//     an allocation that had memory there fails every use with
//     api.ErrUnavailable naming the node and why, until it is freed. What
//     the mediator holds itself survives: the evicted memory of an
//     oversubscribing session is in its host store, and faults in again.
//     Either way the node forgot the connection's tensor graphs: after a
//     reclaim they are registered again (reregisterGraphs), otherwise
//     they are gone (graphGone).
//   - Then, still before that request, each lost sealed weight whose
//     SHA-256s the session recorded (Config.WeightSums, recordSums) is
//     restored from another node that holds a sealed frame of the same
//     contents (fetchSealed): bytes the tenant does not send again. One
//     that no node holds stays lost, its error saying so.
//   - A journaled session that lost memory gives its journal up: it names
//     frames the node no longer has, so a mediator restart could not
//     restore it. The new connection attaches afresh, under DropGrace as
//     for any session with no journal, so that what the session allocates
//     there from now on outlasts the next drop.
//
// Locks: nodeRedial.mu guards pending and is what vdevs' connections are
// swapped under (besides issueMu, with the streams idle), so that links,
// which status calls off the session's reader, reads them under it; it is a
// leaf. Everything else that reads a vdev's connection holds issueMu, or is
// the session's reader, which alone swaps them.

// Redialling a node whose connection broke backs off from redialFirst to
// redialMax between tries.
const (
	redialFirst = 100 * time.Millisecond
	redialMax   = 2 * time.Second
)

// DefaultDropGrace is how long a node keeps the frames of a session with no
// journal after its connection drops (Config.DropGrace): a network blip
// that outlasts the node's peer timeout, plus redialMax for the watcher to
// dial again once the network is back.
const DefaultDropGrace = 15 * time.Second

// stopRedials, a test's fault injection beside dieBeforeRecord, keeps the
// watchers from dialling, as a mediator that died would not. false
// outside tests.
var stopRedials atomic.Bool

var errRedialsStopped = fmt.Errorf("redials stopped: %w", api.ErrUnavailable)

// nodeRedial is a session's view of its node connections' health.
type nodeRedial struct {
	once  sync.Once   // starts the watchers once
	ready atomic.Bool // pending holds a connection to install
	mu    sync.Mutex
	// pending are the new connections to nodes whose old one broke, by
	// node index, not yet installed; guarded by mu.
	pending map[int]redialled
	// attached is, by node index, how the session's connection there
	// attached (owner id and token); grace is what the attach asked of
	// the nodes (0: their own), which a reclaim asks again. Both are
	// guarded by mu. A connection whose attach failed is not there.
	attached map[int]journalConn
	grace    time.Duration
	// restored counts the chunks of sealed weights restored from another
	// node's copy after a node restart; reclaimed the node connections
	// that dropped and whose frames were reclaimed.
	restored, reclaimed atomic.Uint64
	// rehomed counts the shared objects the session exported that it
	// restored on their restarted home; reimported the imports it made
	// again there (rehome.go).
	rehomed, reimported atomic.Uint64
	// installs counts the connections installed; replaced is, by virtual
	// device, the count when its connection was last replaced, and why. A
	// tensor graph registered before that (tensorGraph.epoch) went with
	// its node (graphGone). Both are the session's reader's alone.
	installs uint64
	replaced map[uint32]replacedConn
}

// redialled is a new connection to a node whose old one broke, the boot
// id the node reports now, and either the frames it reclaimed of the old
// one, by device, or why the memory there is lost.
type redialled struct {
	rpc  *wire.RPC
	boot string
	kept []api.NodeFrames // valid if why is nil
	why  error
	// was is the boot id the node had, if it restarted; rehomed then
	// says, for each export there, why it was not restored on rpc (nil:
	// it was: rehome.go).
	was     string
	rehomed map[*sharedRange]error
}

// replacedConn is when and why a virtual device's node connection was
// replaced.
type replacedConn struct {
	at  uint64
	why error
}

// watchNodes starts, once, a watcher of each of the session's node
// connections.
func (s *session) watchNodes() {
	s.nodes.once.Do(func() {
		seen := map[*wire.RPC]bool{}
		for _, v := range s.vdevs {
			if !seen[v.rpc] {
				seen[v.rpc] = true
				go s.watchNode(v.dev.node, v.rpc, s.m.node(v.dev.node).bootIfUp())
			}
		}
	})
}

// watchNode waits for rpc, the session's connection to node, to break, and
// then dials the node until it answers, leaving the new connection pending
// for the session's reader. boot is the node's boot id when rpc was made,
// "" if unknown. It ends with the session.
func (s *session) watchNode(node int, rpc *wire.RPC, boot string) {
	select {
	case <-rpc.Closed():
	case <-s.ending:
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.ending:
			cancel()
		case <-ctx.Done():
		}
	}()
	n := s.m.node(node)
	for wait := redialFirst; ; wait = min(2*wait, redialMax) {
		var fresh *wire.RPC
		err := errRedialsStopped
		if !stopRedials.Load() {
			fresh, _, err = dialNodeContext(ctx, n.addr, s.m.nodeTenant(s.tenant), s.m.cfg.NodeTLS, n.cache.push)
		}
		if err == nil {
			now, _ := bootOf(fresh)
			p := redialled{rpc: fresh, boot: now}
			p.kept, p.why = s.reclaimDropped(node, fresh, boot, now)
			if boot != "" && now != "" && boot != now {
				p.was, p.rehomed = boot, s.rehomeExports(node, fresh)
			}
			s.nodes.mu.Lock()
			if ctx.Err() != nil { // the session ended meanwhile: nobody installs it
				s.nodes.mu.Unlock()
				fresh.Close()
				return
			}
			if s.nodes.pending == nil {
				s.nodes.pending = map[int]redialled{}
			}
			s.nodes.pending[node] = p
			s.nodes.ready.Store(true)
			s.nodes.mu.Unlock()
			s.log.WithError(p.why).WithFields(logrus.Fields{"node": n.addr, "reclaimed": p.why == nil}).Info("connection to a node broke; redialled")
			// A connection never installed is closed when the session ends.
			<-ctx.Done()
			s.nodes.mu.Lock()
			if s.nodes.pending[node].rpc == fresh {
				delete(s.nodes.pending, node)
				fresh.Close()
			}
			s.nodes.mu.Unlock()
			return
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
}

// installRedialled installs the connections the watchers redialled, as the
// package comment above says. The session's reader calls it before a
// request, when nodes.ready says there are some.
func (s *session) installRedialled() {
	s.nodes.mu.Lock()
	pending := s.nodes.pending
	s.nodes.pending = nil
	s.nodes.ready.Store(false)
	s.nodes.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	s.drainAll()
	s.issueMu.Lock()
	defer s.issueMu.Unlock()
	for node, p := range pending {
		addr, rpc, old := s.m.node(node).addr, p.rpc, s.vdevRPC(node)
		s.nodes.installs++
		if s.nodes.replaced == nil {
			s.nodes.replaced = map[uint32]replacedConn{}
		}
		for i := range s.vdevs {
			if s.vdevs[i].dev.node == node {
				s.nodes.mu.Lock()
				s.vdevs[i].rpc = rpc
				s.nodes.mu.Unlock()
			}
		}
		why := p.why
		if why == nil {
			why = s.adoptReclaimed(node, p.boot, p.kept)
		}
		if why == nil {
			s.nodes.reclaimed.Add(1)
			gone := fmt.Errorf("node %s dropped the session's connection, and the tensor graphs registered there with it: %w", addr, api.ErrUnavailable)
			for i := range s.vdevs {
				if s.vdevs[i].dev.node == node {
					s.nodes.replaced[uint32(i)] = replacedConn{at: s.nodes.installs, why: gone}
				}
			}
			s.reregisterGraphs(node)
			s.rebuildShared(node, old, rpc)
			go s.watchNode(node, rpc, p.boot)
			s.log.WithField("node", addr).Info("node connection replaced: its frames reclaimed, every allocation there kept")
			continue
		}
		var lost []memory.Lost
		for i := range s.vdevs {
			if s.vdevs[i].dev.node == node {
				s.nodes.replaced[uint32(i)] = replacedConn{at: s.nodes.installs, why: why}
				lost = append(lost, s.space.Lose(uint32(i), why)...)
				s.frames.forget(uint32(i))
			}
		}
		s.jr.giveUp(why)
		s.attachAfresh(node, rpc)
		if p.rehomed != nil {
			s.adoptRehomed(node, rpc, p.was, p.boot, p.rehomed)
		}
		go s.watchNode(node, rpc, p.boot)
		restored := s.restoreSealed(node, lost)
		s.log.WithError(why).WithFields(logrus.Fields{"node": addr, "lost": len(lost) - restored, "restored": restored}).
			Warn("node connection replaced: allocations that had memory there are lost, but sealed weights restored from another node")
	}
}

// attachAfresh attaches rpc, the session's new connection to node, whose
// old one lost its memory there: under a new token, asking for DropGrace,
// as the session has no journal (now). One that cannot attach is not
// reclaimed at its next drop. The caller holds issueMu.
func (s *session) attachAfresh(node int, rpc *wire.RPC) {
	c, _, err := attach(rpc, s.m.node(node).addr, 0, "", s.m.cfg.DropGrace)
	s.nodes.mu.Lock()
	defer s.nodes.mu.Unlock()
	s.nodes.grace = s.m.cfg.DropGrace
	if err != nil {
		delete(s.nodes.attached, node)
		s.log.WithError(err).Warn("new node connection not attached: its next drop will lose the session's memory there")
		return
	}
	if s.nodes.attached == nil {
		s.nodes.attached = map[int]journalConn{}
	}
	s.nodes.attached[node] = c
}

// reregisterGraphs registers again, on the reclaimed connection to node,
// the launches of the session's tensor graphs there, which the node forgot
// with the dropped connection; their physical runs are the frames the
// reclaim kept. A graph that fails stays gone (graphGone), logged. The
// caller holds issueMu, with the connection installed.
func (s *session) reregisterGraphs(node int) {
	for _, g := range s.tgraphs.byID {
		if s.vdevs[g.dev].dev.node != node || g.launches == nil || s.graphGone(g) == nil {
			continue
		}
		id, err := s.registerNodeGraph(g, g.launches)
		if err != nil {
			s.log.WithError(err).WithField("graph", g.String()).Warn("tensor graph not registered again on its reclaimed node connection; it fails unavailable")
			continue
		}
		g.node, g.epoch = id, s.nodes.installs
	}
}

// reclaimDropped reclaims, on rpc, a new connection to node, the frames the
// node parked of the session's connection that dropped, if it can: the
// node's boot id was boot then and is now now ("": unknown). It returns
// them by device, or why the memory there is lost. The node's watcher
// calls it, so that the reclaim comes as soon as the node answers.
func (s *session) reclaimDropped(node int, rpc *wire.RPC, boot, now string) ([]api.NodeFrames, error) {
	addr := s.m.node(node).addr
	s.nodes.mu.Lock()
	jc, ok := s.nodes.attached[node]
	grace := s.nodes.grace
	s.nodes.mu.Unlock()
	switch {
	case boot != "" && now != "" && boot != now:
		return nil, lossReason(addr, boot, now, "") // a restarted node keeps nothing
	case !ok:
		return nil, lossReason(addr, boot, now, "the connection had not attached, so the node kept nothing of it")
	}
	_, kept, err := attach(rpc, addr, jc.Owner, jc.Token, grace)
	if err != nil {
		return nil, lossReason(addr, boot, now, "the reclaim was refused: "+err.Error())
	}
	return kept, nil
}

// adoptReclaimed checks the frames reclaimed of node (boot: its boot id),
// kept by device,
// against those the session's space maps there, as a restore does
// (reconcile), freeing those it does not map; nil if the session may go
// on with its memory there. The caller holds issueMu, the node's devices
// pointing at the new connection.
func (s *session) adoptReclaimed(node int, boot string, kept []api.NodeFrames) error {
	addr := s.m.node(node).addr
	r := &replay{kept: make([]map[uint64]bool, len(s.vdevs))}
	for i, v := range s.vdevs {
		if v.dev.node == node {
			r.kept[i] = keptOn(v.dev, kept)
		}
	}
	if err := s.reconcile(r); err != nil {
		return lossReason(addr, boot, boot, "the frames it gave back do not match the session's: "+err.Error())
	}
	return nil
}

// graphGone says why tensor graph g went with its node, if it did: the
// node that restarted forgot it, and the physical runs it was placed at may
// now be other allocations' frames, so nothing of it may be sent to the
// node. The caller is the session's reader.
func (s *session) graphGone(g *tensorGraph) error {
	if r, ok := s.nodes.replaced[g.dev]; ok && r.at > g.epoch {
		return r.why
	}
	return nil
}

// lossReason is why a session's memory on the node at addr is lost, its
// connection having broken: the node's boot id was boot when the
// connection was made and is now now ("": unknown); because, if not "",
// says why nothing was reclaimed.
func lossReason(addr, boot, now, because string) error {
	lost := "and the device memory the session held there went with it"
	if because != "" {
		lost += " (" + because + ")"
	}
	switch {
	case boot != "" && now != "" && boot != now:
		return fmt.Errorf("node %s restarted (boot %s, now %s), %s: %w", addr, boot, now, lost, api.ErrUnavailable)
	case boot != "" && boot == now:
		return fmt.Errorf("node %s dropped the session's connection (it did not restart), %s: %w", addr, lost, api.ErrUnavailable)
	}
	return fmt.Errorf("node %s restarted or dropped the session's connection, %s: %w", addr, lost, api.ErrUnavailable)
}

// bootOf asks the node at the other end of rpc for its boot id, waiting at
// most statusTimeout.
func bootOf(rpc *wire.RPC) (string, error) {
	call := rpc.Go(api.OpNodeStatus, nil)
	select {
	case <-call.Done():
	case <-time.After(statusTimeout):
		return "", fmt.Errorf("no status within %v: %w", statusTimeout, api.ErrUnavailable)
	}
	if call.Err != nil {
		return "", call.Err
	}
	var st api.NodeStatus
	if err := json.Unmarshal(call.Body, &st); err != nil {
		return "", fmt.Errorf("malformed status: %v: %w", err, api.ErrProtocol)
	}
	return st.Boot, nil
}

// bootIfUp is the node's boot id if its control connection, on which it
// was learnt, is still open, so that the node has not restarted since;
// otherwise "".
func (n *node) bootIfUp() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.ctl.Closed():
		return ""
	default:
		return n.boot
	}
}

// forget drops the frames of dev the source held, which their node no
// longer has, from the container's count of resident memory.
func (f *frameSource) forget(dev uint32) {
	f.mu.Lock()
	var n uint64
	for k := range f.held {
		if k.dev == dev {
			delete(f.held, k)
			n++
		}
	}
	f.mu.Unlock()
	if q := f.resident(); q != nil {
		q.release(n * memory.FrameSize)
	}
}

// giveUp deletes the session's journal, if it has one still, since it no
// longer describes memory the nodes hold.
func (l *sessionLog) giveUp(why error) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.fail(why)
	}
}

// restoreSealed restores each of the lost allocations that has sums from
// another node's sealed copy, and returns how many it restored; an
// allocation that cannot be is left lost, with the reason added. The
// caller holds issueMu.
func (s *session) restoreSealed(restarted int, lost []memory.Lost) int {
	src := &sealedSource{s: s, skip: s.m.node(restarted), conns: map[*node]*scratch{}}
	defer src.close()
	n := 0
	for _, l := range lost {
		if l.Sums == nil {
			continue
		}
		err := s.space.Restore(l.VA, func(_ int, sum [32]byte, p []byte) error { return src.fetch(sum, p) })
		if err != nil {
			s.log.WithError(err).WithField("addr", fmt.Sprintf("%#x", l.VA)).Warn("sealed weight not restored")
			continue
		}
		s.nodes.restored.Add(uint64(len(l.Sums)))
		s.resealRestored(l.VA)
		n++
	}
	return n
}

// resealRestored seals on its node the frames of a weight just restored,
// so that the node protects and indexes them as before. A failure leaves
// the weight readable and sealed in the space (which refuses writes to it),
// only not shared.
func (s *session) resealRestored(va uint64) {
	a, err := s.space.AllocationAt(va)
	if err == nil {
		var ts []memory.Translation
		ts, err = s.translateSealed(va, a.End-va)
		if err == nil {
			var frames []uint64
			for _, x := range ts[0].Extents {
				for f := x.Addr; f < x.Addr+x.Len; f += memory.FrameSize {
					frames = append(frames, f)
				}
			}
			v := s.vdevs[a.Dev]
			_, err = v.rpc.Call(api.OpNodeSeal, nil, api.Encode(&api.NodeFrames{Device: v.dev.info.Index, Frames: frames}))
		}
	}
	if err != nil {
		s.log.WithError(err).WithField("addr", fmt.Sprintf("%#x", va)).Info("restored weight not sealed on its node again")
	}
}

// sealedSource fetches sealed contents by SHA-256 from the nodes other than
// skip: on each, through a connection of the session's tenant of its own,
// it has the node fill a scratch frame from its content index
// (api.OpNodeDedup) and reads it back. The connections, and with them the
// scratch frames, last one restore.
type sealedSource struct {
	s     *session
	skip  *node
	conns map[*node]*scratch // nil: the node could not be used
}

// scratch is a connection to a node and the frame it fills there.
type scratch struct {
	rpc    *wire.RPC
	device uint32
	frame  uint64
}

// fetch fills p with the FrameSize bytes whose SHA-256 is sum, from the
// first node that holds them, checking them against sum.
func (src *sealedSource) fetch(sum [32]byte, p []byte) error {
	var errs []error
	for _, n := range src.s.m.nodeList() {
		if n == src.skip || n.gone.Load() {
			continue
		}
		sc, err := src.scratchOn(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ok, err := sc.fill(sum, p)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("node %s: %w", n.addr, err))
		case !ok:
			continue
		case sha256.Sum256(p) != sum:
			errs = append(errs, fmt.Errorf("node %s gave contents that do not match their sum: %w", n.addr, api.ErrProtocol))
		default:
			return nil
		}
	}
	return fmt.Errorf("no other node holds a sealed copy of its contents (%x…)%s: %w", sum[:4], joinedReasons(errs), api.ErrUnavailable)
}

func joinedReasons(errs []error) string {
	if len(errs) == 0 {
		return ""
	}
	return " (" + errors.Join(errs...).Error() + ")"
}

// scratchOn returns the scratch connection and frame on node n, made on
// first use.
func (src *sealedSource) scratchOn(n *node) (*scratch, error) {
	if sc, ok := src.conns[n]; ok {
		if sc == nil {
			return nil, fmt.Errorf("node %s could not be used", n.addr)
		}
		return sc, nil
	}
	src.conns[n] = nil
	if len(n.devices) == 0 {
		return nil, fmt.Errorf("node %s has no device", n.addr)
	}
	rpc, _, err := dialNode(n.addr, src.s.m.nodeTenant(src.s.tenant), src.s.m.cfg.NodeTLS, nil)
	if err != nil {
		return nil, err
	}
	dev := n.devices[0].Index
	body, err := rpc.Call(api.OpNodeAlloc, nil, api.Encode(&api.NodeAlloc{Device: dev, Count: 1}))
	var frames api.NodeFrames
	if err == nil {
		err = api.Decode(body, &frames)
	}
	if err == nil && len(frames.Frames) != 1 {
		err = fmt.Errorf("%d frames granted for 1: %w", len(frames.Frames), api.ErrProtocol)
	}
	if err != nil {
		rpc.Close()
		return nil, fmt.Errorf("node %s: a scratch frame: %w", n.addr, err)
	}
	sc := &scratch{rpc: rpc, device: dev, frame: frames.Frames[0]}
	src.conns[n] = sc
	return sc, nil
}

// fill has the node fill the scratch frame with the contents whose SHA-256
// is sum, and reads them into p; ok is false if the node holds none.
func (sc *scratch) fill(sum [32]byte, p []byte) (ok bool, err error) {
	body, err := sc.rpc.Call(api.OpNodeDedup, nil, api.Encode(&api.NodeDedup{Device: sc.device, Hashes: [][32]byte{sum},
		Dst: []api.Extent{{Addr: sc.frame, Len: memory.FrameSize}}}))
	var reply api.NodeDedupReply
	if err == nil {
		err = api.Decode(body, &reply)
	}
	if err == nil && len(reply.Hit) != 1 {
		err = fmt.Errorf("%d answers to a dedup of 1 frame: %w", len(reply.Hit), api.ErrProtocol)
	}
	if err != nil || !reply.Hit[0] {
		return false, err
	}
	calls := make([]*wire.Call, 0, memory.FrameSize/wire.MaxChunk)
	for off := 0; off < len(p); off += wire.MaxChunk {
		k := min(wire.MaxChunk, len(p)-off)
		req := api.Encode(&api.NodeAccess{Device: sc.device, Extents: []api.Extent{{Addr: sc.frame + uint64(off), Len: uint64(k)}}})
		calls = append(calls, sc.rpc.Go(api.OpNodeRead, p[off:off+k], req))
	}
	return true, waitAll(calls)
}

// close ends the scratch connections; their nodes free the frames.
func (src *sealedSource) close() {
	for _, sc := range src.conns {
		if sc != nil {
			sc.rpc.Close()
		}
	}
}

// recordSums learns the SHA-256 of each chunk of the weight sealed at va,
// whose frames on its node are frames (in order), by reading them back,
// and records them in the space (memory.Space.SetSums), so that a restart
// of its node can restore the weight from another node's copy. Only with
// Config.WeightSums, and for a weight that fills whole chunks; its cost is
// one read of the weight. The caller holds issueMu.
func (s *session) recordSums(va uint64, dev uint32, frames []uint64) {
	if !s.m.cfg.WeightSums {
		return
	}
	a, err := s.space.AllocationAt(va)
	if err != nil || a.VA != va || va%memory.FrameSize != 0 || (a.End-va)%memory.FrameSize != 0 ||
		uint64(len(frames)) != (a.End-va)/memory.FrameSize {
		return // not whole chunks, sealed on the node whole
	}
	buf := make([]byte, memory.FrameSize)
	sums := make([][32]byte, len(frames))
	for i, f := range frames {
		if err := s.frames.Read(dev, f, buf); err != nil {
			s.log.WithError(err).Info("sums of a sealed weight not learnt; a node restart will not restore it")
			return
		}
		sums[i] = sha256.Sum256(buf)
	}
	if err := s.space.SetSums(va, sums); err != nil {
		s.log.WithError(err).Info("sums of a sealed weight not recorded")
	}
}
