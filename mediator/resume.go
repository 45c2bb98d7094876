package mediator

// Sessions that survive a mediator restart. A tenant whose hello is
// Resumable (the Go SDK's) gets a session token in its hello reply; its
// session's node connections attach to their nodes with secrets of their
// own (accelerator/reattach.go), and its header and every change to its
// address space go to the session journal (journal.go) before they are
// answered. When the mediator dies, the nodes keep the frames of those
// connections for their reattach grace. A mediator started again on the
// same state directory rebuilds each journaled session — reclaiming its
// frames from the nodes, replaying its allocations, frees and seals
// through the same placement code, and checking that the frames the
// replayed space maps are exactly those the nodes kept — and waits
// ResumeGrace for its tenant to come back with the token (Hello.Resume).
//
// What a restored session has: its virtual devices, its allocations at the
// same addresses with their bytes, hints, seals and dedup credits, its
// streams, its graphs and tensor graphs under the same ids (each decoded
// and checked again from the request the journal kept; a tensor graph
// with the same arena, its launches registered anew with its node once
// the replayed space is reconciled, since the node forgot them with the
// dropped connection), and its container's accounting. What it loses: its
// host regions (HostAlloc memory: the tenant registers them again), with
// them the graphs that copy to or from host memory (their ids stay taken,
// and a launch fails unavailable saying why), and queued work that was
// not answered. An oversubscribing session has its evicted chunks too, in
// a store file of its own that its journal's residency records index
// (residency.go). Its shared buffers are restored too (resumeshared.go).
// A session that oversubscribes with no store file (it could not be
// made) is not restored: the log says so, and its frames are freed.
//
// Invariants:
//   - A session is restored whole or not at all: any check that fails
//     (a record, a node's reclaim, an address or frame the replay does not
//     reproduce, a graph that no longer checks or registers) drops it, frees what the nodes kept of it and deletes its
//     journal; a tenant resuming it is told it is gone (api.ErrUnavailable).
//   - A restored session is in Mediator.restored, not Mediator.sessions,
//     until its tenant resumes it: nothing serves it before. It ends
//     there when its ResumeGrace passes, or when its container is
//     released (releaseIf), before the container's quota returns.

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// DefaultResumeGrace is how long a restored session waits for its tenant
// (Config.ResumeGrace).
const DefaultResumeGrace = time.Minute

// secret is n random bytes in hex.
func secret(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("session token: %v: %w", err, api.ErrInternal)
	}
	return hex.EncodeToString(b), nil
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// journalSession makes new session s resumable, as its hello asks, where
// the mediator keeps a journal: its node connections attach, and its
// header is journaled. A session that cannot be journaled is served all
// the same, with no token: it will not survive a restart. Its node
// connections attach all the same, asking their nodes to keep their
// frames only Config.DropGrace after a drop, so that a drop while this
// mediator lives loses nothing (noderestart.go).
func (m *Mediator) journalSession(s *session, hello *api.Hello) {
	s.resumable = hello.Resumable
	if hello.Resumable && m.jr != nil && m.journal(s) {
		return
	}
	s.attachForDrops()
}

// attachForDrops attaches the session's node connections (again) asking
// their nodes for Config.DropGrace, for a session without a journal: a
// drop while this mediator lives loses nothing, and a mediator that dies
// leaves their frames parked no longer than that, since no restart can
// reclaim them. An attach again replaces the token and grace.
func (s *session) attachForDrops() {
	conns, err := s.attachConns(s.m.cfg.DropGrace)
	if err != nil {
		s.log.WithError(err).Warn("node connections not attached: a drop of one will lose the session's memory there")
		return
	}
	s.nodes.attach(s.m, conns, s.m.cfg.DropGrace)
}

// regraceGivenUp attaches the node connections of a session whose journal
// was given up since (sessionLog.fail: past its bound, unwritable, or its
// memory lost on a restarted node) again under Config.DropGrace: they
// were attached under their nodes' full reattach grace for a restart to
// reclaim, which can no longer happen. The session's reader calls it
// between requests; it takes issueMu, under which the connections are
// read.
func (s *session) regraceGivenUp() {
	if s.jr == nil || !s.jr.gaveUp.CompareAndSwap(true, false) {
		return
	}
	s.issueMu.Lock()
	defer s.issueMu.Unlock()
	s.attachForDrops()
}

