package mediator

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// HandshakeTimeout bounds how long a new connection may take to say Hello.
const HandshakeTimeout = 10 * time.Second

// Limits on what one session may hold.
const (
	MaxDevices = 16 // virtual devices per session
	MaxStreams = 64 // streams per session, the default one included
)

// vdev is one of a session's virtual devices: a physical device and the
// session's own connection to the node that has it.
type vdev struct {
	dev *device
	rpc *wire.RPC
}

// session is one tenant connection. It is made of parts that each guard
// their own state:
//
//   - its identity and connections, the fields below: fixed by
//     openSession before the session serves anyone (c, of a session a
//     restart restored, by resume, before it serves), so read without a
//     lock — but for a vdev's connection, which the session's reader
//     replaces after its node restarted (noderestart.go), under issueMu
//     with the streams idle and under nodes.mu, under which links reads
//     them;
//   - sessionMemory (sessionmem.go): its address space, frame source,
//     budget and credits, behind issueMu;
//   - streams, regions, graphs and shares (sessionparts.go): collections
//     by id, each behind its own mutex; tgraphs, touched by the session's
//     reader alone; nodes (noderestart.go), the node connections redialled
//     and not yet installed, behind its own mutex;
//   - resumeState: its journal and token, set before it serves anyone;
//   - sessionFlow and sessionCounters: flow control and statistics, made
//     of channels and atomics.
//
// The parts with a lock that every path reads (sessionMemory) or none
// (the other embedded ones) are embedded, so their fields read as the
// session's; a collection is a named field reached through its methods.
//
// Lock order: issueMu, then at most one of streams.mu, regions.mu,
// graphs.mu and shares.mu, then sessionLog.mu (jr); budget.mu,
// frameSource.mu and nodes.mu are leaves, as are memory.Space's own locks
// (held only within its calls, which issueMu encloses) — but for allocMu
// over sessionLog.mu: a residency record is written under it, and a
// compaction (journalcompact.go) writes the snapshot inside
// Space.Snapshot. No part's lock is
// held while issueMu or another part's lock is taken, nor across a node
// call or a wait for a stream: the collections' methods (sessionparts.go)
// take only their own. Mediator.mu is held over none of them but the
// leaves (tenants reads space statistics and budgets under it).
// container.mu is taken under issueMu only to list the container's
// sessions (reclaim), and a sibling's issueMu is then only tried
// (TryLock), never waited for.
type session struct {
	m      *Mediator
	id     uint64
	tenant string
	c      *wire.Conn
	log    logrus.FieldLogger
	vdevs  []vdev
	ctr    *container // the container whose socket the session came through; nil on the host socket
	// readRoom is the body of a small CopyFromDevice request; the reader's.
	readRoom [32]byte

	sessionMemory
	resumeState
	sessionFlow
	sessionCounters

	streams streamSet      // and the allocations freed with them
	regions regionSet      // host regions (hostmem.go)
	graphs  graphSet       // graph.go
	tgraphs tensorGraphSet // tensorgraph.go
	shares  shareSet       // exported and imported buffers (shared.go)
	// nodes watches the node connections and redials a node whose
	// connection broke (noderestart.go).
	nodes nodeRedial
}

// resumeState is what lets a session survive a restart (resume.go): jr
// journals the session (nil: not journaled); token is the secret that
// resumes it, tokenHash its SHA-256 as the journal keeps it; resumable says
// the tenant's hello can take a token; expiry ends a restored session its
// tenant does not resume in time. All are set before the session serves
// anyone (journalSession, rebuild, restoreSessions, and resume, which
// hands the session over through Mediator.mu), and only read after; jr
// orders its records by its own lock.
type resumeState struct {
	jr        *sessionLog
	token     string
	tokenHash string
	resumable bool
	expiry    *time.Timer
}

// sessionFlow is what bounds and ends a session's work (limits.go,
// ratelimit.go): channels and atomics, safe without a lock.
type sessionFlow struct {
	bw      *limiter      // the tenant's bandwidth bucket (ratelimit.go)
	ending  chan struct{} // closed by end
	endOnce sync.Once
	gone    atomic.Bool // the tenant reads no more replies: queued work is skipped
	// inBufs and outBufs count the bulk buffers (bodyPool) the session
	// holds: request bodies read and not yet sent on, and replies of copies
	// from the device not yet written (limits.go).
	inBufs, outBufs chan struct{}
	// inflight counts the decoded commands accepted and not yet answered,
	// at most maxSessionInflight (limits.go).
	inflight bound
}

