// Package mediator is the per-host hypervisor of vgpu: it serves tenant
// sessions on a Unix socket and carries their work to remote nodes.
//
// It owns sessions (one per tenant connection), their streams, and the
// mapping of each session's virtual devices onto the nodes' physical
// devices. It is the only package that puts memory (address spaces), the
// wire protocol and the nodes together.
//
// Invariants:
//   - Every tenant request is validated here before any node sees it: a
//     tenant only ever names its own virtual addresses, which this package
//     translates and bounds-checks; nodes re-check physical extents.
//   - Commands of one stream take effect in order. A session's node
//     connections execute in order, so a stream pipelines freely on one node
//     and waits for its work in flight before it switches nodes.
//   - Oversubscription moves a session's memory only through the same node
//     connection its commands use: an eviction's read of a frame executes
//     after every command already sent that touches the frame, and the
//     frame's next contents are written after that read. So commands in
//     flight need no draining before a translation evicts; what must not
//     happen is a translation between another command's translation and its
//     send, which session.issueMu prevents.
//   - When a session ends, cleanly or not, all of its device memory is
//     released: its address space returns its frames and its node
//     connections close, and nodes free whatever a connection held.
//   - A bad request fails alone; the session and every other session go on.
//   - A container's registration is in the registration store (regstore.go)
//     from before it is acknowledged until before its grant returns, so a
//     mediator that restarts finds every container it had admitted, and
//     restores those still running (restore.go).
//
// Lock order: Mediator.mu, then only the leaf locks of a session (its
// parts and their order: the session type). Streams lock nothing of others.
// The registration store is never written with Mediator.mu held: its
// writes wait for the disk.
package mediator

import (
	"cmp"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/isolation"
	"github.com/vgpu/vgpu/memory"
)

// Config says which nodes a mediator uses and how it admits containers.
type Config struct {
	Nodes []string // node addresses (host:port)
	// TenantMemory caps each session on the host socket, in bytes; 0 means
	// only device memory limits them. Container sessions have their grant.
	TenantMemory uint64
	// TenantBandwidth caps the bytes per second copied by each tenant that
	// the quota file does not name (the file's bandwidth covers the rest); 0: no cap.
	TenantBandwidth uint64
	// Quota is the tenants file; "" or a missing file means one tenant,
	// "default", with no caps.
	Quota string
	// ContainerDir holds one directory per registered container, where its
	// socket is created; default /run/vgpu/containers.
	ContainerDir string
	// Oversubscribe lets each host-socket session allocate this many times
	// TenantMemory, evicting cold memory to the host (1 or 0: off). A
	// container's factor comes from its tenant in the quota file.
	Oversubscribe float64
	// HostMemory is the RAM that evicted device memory may use, divided
	// among oversubscribing containers by their bounds and lent while
	// unused (memory.HostStore); past it, evicted memory goes to a spill
	// file in StateDir.
	HostMemory uint64
	// StateDir holds the spill file and the registration store
	// (regstore.go), which lets registrations survive a restart; "" means
	// neither: evicted memory stays in RAM, and a restarted mediator has
	// forgotten every container.
	StateDir string
	// NodeTLS, when set, is the client configuration for connections to
	// nodes (mutual TLS under the cluster CA); nil means plain TCP.
	NodeTLS *tls.Config
	// NodeTimeout bounds how long a node's host may stay silent, answering
	// neither data sent to it nor keepalive probes, before its connections
	// are declared lost and the calls on them fail with api.ErrUnavailable
	// (wire.WatchPeer). A node that is busy, however long, is not silent.
	// 0 means DefaultNodeTimeout; else at least wire.MinPeerTimeout.
	NodeTimeout time.Duration
	// ReclaimInterval is how often registered containers' processes are
	// checked for having vanished without a poststop; default 1s.
	ReclaimInterval time.Duration
	// CacheMemory is the host memory for copies of shared buffers' pages,
	// split among the nodes; 0 means the default, CacheMemory.
	CacheMemory int64
	// NoDedup turns off deduplication of sealed weights (dedup.go): a
	// tenant then cannot learn whether a node holds contents it uploads.
	NoDedup bool
	// WeightSums has each weight sealed in whole 2 MiB chunks read back
	// once, at its seal, to learn the SHA-256 of its chunks, so that after
	// a restart of its node it is restored from a sealed copy another node
	// holds (noderestart.go). Off, a node restart loses sealed weights as
	// it does all else.
	WeightSums bool
	// VersionCopies has each session that exports a versioned buffer keep
	// a host copy of its latest published version, read back at the
	// export and after each publish it makes, so that after a restart of
	// its node the version is restored there under the same id and
	// grants, and importers read on (rehome.go). Off, a node restart ends
	// such objects as it does all others.
	VersionCopies bool
	// ResumeGrace is how long a session restored after a restart waits
	// for its tenant to resume it (resume.go); 0 means DefaultResumeGrace.
	ResumeGrace time.Duration
	// DropGrace is how long a node keeps the frames of a session with no
	// journal after its connection drops, for the session to reclaim them
	// once it redials (noderestart.go), if shorter than the node's
	// --reattach-grace; 0 means DefaultDropGrace. Nothing reclaims them
	// after this mediator's own restart, so it need only outlast a
	// network blip: the frames of a mediator that died count against its
	// tenants' share of the node only that long.
	DropGrace time.Duration
	// Requests, when set, is told of every reply to a tenant's or an
	// operator's request (metrics of latency and errors by operation).
	Requests wire.ReplyObserver
	Log      logrus.FieldLogger
	// Cluster, when set, is cluster mode (cluster.go): nodes come from the
	// registry in etcd rather than Nodes, and admissions reserve their
	// tenants' quota cluster-wide.
	Cluster *ClusterConfig
	// Inherited are the container sockets a predecessor passed on a live
	// upgrade (upgrade.go), listening, by path: a registration restored at
	// that path serves its socket rather than binding a new one. New closes
	// those no restored registration takes.
	Inherited map[string]net.Listener
}