// journal journals new session s, its node connections attached under
// their nodes' own reattach grace, reporting whether it could.
func (m *Mediator) journal(s *session) bool {
	if s.evicts && s.durable == nil {
		s.log.Info("session not journaled: its evicted memory lives in this process, so it cannot survive a mediator restart")
		return false
	}
	rec := sessionRecord{ID: s.id, Tenant: s.tenant, Opened: time.Now().UTC()}
	if s.ctr != nil {
		rec.Namespace, rec.Container = s.ctr.grant.Namespace, s.ctr.grant.Container
	}
	for _, v := range s.vdevs {
		rec.Devices = append(rec.Devices, journalDevice{Node: m.node(v.dev.node).addr, Index: v.dev.info.Index})
	}
	conns, err := s.attachConns(0)
	if err != nil {
		s.log.WithError(err).Warn("session not journaled: its node connection could not attach; it will not survive a mediator restart")
		return false
	}
	rec.Conns = conns
	token, err := secret(32)
	var jr *sessionLog
	if err == nil {
		rec.TokenHash = tokenHash(token)
		jr, err = m.jr.begin(rec, s.log)
	}
	if err != nil {
		s.log.WithError(err).Error("session not journaled; it will not survive a mediator restart")
		return false
	}
	s.jr, s.token, s.tokenHash = jr, token, rec.TokenHash
	s.nodes.attach(m, rec.Conns, 0)
	return true
}