// end marks the session as ending, which cuts short waits for bandwidth;
// gone says the tenant can no longer be answered, so its queued commands
// fail without being issued.
func (f *sessionFlow) end(gone bool) {
	if gone {
		f.gone.Store(true)
	}
	f.endOnce.Do(func() { close(f.ending) })
}

// sessionCounters are a session's statistics (api.SessionStats), counted
// atomically by the streams that do the work.
type sessionCounters struct {
	copiedIn, copiedOut, launches atomic.Uint64
	dedupHits, dedupBytes         atomic.Uint64
	sharedHits, sharedMisses      atomic.Uint64
}

// newSession admits a tenant connection. Through a container's socket the
// tenant is the one the operator gave the container, whatever the hello
// says; a hello naming another is refused. On the host socket the hello
// names the tenant, which the quota file must let the peer act as
// (admitHost).
func (m *Mediator) newSession(c *wire.Conn, hello *api.Hello, ctr *container) (*session, error) {
	tenant, n := hello.Tenant, int(hello.Devices)
	if ctr != nil {
		if tenant != "" && tenant != ctr.grant.Tenant {
			return nil, fmt.Errorf("container %v belongs to tenant %q and may not act as %q: %w",
				ctr.key(), ctr.grant.Tenant, tenant, api.ErrPermissionDenied)
		}
		tenant = ctr.grant.Tenant
		if n == 0 {
			n = int(ctr.grant.Devices)
		}
		if n > int(ctr.grant.Devices) {
			return nil, fmt.Errorf("%d virtual devices asked, container %v was granted %d: %w",
				n, ctr.key(), ctr.grant.Devices, api.ErrPermissionDenied)
		}
	}
	if _, err := vocab.ParseTenant(tenant); err != nil {
		return nil, err
	}
	if ctr == nil {
		if err := m.admitHost(c.NetConn(), tenant); err != nil {
			return nil, err
		}
	}
	if n == 0 {
		n = 1
	}
	if n > MaxDevices {
		return nil, fmt.Errorf("%d virtual devices asked, at most %d: %w", n, MaxDevices, api.ErrInvalidArgument)
	}
	devs, err := m.place(n)
	if err != nil {
		return nil, err
	}
	rpcs := map[int]*wire.RPC{}
	for _, d := range devs {
		if rpcs[d.node] == nil {
			rpc, _, err := dialNode(m.node(d.node).addr, m.nodeTenant(tenant), m.cfg.NodeTLS, m.node(d.node).cache.push)
			if err != nil {
				for _, r := range rpcs {
					r.Close()
				}
				m.unplace(devs)
				return nil, err
			}
			rpcs[d.node] = rpc
		}
	}
	s := m.openSession(m.nextSession.Add(1), tenant, c, ctr, devs, rpcs)
	m.addSession(s)
	m.journalSession(s, hello)
	return s, nil
}

// openSession makes session id of tenant on the placed devices devs, whose
// nodes it reaches through rpcs (by node), for connection c, which came
// through ctr's socket (nil: the host socket). c is nil for a session a
// restart restores, until its tenant resumes it.
func (m *Mediator) openSession(id uint64, tenant string, c *wire.Conn, ctr *container, devs []*device, rpcs map[int]*wire.RPC) *session {
	s := &session{
		m: m, id: id, tenant: tenant, c: c,
		streams: newStreamSet(), regions: regionSet{byID: map[uint32]*hostRegion{}},
		graphs: graphSet{byID: map[uint32][]command{}}, tgraphs: tensorGraphSet{byID: map[uint32]*tensorGraph{}},
		shares: shareSet{extra: map[int]*wire.RPC{}}, sessionMemory: sessionMemory{credits: map[uint64]uint64{}},
		sessionFlow: sessionFlow{inflight: bound{limit: maxSessionInflight}},
	}
	s.log = m.log.WithFields(logrus.Fields{"tenant": s.tenant, "session": s.id})
	for _, d := range devs {
		s.vdevs = append(s.vdevs, vdev{dev: d, rpc: rpcs[d.node]})
	}
	s.frames = newFrameSource(s)
	s.space = memory.NewSpace(s.frames, 0)
	resident, factor := m.cfg.TenantMemory, m.cfg.Oversubscribe
	s.budget = &budget{owner: fmt.Sprintf("session %d of tenant %q", s.id, s.tenant), limit: virtual(resident, factor), log: s.log,
		cluster: m.clusterCharge(s.tenant)}
	if ctr != nil {
		s.ctr, s.budget, resident, factor = ctr, ctr.budget, ctr.grant.Memory, ctr.oversubscribe
		s.frameCredit = frameCredit(ctr.dedupCharge)
	}
	if factor > 1 {
		s.space.Oversubscribe(m.evictionStore(s, ctr, c == nil), resident)
		s.evicts = true
	}
	s.ending, s.bw = make(chan struct{}), m.limiter(s.tenant)
	s.inBufs, s.outBufs = make(chan struct{}, MaxSessionBuffers), make(chan struct{}, MaxSessionBuffers)
	s.streams.byID[api.DefaultStream] = s.newStream(api.DefaultStream)
	return s
}