// device is a physical device of some node, as the mediator places work.
type device struct {
	node     int // index into Mediator.nodes
	info     api.DeviceInfo
	sessions atomic.Int64 // virtual devices currently placed here
	// free is the device's free memory as its node last reported it to
	// the cluster; 0 outside cluster mode.
	free atomic.Uint64
}

// Mediator serves tenants.
type Mediator struct {
	cfg Config
	log logrus.FieldLogger
	// nodesMu guards nodes and devices, which only grow (in cluster mode
	// nodes join): an index into either keeps its meaning, so readers take
	// the slices (nodeList, deviceList) and use them without the lock.
	nodesMu sync.RWMutex
	nodes   []*node
	devices []*device
	// catalog is fixed by the first nodes: a node that joins later must
	// offer every kernel of it (addNode).
	catalog map[string]api.KernelInfo
	cluster *clusterState // nil outside cluster mode (cluster.go)

	admission  *isolation.Admission
	regs       *regStore         // nil without a state directory
	jr         *journal          // the session journal; nil without a state directory
	boot       string            // the kernel's boot id (bootID)
	reloadMu   sync.Mutex        // one Reload at a time
	store      *memory.HostStore // evicted device memory of every session
	hostMapped budget            // bytes of every session's host regions (hostmem.go)
	statusPace uidPaces          // unprivileged peers' status requests (statuspace.go)

	nextSession atomic.Uint64
	mu          sync.Mutex
	sessions    map[uint64]*session
	// restored are the sessions restored at start that no tenant resumed
	// yet, by the SHA-256 of their token (resume.go).
	restored   map[string]*session
	containers map[ctrKey]*container // by namespace and id
	// releasing holds the containers being released (their sessions
	// tearing down, their quota not yet returned); each channel is closed
	// once the release is done.
	releasing map[ctrKey]chan struct{}
	listeners []net.Listener
	// restoring are the containers restored by New, whose sockets are
	// served only once New has restored the sessions too, so that a tenant
	// waiting in a socket's backlog finds its session to resume. New's
	// alone, before it returns.
	restoring []*container
	conns     map[net.Conn]struct{}
	closed    bool
	stop      chan struct{} // closed by Close
	wg        sync.WaitGroup
}