// attachConns attaches each of the session's node connections under a new
// token, asking its node for grace (0: the node's own), and returns them.
// An attach again replaces a connection's token and grace.
func (s *session) attachConns(grace time.Duration) ([]journalConn, error) {
	seen := map[*wire.RPC]bool{}
	var conns []journalConn
	for _, v := range s.vdevs {
		if seen[v.rpc] {
			continue
		}
		seen[v.rpc] = true
		c, _, err := attach(v.rpc, s.m.node(v.dev.node).addr, 0, "", grace)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// attach records conns, the session's attached node connections, for a
// reclaim after one drops (noderestart.go), and grace, what they asked
// their nodes for (0: the nodes' own), which a reclaim asks again.
func (r *nodeRedial) attach(m *Mediator, conns []journalConn, grace time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attached, r.grace = map[int]journalConn{}, grace
	for _, c := range conns {
		if i := m.nodeAt(c.Node); i >= 0 {
			r.attached[i] = c
		}
	}
}

// attach attaches a node connection: with owner 0 under a new token, which
// it returns with the owner id the node gave; otherwise it reclaims the
// frames kept for owner under token, and returns them by device. The
// reclaimed connection goes on as owner, under token: what the journal
// records of it stays true. A restore and a live session whose node
// connection dropped (reclaimDropped) reclaim through it. grace, if not 0,
// asks the node to keep the connection's frames at most that long after a
// drop (Config.DropGrace).
func attach(rpc *wire.RPC, addr string, owner uint64, token string, grace time.Duration) (journalConn, []api.NodeFrames, error) {
	c := journalConn{Node: addr, Owner: owner, Token: token}
	if owner == 0 {
		var err error
		if c.Token, err = secret(16); err != nil {
			return c, nil, err
		}
	}
	m := api.NodeAttach{Owner: owner, Token: c.Token}
	if grace > 0 {
		m.HasGrace, m.GraceMillis = true, uint32(min(max(grace.Milliseconds(), 1), math.MaxUint32))
	}
	body, err := rpc.Call(api.OpNodeAttach, nil, api.Encode(&m))
	var r api.NodeAttached
	if err == nil {
		err = api.Decode(body, &r)
	}
	if err != nil {
		return c, nil, fmt.Errorf("node %s: attach: %w", addr, err)
	}
	c.Owner = r.Owner
	return c, r.Devices, nil
}

// restoreSessions rebuilds the sessions the journal held, oldest first,
// and drops, from the journal too, those it cannot, logging why. It runs
// in New, after the registrations are restored and before any session
// opens.
func (m *Mediator) restoreSessions(got []journaled) {
	if n := maxID(got); n > m.nextSession.Load() {
		m.nextSession.Store(n) // new sessions take none of the journaled ids
	}
	restored := 0
	for _, j := range got {
		log := m.log.WithFields(logrus.Fields{"session": j.id, "tenant": j.rec.Tenant, "container": j.rec.Container})
		var s *session
		err := j.err
		if err == nil {
			s, err = m.rebuild(j, log)
		}
		if err != nil {
			if j.err != nil {
				log.WithError(err).WithField("dir", m.jr.dir).Error("session journal: a record failed its checks; the session is dropped, the others restored")
			} else {
				log.WithError(err).Warn("session not restored; its journal is deleted and what the nodes kept of it freed")
			}
			if err := m.jr.drop(j.id); err != nil {
				log.WithError(err).Error("deleting the session's journal failed")
			}
			continue
		}
		restored++
		st := s.space.Stats()
		log.WithFields(logrus.Fields{"allocations": st.Allocations, "allocated": st.Allocated}).Info("session restored; waiting for its tenant")
		m.mu.Lock()
		m.restored[s.tokenHash] = s
		m.mu.Unlock()
		s.expiry = time.AfterFunc(m.cfg.ResumeGrace, func() { m.expireRestored(s) })
	}
	if len(got) > 0 {
		m.log.WithFields(logrus.Fields{"restored": restored, "dropped": len(got) - restored}).Info("sessions restored")
	}
}

// expireRestored ends restored session s if its tenant has not resumed it.
func (m *Mediator) expireRestored(s *session) {
	m.mu.Lock()
	h := s.tokenHash
	if m.restored[h] != s {
		m.mu.Unlock()
		return
	}
	delete(m.restored, h)
	m.mu.Unlock()
	s.log.WithField("grace", m.cfg.ResumeGrace.String()).Info("restored session not resumed in time: its memory is freed")
	s.teardown()
}

// errNoSessionToResume answers a resume whose token names no restored
// session.
var errNoSessionToResume = fmt.Errorf("no session to resume with that token: it ended, or this mediator could not restore it (its log says why): %w", api.ErrUnavailable)

// resume hands restored session of the token hello presents to connection
// c, which came through ctr's socket (nil: the host socket).
func (m *Mediator) resume(c *wire.Conn, hello *api.Hello, ctr *container) (*session, error) {
	h := tokenHash(hello.Resume)
	m.mu.Lock()
	s := m.restored[h]
	var err error
	switch {
	case s == nil:
		err = errNoSessionToResume
	case s.ctr != ctr:
		err = fmt.Errorf("session %d was opened through another socket: %w", s.id, api.ErrPermissionDenied)
	case hello.Tenant != "" && hello.Tenant != s.tenant:
		err = fmt.Errorf("session %d is of tenant %q, not %q: %w", s.id, s.tenant, hello.Tenant, api.ErrPermissionDenied)
	}
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if ctr == nil {
		if err := m.admitHost(c.NetConn(), s.tenant); err != nil {
			return nil, err
		}
	}
	// From restored to sessions in one step, so that Tenants never misses
	// its memory; an expiry or a resume with the same token that came first
	// leaves nothing to take.
	m.mu.Lock()
	if m.restored[h] != s {
		m.mu.Unlock()
		return nil, errNoSessionToResume
	}
	delete(m.restored, h)
	s.c, s.resumable, s.token = c, true, hello.Resume
	m.sessions[s.id] = s
	m.mu.Unlock()
	s.expiry.Stop() // if it fires now, it finds the session gone from restored
	m.addSession(s)
	s.log.Info("session resumed by its tenant")
	return s, nil
}

// addSession lists s among the sessions served, and its container's.
func (m *Mediator) addSession(s *session) {
	m.mu.Lock()
	m.sessions[s.id] = s
	m.mu.Unlock()
	if s.ctr != nil {
		s.ctr.mu.Lock()
		s.ctr.sessions[s] = struct{}{}
		s.ctr.mu.Unlock()
	}
	s.watchNodes() // a node restart takes memory, not the session (noderestart.go)
}

// endRestored ends the restored sessions no tenant resumed; Close calls it.
func (m *Mediator) endRestored() {
	m.mu.Lock()
	rs := m.restored
	m.restored = map[string]*session{}
	m.mu.Unlock()
	for _, s := range rs {
		s.expiry.Stop()
		s.teardown()
	}
}

// replay is the frame source of a session being rebuilt: it hands out the
// frames its journal says each allocation got, and takes back frees
// without telling the nodes; at the end, the frames the replayed space
// holds must be frames the nodes kept, and those they kept beyond it are
// freed (reconcile).
type replay struct {
	kept   []map[uint64]bool // by virtual device: the frames its node kept of its device
	grants [][]uint64        // of the operation being replayed, in order
	shares replayedShares    // its exports and imports (resumeshared.go)
}

func (r *replay) grant(dev uint32, n int) ([]uint64, error) {
	if len(r.grants) == 0 {
		return nil, fmt.Errorf("replay asked for %d frames of device %d the journal does not record: %w", n, dev, api.ErrInternal)
	}
	g := r.grants[0]
	r.grants = r.grants[1:]
	if len(g) != n {
		return nil, fmt.Errorf("replay asked for %d frames of device %d, the journal records a grant of %d: %w", n, dev, len(g), api.ErrInternal)
	}
	// A frame granted then is not checked against those the node kept
	// now: a later free in the journal may have returned it. What the
	// replayed space holds at the end is (reconcile).
	return g, nil
}

// rebuild restores journaled session j, or fails leaving nothing of it.
func (m *Mediator) rebuild(j journaled, log logrus.FieldLogger) (*session, error) {
	for _, op := range j.ops {
		if op.Op == opShared {
			return nil, fmt.Errorf("an earlier mediator journaled that it exported or imported a shared buffer, without what restores it")
		}
	}
	var ctr *container
	if j.rec.Container != "" {
		m.mu.Lock()
		ctr = m.containers[ctrKey{j.rec.Namespace, j.rec.Container}]
		m.mu.Unlock()
		if ctr == nil {
			return nil, fmt.Errorf("its container %s/%s has no registration now", j.rec.Namespace, j.rec.Container)
		}
		if ctr.grant.Tenant != j.rec.Tenant {
			return nil, fmt.Errorf("its container is of tenant %q now, not %q", ctr.grant.Tenant, j.rec.Tenant)
		}
	}
	devs := make([]*device, 0, len(j.rec.Devices))
	for _, jd := range j.rec.Devices {
		i := m.deviceAt(jd.Node, jd.Index)
		if i < 0 {
			return nil, fmt.Errorf("its device %d of node %s is not one this mediator uses", jd.Index, jd.Node)
		}
		devs = append(devs, m.deviceList()[i])
	}
	// Reclaim the frames each node connection kept.
	rpcs := map[int]*wire.RPC{}
	kept := map[int][]api.NodeFrames{} // by node: the frames kept, by device
	var err error
	for _, jc := range j.rec.Conns {
		ni := m.nodeAt(jc.Node)
		if ni < 0 || rpcs[ni] != nil {
			err = fmt.Errorf("its connection to node %s: not a node of this mediator, or a second one", jc.Node)
			break
		}
		var rpc *wire.RPC
		rpc, _, err = dialNode(jc.Node, m.nodeTenant(j.rec.Tenant), m.cfg.NodeTLS, m.node(ni).cache.push)
		if err != nil {
			break
		}
		rpcs[ni] = rpc
		var frames []api.NodeFrames
		if _, frames, err = attach(rpc, jc.Node, jc.Owner, jc.Token, 0); err != nil {
			err = fmt.Errorf("reclaiming its frames: %w", err)
			break
		}
		// From here the frames are this connection's, which goes on
		// under the same owner id and token.
		kept[ni] = frames
	}
	if err == nil {
		for _, d := range devs {
			if rpcs[d.node] == nil {
				err = fmt.Errorf("no connection to node %s of its device %d", m.node(d.node).addr, d.info.Index)
			}
		}
	}
	freeKept := func() {
		for ni, ds := range kept {
			for _, d := range ds {
				if len(d.Frames) > 0 {
					if _, err := rpcs[ni].Call(api.OpNodeFree, nil, api.Encode(&d)); err != nil {
						log.WithError(err).WithField("node", m.node(ni).addr).Warn("freeing the frames of a session not restored failed; the node frees them when the connection closes")
					}
				}
			}
		}
	}
	closeAll := func() {
		for _, rpc := range rpcs {
			rpc.Close()
		}
	}
	if err != nil {
		freeKept()
		closeAll()
		return nil, err
	}
	m.mu.Lock()
	for _, d := range devs {
		d.sessions.Add(1)
	}
	m.mu.Unlock()
	s := m.openSession(j.id, j.rec.Tenant, nil, ctr, devs, rpcs)
	if s.evicts && s.durable == nil {
		err = fmt.Errorf("it oversubscribes now, with no store file of evicted memory from before")
	}
	r := &replay{kept: make([]map[uint64]bool, len(s.vdevs))}
	for i, v := range s.vdevs {
		r.kept[i] = keptOn(v.dev, kept[v.dev.node])
	}
	s.frames.replay = r
	if err == nil {
		err = s.replay(j.ops, r)
	}
	if err == nil && s.durable != nil {
		err = s.durable.Verify() // the evicted chunks' contents, before anything reads them
	}
	if err == nil {
		err = s.reconcile(r)
	}
	if err == nil {
		err = s.registerRestored()
	}
	if err == nil {
		err = s.restoreShares(&r.shares)
	}
	if err != nil {
		// The replayed space's frees go to the replay, not the nodes:
		// every frame the nodes kept is freed here, once, then the
		// session ends as any other.
		freeKept()
		s.teardown()
		return nil, err
	}
	s.frames.replay = nil
	// The node connections keep their tokens (a reclaimed connection
	// parks under the token it presented), and the session its token and
	// journal, which goes on from its last record.
	if s.jr, err = m.jr.reopen(j, s.log); err != nil {
		s.teardown()
		return nil, err
	}
	s.tokenHash = j.rec.TokenHash
	s.nodes.attach(m, j.rec.Conns, 0)
	return s, nil
}

// keptOn is the set of frames of dev among kept, frames a node gave back by
// device.
func keptOn(dev *device, kept []api.NodeFrames) map[uint64]bool {
	set := map[uint64]bool{}
	for _, d := range kept {
		if d.Device == dev.info.Index {
			for _, f := range d.Frames {
				set[f] = true
			}
		}
	}
	return set
}

// deviceAt is the index in m.deviceList() of device index of node addr,
// or -1.
func (m *Mediator) deviceAt(addr string, index uint32) int {
	for i, d := range m.deviceList() {
		if m.node(d.node).addr == addr && d.info.Index == index {
			return i
		}
	}
	return -1
}

// nodeAt is the index in m.nodeList() of the node at addr, or -1.
func (m *Mediator) nodeAt(addr string) int {
	for i, n := range m.nodeList() {
		if n.addr == addr {
			return i
		}
	}
	return -1
}

// replay applies journaled operations to s, a session being rebuilt,
// whose frame source is r.
func (s *session) replay(ops []journalOp, r *replay) error {
	for i, op := range ops {
		if err := s.replayOne(op, r); err != nil {
			return fmt.Errorf("journal record %d (%s at %#x): %w", i+1, op.Op, op.VA, err)
		}
	}
	return nil
}

func (s *session) replayOne(op journalOp, r *replay) error {
	switch op.Op {
	case opAlloc:
		if int(op.Dev) >= len(s.vdevs) {
			return fmt.Errorf("device %d: the session has %d: %w", op.Dev, len(s.vdevs), api.ErrInvalidArgument)
		}
		foot, err := memory.Footprint(op.Size)
		if err != nil {
			return err
		}
		if err := s.budget.reserve(foot); err != nil {
			return err
		}
		r.grants = op.Grants
		va, err := s.space.AllocHint(op.Dev, op.Size, api.Hint(op.Hint))
		unused := len(r.grants)
		r.grants = nil
		if err != nil {
			s.budget.release(foot)
			return err
		}
		if va != op.VA || unused > 0 {
			return fmt.Errorf("replayed at %#x with %d recorded grants unused: the journal does not rebuild this space: %w", va, unused, api.ErrInternal)
		}
	case opFree:
		if err := s.free(op.VA); err != nil {
			return err
		}
		s.streams.forget(op.VA)
	case opSeal:
		return s.space.Seal(op.VA)
	case opFrames:
		return s.space.RestoreFrameSeal(op.VA, op.Size)
	case opCredit:
		if s.space.CheckStart("credit", op.VA) != nil || s.credits[op.VA] != 0 {
			return fmt.Errorf("credit %d for no allocation, or a second one: %w", op.Credit, api.ErrInternal)
		}
		s.credit(op.VA, op.Credit)
	case opStream:
		return s.streams.recreate(op.Stream, s.newStream)
	case opUnstream:
		if op.Stream == api.DefaultStream {
			return fmt.Errorf("stream %d destroyed but not live: %w", op.Stream, api.ErrInternal)
		}
		st, _ := s.streams.remove(op.Stream)
		if st == nil {
			return fmt.Errorf("stream %d destroyed but not live: %w", op.Stream, api.ErrInternal)
		}
		st.stop()
	case opWith:
		s.streams.freeWith(op.Stream, op.VA)
	case opGraph:
		return s.replayGraph(op)
	case opUngraph:
		return s.graphs.remove(op.Graph)
	case opTGraph:
		return s.restoreTensorGraph(op)
	case opUntgraph:
		g := s.tgraphs.byID[op.Graph]
		if g == nil {
			return fmt.Errorf("tensor graph %d released but not live: %w", op.Graph, api.ErrInternal)
		}
		s.tgraphs.remove(g) // its launches never went to the node (registerRestored)
	case opEvict, opResident:
		return s.replayResidency(op, r)
	case opExport, opUnexport, opRevoke, opImport, opUnimport:
		return s.replayShared(op, r)
	case opLayout:
		return s.replayLayout(op, r)
	default:
		return fmt.Errorf("unknown operation %q: %w", op.Op, api.ErrInternal)
	}
	return nil
}

// reconcile checks that the frames the space holds are frames the nodes
// kept for it, and frees those they kept beyond: frames granted for an
// allocation the mediator died before journaling, or kept by a free it
// journaled but had not sent (or, for a live session's dropped
// connection, a grant or free in flight at the drop). Only the virtual
// devices r.kept has a set for are checked.
func (s *session) reconcile(r *replay) error {
	held := s.frames.heldFrames()
	for i, v := range s.vdevs {
		if r.kept[i] == nil {
			continue
		}
		for f := range held[uint32(i)] {
			if !r.kept[i][f] {
				return fmt.Errorf("frame %#x of device %d is mapped by the replayed space but its node did not keep it: %w", f, i, api.ErrUnavailable)
			}
		}
		var extra []uint64
		for f := range r.kept[i] {
			if !held[uint32(i)][f] {
				extra = append(extra, f)
			}
		}
		if len(extra) == 0 {
			continue
		}
		slices.Sort(extra)
		if _, err := v.rpc.Call(api.OpNodeFree, nil, api.Encode(&api.NodeFrames{Device: v.dev.info.Index, Frames: extra})); err != nil {
			return fmt.Errorf("freeing %d frames the journal does not map: %w", len(extra), err)
		}
		s.log.WithField("frames", len(extra)).Info("reclaim freed frames the node kept that no allocation maps (granted or freed as the connection dropped)")
		for _, f := range extra {
			delete(r.kept[i], f)
		}
	}
	return nil
}

// heldFrames is the frames f holds, by virtual device.
func (f *frameSource) heldFrames() map[uint32]map[uint64]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[uint32]map[uint64]bool{}
	for df := range f.held {
		if out[df.dev] == nil {
			out[df.dev] = map[uint64]bool{}
		}
		out[df.dev][df.frame] = true
	}
	return out
}

// Handover stops the mediator for a next one that starts on the same
// state directory — an upgrade: as Close, except that the journaled
// sessions are not ended. Their journals stay, and their node connections
// close before anything is freed, so the nodes keep their frames for the
// next mediator to restore (as after a crash, but with every tenant
// connection closed first, so that nothing is answered that the journal
// does not hold). Their tenants reconnect to the next one.
func (m *Mediator) Handover() error {
	if m.jr != nil {
		m.jr.handover.Store(true)
	}
	return m.Close()
}

// endJournal ends the session's journal as the session ends: deleted,
// unless the mediator hands over (Handover); then it is kept, and the
// node connections close at once, so the nodes keep the frames that the
// rest of the teardown would free.
func (s *session) endJournal() {
	if s.jr == nil {
		return
	}
	if !s.m.jr.handover.Load() {
		s.jr.end()
		return
	}
	s.jr.close()
	for _, v := range s.vdevs {
		v.rpc.Close()
	}
}