// virtual is the memory a session may allocate when it may keep resident
// bytes on devices and oversubscribe by factor (0: no limit).
func virtual(resident uint64, factor float64) uint64 {
	if factor <= 1 || resident == 0 {
		return resident
	}
	if v := float64(resident) * factor; v < math.MaxUint64 {
		return uint64(v)
	}
	return math.MaxUint64
}

// nodeTenant is how a session's node connections present its tenant: the
// quota file's weight and compute cap, with the mediator's NodeTimeout. A
// node shares device time by tenant, so a container's own compute request
// (at most its tenant's, isolation.Admit) does not change it: that would
// set the weight of all its tenant's containers.
func (m *Mediator) nodeTenant(tenant string) nodeTenant {
	t := nodeTenant{name: tenant, weight: 1, timeout: m.cfg.NodeTimeout}
	if q := m.admission.Limits(tenant); q != nil {
		t.weight, t.computeMax = max(q.Compute, 1), float32(q.ComputeMax)
	}
	return t
}

// run answers the hello, serves requests until the tenant goes, then
// releases everything the session held.
func (s *session) run(hello wire.Header) {
	reply := api.HelloReply{Version: api.Version, Session: s.id, Resumable: s.resumable, Token: s.token}
	for i, v := range s.vdevs {
		// A virtual device has the memory the session may use, not the
		// physical device's: a container granted 1 GiB sees 1 GiB, as
		// nvidia-smi shows a partition's own size.
		mem := v.dev.info.Memory
		if s.budget.limit != 0 {
			mem = min(mem, s.budget.limit)
		}
		reply.Devices = append(reply.Devices, api.DeviceInfo{
			Index: uint32(i), Name: v.dev.info.Name, Node: s.m.node(v.dev.node).addr, Memory: mem,
		})
	}
	s.log.WithField("devices", len(s.vdevs)).Info("session opened")
	err := s.c.Reply(hello, api.Encode(&reply))
	if err == nil {
		err = s.readLoop()
	}
	s.teardown()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		s.log.WithError(err).Info("session dropped")
	} else {
		s.log.Info("session closed")
	}
}

func (s *session) teardown() {
	s.endJournal() // first: a mediator that dies while it tears down restores nothing of it
	if s.ctr != nil {
		s.ctr.mu.Lock()
		delete(s.ctr.sessions, s)
		s.ctr.mu.Unlock()
	}
	s.end(false) // ends bandwidth waits: stopping a stream never waits on one
	for _, st := range s.streams.takeAll() {
		st.stop()
	}
	s.unmapAll()
	// The nodes forget the tensor graphs with the connections closed
	// below, and the arenas go with the space.
	clear(s.tgraphs.byID)
	s.releaseAll()
	if err := s.space.Close(); err != nil {
		s.log.WithError(err).Info("returning frames failed; the nodes free them when the connection closes")
	}
	s.closeStore()
	closed := map[*wire.RPC]bool{}
	s.shares.closeConns()
	for _, v := range s.vdevs {
		if !closed[v.rpc] {
			v.rpc.Close()
			closed[v.rpc] = true
		}
	}
	devs := make([]*device, len(s.vdevs))
	for i, v := range s.vdevs {
		devs[i] = v.dev
	}
	s.m.unplace(devs)
	s.m.mu.Lock()
	delete(s.m.sessions, s.id)
	s.m.mu.Unlock()
	s.bw.release()
}