// New connects to every node of cfg and learns their devices and kernels.
func New(cfg Config) (*Mediator, error) {
	if cfg.Cluster != nil {
		if err := registeredNodes(&cfg); err != nil {
			return nil, err
		}
	}
	if len(cfg.Nodes) == 0 {
		return nil, fmt.Errorf("mediator needs at least one node: %w", api.ErrInvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	if cfg.ContainerDir == "" {
		cfg.ContainerDir = DefaultContainerDir
	}
	if cfg.NodeTimeout == 0 {
		cfg.NodeTimeout = DefaultNodeTimeout
	} else if err := wire.CheckPeerTimeout(cfg.NodeTimeout); err != nil {
		return nil, fmt.Errorf("node timeout: %w", err)
	}
	if cfg.ResumeGrace == 0 {
		cfg.ResumeGrace = DefaultResumeGrace
	}
	if cfg.DropGrace == 0 {
		cfg.DropGrace = DefaultDropGrace
	} else if cfg.DropGrace < time.Millisecond {
		return nil, fmt.Errorf("drop grace %v: want at least 1ms: %w", cfg.DropGrace, api.ErrInvalidArgument)
	}
	if cfg.ReclaimInterval == 0 {
		cfg.ReclaimInterval = time.Second
	}
	quota, missing, err := loadQuota(cfg.Quota)
	if err != nil {
		return nil, err
	}
	if missing {
		cfg.Log.WithField("file", cfg.Quota).Warn("quota file not found: every namespace is admitted as tenant \"default\", without caps, until a reload finds it")
	}
	warnIfOpen(cfg.Log, quota)
	if cfg.StateDir != "" {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("state directory: %v: %w", err, api.ErrInvalidArgument)
		}
	}
	store, err := memory.NewHostStore(cfg.HostMemory, cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var regs *regStore
	var got loaded
	if cfg.StateDir == "" {
		cfg.Log.Info("no state directory: container registrations are not kept; a restarted mediator forgets every container and its reservation")
	} else if regs, got, err = openRegStore(cfg.StateDir); err != nil {
		store.Close()
		return nil, err
	}
	m := &Mediator{
		cfg: cfg, log: cfg.Log, admission: isolation.NewAdmission(quota), store: store, regs: regs, boot: bootID(),
		sessions: map[uint64]*session{}, restored: map[string]*session{}, containers: map[ctrKey]*container{}, releasing: map[ctrKey]chan struct{}{},
		conns: map[net.Conn]struct{}{}, stop: make(chan struct{}),
		hostMapped: budget{owner: "host regions of the mediator's sessions", limit: MaxHostMapped, log: cfg.Log},
	}
	for _, addr := range cfg.Nodes {
		n, catalog, err := connectNode(addr, cfg.NodeTLS, cfg.NodeTimeout)
		if err == nil {
			n.cache, err = newPageCache(m, cmp.Or(cfg.CacheMemory, CacheMemory)/int64(len(cfg.Nodes)))
		}
		if err != nil && cfg.Cluster != nil {
			// A registered node may be dying; the registry's watch
			// tries it again (cluster.go).
			m.log.WithError(err).WithField("node", addr).Warn("a registered node cannot be reached; trying it again as the registry changes")
			continue
		}
		if err != nil {
			m.closeNodes()
			store.Close()
			regs.close()
			return nil, err
		}
		if m.catalog == nil {
			m.catalog = catalog
		} else {
			m.catalog = intersect(m.catalog, catalog)
		}
		m.appendNode(n)
		m.log.WithFields(logrus.Fields{"node": addr, "devices": len(n.devices)}).Info("node connected")
	}
	if len(m.deviceList()) == 0 {
		m.closeNodes()
		store.Close()
		regs.close()
		return nil, fmt.Errorf("nodes %v export no devices: %w", cfg.Nodes, api.ErrUnavailable)
	}
	var journaled []journaled
	if cfg.StateDir != "" {
		if m.jr, journaled, err = openJournal(cfg.StateDir); err != nil {
			m.closeNodes()
			store.Close()
			regs.close()
			return nil, err
		}
	}
	if cfg.Cluster != nil {
		if err := m.joinCluster(); err != nil {
			m.closeNodes()
			store.Close()
			regs.close()
			return nil, err
		}
	}
	m.restore(got)
	m.restoreSessions(journaled)
	m.serveRestored()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.reclaimLoop()
	}()
	return m, nil
}

// intersect keeps the kernels both catalogs offer with the same signature, so
// a launch validated here runs on whichever node holds the buffers.
func intersect(a, b map[string]api.KernelInfo) map[string]api.KernelInfo {
	out := map[string]api.KernelInfo{}
	for name, k := range a {
		if o, ok := b[name]; ok && fmt.Sprint(o.Params) == fmt.Sprint(k.Params) {
			out[name] = k
		}
	}
	return out
}

func (m *Mediator) closeNodes() {
	for _, n := range m.nodeList() {
		n.close()
	}
}

// Serve accepts tenant and operator connections on l until Close.
func (m *Mediator) Serve(l net.Listener) error { return m.serve(l, nil) }

// serve accepts connections on l; through a container's socket (ctr set)
// only that container's tenant sessions.
func (m *Mediator) serve(l net.Listener, ctr *container) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("mediator closed: %w", api.ErrUnavailable)
	}
	if ctr == nil { // a container's listener is closed by its release
		m.listeners = append(m.listeners, l)
	}
	m.mu.Unlock()
	var pause time.Duration
	// refusing holds a slot for each connection refused on this socket
	// whose hello is still awaited (refuse).
	refusing := make(chan struct{}, maxRefusing)
	hs := newHandshakes(m.log.WithField("socket", l.Addr().String()))
	for {
		nc, err := l.Accept()
		if err != nil {
			m.mu.Lock()
			closed := m.closed
			m.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of descriptors (EMFILE), say: whoever used them up, this
			// socket must serve again once they are back, so wait and
			// retry rather than give the socket up.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			m.log.WithError(err).WithField("socket", l.Addr().String()).Warnf("accept failed; retrying in %v", pause)
			select {
			case <-time.After(pause):
				continue
			case <-m.stop:
				return nil
			}
		}
		pause = 0
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			nc.Close()
			return nil
		}
		m.conns[nc] = struct{}{}
		m.wg.Add(1)
		m.mu.Unlock()
		greeted, closed := func() {}, func() {}
		if ctr != nil {
			if err := ctr.track(nc); err != nil {
				m.refuse(nc, err, refusing)
				continue
			}
		} else if g, c, ok := hs.admit(nc); ok {
			greeted, closed = g, c
		} else {
			m.forget(nc)
			continue
		}
		go func() {
			defer m.forget(nc)
			defer closed()
			m.serveConn(nc, ctr, greeted)
			if ctr != nil {
				ctr.untrack(nc)
			}
		}()
	}
}