func (s *session) status() api.TenantStatus {
	st := s.space.Stats()
	var ctr, ns string
	if s.ctr != nil {
		ctr, ns = s.ctr.grant.Container, s.ctr.grant.Namespace
	}
	return api.TenantStatus{
		Tenant: s.tenant, Container: ctr, Namespace: ns, Session: s.id, Devices: len(s.vdevs),
		Allocations: st.Allocations, Allocated: st.Allocated, Mapped: st.Mapped,
		Mapped4K: st.Mapped4K, Mapped64K: st.Mapped64K, Mapped2M: st.Mapped2M,
		Resident: st.Resident, Evicted: st.Evicted, Lost: st.Lost,
		TLBHitRate: hitRate(st.TLBHits, st.TLBMisses),
		CopiedIn:   s.copiedIn.Load(), CopiedOut: s.copiedOut.Load(), Launches: s.launches.Load(),
		SharedHits: s.sharedHits.Load(), SharedMisses: s.sharedMisses.Load(), Links: s.links(),
		DeviceMemory: s.deviceMemory(),
	}
}

// deviceMemory reports the memory of the frames the session holds on each
// physical device behind its virtual devices.
func (s *session) deviceMemory() []api.DeviceMemory {
	held := s.frames.byDevice()
	out := make([]api.DeviceMemory, len(s.vdevs))
	for i := range s.vdevs {
		d := s.vdevs[i].dev // not the connection, which the reader may replace
		out[i] = api.DeviceMemory{Node: s.m.node(d.node).addr, Device: d.info.Index, Held: held[uint32(i)]}
	}
	return out
}

// links reports the bytes moved over the session's socket and over its
// connections to each node its devices are on, one entry a node.
func (s *session) links() []api.LinkStatus {
	var out []api.LinkStatus
	if s.c != nil { // a session with no tenant connection has no socket link
		sent, recv := s.c.Counts()
		out = append(out, api.LinkStatus{Peer: "socket", Sent: sent, Received: recv})
	}
	seen := map[*wire.RPC]bool{}
	at := map[int]int{} // node → its entry in out
	// The session's reader may replace a connection (noderestart.go).
	s.nodes.mu.Lock()
	vdevs := append([]vdev(nil), s.vdevs...)
	s.nodes.mu.Unlock()
	for _, v := range vdevs {
		if seen[v.rpc] {
			continue
		}
		seen[v.rpc] = true
		i, ok := at[v.dev.node]
		if !ok {
			i = len(out)
			at[v.dev.node] = i
			out = append(out, api.LinkStatus{Peer: "node " + s.m.node(v.dev.node).addr})
		}
		sent, recv := v.rpc.Counts()
		out[i].Sent += sent
		out[i].Received += recv
	}
	return out
}

// cheap says whether cmd moves no bulk data and never waits for bandwidth
// or a node, so the session's reader may issue it itself.
func (s *session) cheap(cmd *command) bool {
	const small = 64 << 10
	if s.shares.count() > 0 {
		return false // a copy of a shared buffer waits for its node
	}
	switch cmd.op {
	case api.OpCopyToDevice:
		return len(cmd.toDev.Payload) <= small && s.m.bandwidth(s.tenant) == 0
	case api.OpCopyFromDevice:
		return cmd.fromDev.Len <= small && s.m.bandwidth(s.tenant) == 0
	case api.OpCopyToDeviceHost, api.OpCopyFromDeviceHost:
		return cmd.host.Len <= small && s.m.bandwidth(s.tenant) == 0
	case api.OpMemset, api.OpLaunch:
		return true
	case api.OpBatch, api.OpGraphLaunch:
		for i := range cmd.subs {
			if !s.cheap(&cmd.subs[i]) {
				return false
			}
		}
		return true
	}
	return false
}

// stats reports the session's counters, network bytes summed over its node
// connections.
func (s *session) stats() *api.SessionStats {
	st := &api.SessionStats{
		CopiedIn: s.copiedIn.Load(), CopiedOut: s.copiedOut.Load(), Launches: s.launches.Load(),
		DedupHits: s.dedupHits.Load(), DedupBytes: s.dedupBytes.Load(),
		SharedHits: s.sharedHits.Load(), SharedMisses: s.sharedMisses.Load(),
	}
	st.SocketOut, st.SocketIn = s.c.Counts()
	seen := map[*wire.RPC]bool{}
	for _, v := range s.vdevs {
		if !seen[v.rpc] {
			seen[v.rpc] = true
			out, in := v.rpc.Counts()
			st.NetOut += out
			st.NetIn += in
		}
	}
	return st
}

func hitRate(hits, misses uint64) float64 {
	if hits+misses == 0 {
		return 0
	}
	return float64(hits) / float64(hits+misses)
}

// bodyPool recycles buffers for bulk bodies and replies.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, wire.MaxBody); return &b }}