// maxRefusing bounds the refused connections of one container's socket
// whose hello is awaited at once.
const maxRefusing = 4

// refuse closes a connection that its container's socket cannot take. While
// fewer than maxRefusing others of the socket are being refused, it first
// answers the connection's hello with err, waiting a second at most; past
// that, or for a released container, it closes the connection at once. So
// a tenant that connects in a loop holds at most MaxContainerConns +
// maxRefusing of the mediator's descriptors, not one more per attempt.
// slots is the socket's count of refusals in progress.
func (m *Mediator) refuse(nc net.Conn, err error, slots chan struct{}) {
	if !errors.Is(err, errReleased) {
		select {
		case slots <- struct{}{}:
			go func() {
				defer func() { <-slots }()
				defer m.forget(nc)
				m.log.WithError(err).Warn("connection refused")
				c := wire.NewConn(nc)
				if h, _, herr := api.ReadHello(c, time.Now().Add(time.Second), "mediator"); herr == nil || h.Op != 0 {
					_ = c.ReplyError(h, err)
				}
			}()
			return
		default:
		}
	}
	m.forget(nc)
}

// forget closes a connection that serve accepted, once done with it.
func (m *Mediator) forget(nc net.Conn) {
	nc.Close()
	m.mu.Lock()
	delete(m.conns, nc)
	m.mu.Unlock()
	m.wg.Done()
}