// smallOut is the largest reply payload taken from smallPool rather than
// bodyPool: a pool loses its buffers at every garbage collection, and
// remaking a MaxBody buffer for a 4-byte copy costs more than the copy.
const smallOut = 4 << 10

var smallPool = sync.Pool{New: func() any { b := make([]byte, smallOut); return &b }}

// getOut returns a buffer for a reply payload of n bytes; putOut returns it.
func getOut(n uint64) *[]byte {
	if n <= smallOut {
		return smallPool.Get().(*[]byte)
	}
	return bodyPool.Get().(*[]byte)
}

func putOut(b *[]byte) {
	if cap(*b) < wire.MaxBody {
		smallPool.Put(b)
		return
	}
	bodyPool.Put(b)
}

func (s *session) readLoop() error {
	for {
		h, err := s.c.ReadHeader()
		if err != nil {
			return err
		}
		if h.Flags&wire.FlagReply != 0 {
			return fmt.Errorf("tenant sent a reply (%v, id %d): %w", h.Op, h.ID, api.ErrProtocol)
		}
		var pool *[]byte
		var body []byte
		if h.Len > 4096 {
			if err := s.takeBuffer(s.inBufs); err != nil {
				return err
			}
			pool = bodyPool.Get().(*[]byte)
			body = (*pool)[:h.Len]
		} else if h.Op == api.OpCopyFromDevice && h.Len <= uint32(len(s.readRoom)) {
			// A small read's request: its fields are decoded into its
			// command and its body kept by nobody, so one buffer serves
			// them all (#25).
			body = s.readRoom[:h.Len]
		} else {
			body = make([]byte, h.Len)
		}
		if err := s.c.ReadBody(body); err != nil {
			return err
		}
		if s.nodes.ready.Load() { // a node restarted: its new connection first
			s.installRedialled()
		}
		queued, err := s.handle(h, body, pool)
		if !queued && pool != nil {
			s.putIn(pool)
		}
		s.compactJournal() // a load of a flag, unless the journal is due
		s.regraceGivenUp() // likewise, unless the journal was given up
		if errors.Is(err, errHungUp) {
			return err
		}
		if err != nil {
			if werr := s.c.ReplyError(h, err); werr != nil {
				return werr
			}
			s.log.WithError(err).WithField("op", h.Op).Debug("request refused")
		}
	}
}