// Close stops accepting, ends every session (releasing its memory) and
// disconnects from the nodes. Registrations stay recorded: their
// containers still run, and the next mediator restores them.
func (m *Mediator) Close() error { return m.close(nil) }

// close is Close; with pass set, it leaves each container's socket bound
// at its path and puts a descriptor of it in pass, by path, for a
// successor (HandoverSockets).
func (m *Mediator) close(pass map[string]*os.File) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.stop)
	for _, l := range m.listeners {
		l.Close()
	}
	for _, c := range m.containers {
		if pass == nil || !c.passSocket(pass, m.log) {
			c.closeSocket()
		}
	}
	for c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.endRestored()
	m.leaveCluster()
	m.closeNodes()
	forgetLimiters(m)
	return errors.Join(m.store.Close(), m.regs.close())
}

// Status reports nodes, devices and tenant sessions. Nodes are asked at
// once, so one that cannot be reached delays the report by statusTimeout at
// most and the others' parts not at all.
func (m *Mediator) Status() api.Status {
	hs := m.store.Stats()
	nodes := m.nodeList()
	st := api.Status{HostRAM: hs.RAM, HostSpilled: hs.Spilled, Nodes: make([]api.NodeStatus, len(nodes))}
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { st.Nodes[i] = n.status() })
	}
	wg.Go(func() { st.Cluster = m.clusterStatus() })
	wg.Wait()
	m.mu.Lock()
	sessions := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		sessions = append(sessions, s)
	}
	for _, s := range m.restored { // their store files hold their evicted chunks already
		st.HostSpilled += s.storedBytes()
	}
	m.mu.Unlock()
	for _, s := range sessions {
		st.Tenants = append(st.Tenants, s.status())
		st.HostSpilled += s.storedBytes() // evicted chunks in store files are on disk as the spill file's are
	}
	sort.Slice(st.Tenants, func(i, j int) bool { return st.Tenants[i].Session < st.Tenants[j].Session })
	st.Containers = m.containerStatus()
	return st
}

func (m *Mediator) statusJSON() ([]byte, error) {
	b, err := json.Marshal(m.Status())
	if err != nil {
		return nil, fmt.Errorf("encode status: %v: %w", err, api.ErrInternal)
	}
	return b, nil
}

// place chooses n distinct physical devices for a new session, least used
// first, and counts them as used. Devices of nodes whose connection is up
// come before those of nodes that are down, so that a session admitted
// because a reachable node can serve it (canServe) is placed there; of
// equally used ones, those with the most free memory as their nodes last
// reported it to the cluster (cluster mode) come first. Nodes that left
// the cluster get nothing.
func (m *Mediator) place(n int) ([]*device, error) {
	nodes, devices := m.nodeList(), m.usableDevices()
	if n > len(devices) {
		return nil, fmt.Errorf("%d virtual devices asked, %d physical devices exist: %w", n, len(devices), api.ErrInvalidArgument)
	}
	up := make([]bool, len(nodes))
	for i, nd := range nodes {
		up[i] = nd.up()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	order := append([]*device(nil), devices...)
	sort.SliceStable(order, func(i, j int) bool {
		if a, b := up[order[i].node], up[order[j].node]; a != b {
			return a
		}
		if a, b := order[i].sessions.Load(), order[j].sessions.Load(); a != b {
			return a < b
		}
		return order[i].free.Load() > order[j].free.Load()
	})
	order = order[:n]
	for _, d := range order {
		d.sessions.Add(1)
	}
	return order, nil
}

func (m *Mediator) unplace(devs []*device) {
	for _, d := range devs {
		d.sessions.Add(-1)
	}
}