// handle executes a control request, or queues a stream command (then
// queued is true and the stream owns pool). A returned error has not been
// replied to.
func (s *session) handle(h wire.Header, body []byte, pool *[]byte) (queued bool, err error) {
	switch h.Op {
	case api.OpKernels:
		return false, s.c.Reply(h, s.m.catalogBody())
	case api.OpMalloc:
		va, err := s.malloc(body)
		if err != nil {
			return false, err
		}
		return false, s.c.Reply(h, api.Encode(&api.MallocReply{Addr: va}))
	case api.OpSeal:
		if err := s.seal(body); err != nil {
			return false, err
		}
		return false, s.c.Reply(h)
	case api.OpHostRegister:
		id, err := s.registerHost(body)
		if err != nil {
			return false, err
		}
		return false, s.c.Reply(h, api.Encode(&api.HostRegion{Region: id}))
	case api.OpHostUnregister:
		if err := s.unregisterHost(body); err != nil {
			return false, err
		}
		return false, s.c.Reply(h)
	case api.OpGraphCreate:
		id, err := s.createGraph(body)
		if err != nil {
			return false, err
		}
		return false, s.c.Reply(h, api.Encode(&api.Graph{Graph: id}))
	case api.OpGraphDestroy:
		if err := s.destroyGraph(body); err != nil {
			return false, err
		}
		return false, s.c.Reply(h)
	case api.OpGraphRegister:
		id, err := s.registerGraph(body)
		if err != nil {
			return false, err
		}
		return false, s.c.Reply(h, api.Encode(&api.Graph{Graph: id}))
	case api.OpGraphInvoke:
		return false, s.invokeGraph(h, body)
	case api.OpGraphRelease:
		if err := s.releaseGraph(body); err != nil {
			return false, err
		}
		return false, s.c.Reply(h)
	case api.OpSessionStats:
		return false, s.c.Reply(h, api.Encode(s.stats()))
	case api.OpExport:
		sh, err := s.export(body)
		if err != nil {
			return false, err
		}
		return false, s.c.Reply(h, api.Encode(sh))
	case api.OpImport:
		ir, err := s.importShared(body)
		if err != nil {
			return false, err
		}
		return false, s.c.Reply(h, api.Encode(ir))
	case api.OpRevoke:
		if err := s.revoke(body); err != nil {
			return false, err
		}
		return false, s.c.Reply(h)
	case api.OpPublish, api.OpPin:
		v, err := s.versionOp(h.Op, body)
		if err != nil {
			return false, err
		}
		return false, s.c.Reply(h, api.Encode(&api.BufVersion{Version: v}))
	case api.OpFree:
		var m api.Free
		if err := api.Decode(body, &m); err != nil {
			return false, err
		}
		s.drainAll() // like cudaFree: work already queued may still use the buffer
		if ok, err := s.unshare(m.Addr, true); ok {
			if err != nil {
				s.log.WithError(err).Info("unpinning a freed import failed; the node forgets the pin when the connection ends")
			}
			return false, s.c.Reply(h) // an import: the exporter's memory stays
		}
		if err := s.freeShared(m.Addr); err != nil {
			return false, err
		}
		s.streams.forget(m.Addr)
		return false, s.c.Reply(h)
	case api.OpStreamCreate:
		id, err := s.streams.create(s.newStream)
		if err != nil {
			return false, err
		}
		s.jr.add(journalOp{Op: opStream, Stream: id})
		return false, s.c.Reply(h, api.Encode(&api.StreamReq{Stream: id}))
	case api.OpStreamDestroy:
		var m api.StreamReq
		if err := api.Decode(body, &m); err != nil {
			return false, err
		}
		if err := s.destroyStream(m.Stream); err != nil {
			return false, err
		}
		return false, s.c.Reply(h)
	case api.OpCopyToDevice, api.OpCopyFromDevice, api.OpCopyDevice, api.OpMemset, api.OpLaunch, api.OpSynchronize,
		api.OpCopyToDeviceHost, api.OpCopyFromDeviceHost, api.OpBatch, api.OpGraphLaunch:
		cmd, err := s.decodeCommand(h, body)
		if err != nil {
			return false, err
		}
		st, err := s.streams.get(cmd.stream)
		if err != nil {
			return false, err
		}
		// A stream with nothing queued runs a command that moves no bulk
		// data here, without a hand-off to its executor. Order holds: only
		// this goroutine queues, so nothing queued means the executor has
		// issued everything before.
		cmd.pool = pool
		n := cmd.weight()
		if err := s.admit(n); err != nil {
			return false, err
		}
		if st.queued.Load() == 0 && s.cheap(&cmd) {
			st.run(&cmd)
			return true, nil
		}
		st.queued.Add(1)
		if err := s.enqueue(st, cmd); err != nil {
			st.queued.Add(-1)
			s.answered(n)
			return false, err
		}
		return true, nil
	case api.OpStatus:
		return false, fmt.Errorf("status is for operators: %w", api.ErrPermissionDenied)
	}
	return false, fmt.Errorf("unknown operation %v: %w", h.Op, api.ErrProtocol)
}

func (s *session) destroyStream(id uint32) error {
	if id == api.DefaultStream {
		return fmt.Errorf("the default stream cannot be destroyed: %w", api.ErrInvalidArgument)
	}
	st, owned := s.streams.remove(id)
	if st == nil {
		return fmt.Errorf("stream %d does not exist: %w", id, api.ErrInvalidArgument)
	}
	// Journaled first: the frees of its buffers below are journaled after.
	s.jr.add(journalOp{Op: opUnstream, Stream: id})
	st.stop()
	if len(owned) > 0 {
		s.drainAll() // other streams may still use them, as for a free
	}
	var errs []error
	for _, va := range owned {
		if err := s.freeShared(va); err != nil && !errors.Is(err, api.ErrInvalidAddress) { // freed by the tenant already
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// freeShared frees the allocation at va, first ending the object it was
// exported as, if any: the object's frames may outlive the allocation (a
// small one shares its chunk), and the importers must lose it with it.
func (s *session) freeShared(va uint64) error {
	if err := s.checkUnheld("free", va, true); err != nil {
		return err
	}
	if _, err := s.unshare(va, false); err != nil {
		s.log.WithError(err).Info("ending a shared object failed; it ends with its frames")
	}
	return s.free(va)
}

// drainAll waits until every stream has completed the work queued so far.
func (s *session) drainAll() {
	for _, st := range s.streams.list() {
		if !st.idle() {
			st.drain()
		}
	}
}
