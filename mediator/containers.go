package mediator

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/isolation"
	"github.com/vgpu/vgpu/memory"
)

// DefaultContainerDir is where containers' socket directories live: one
// directory per containerd namespace, one per container id in it
// (vocab.HostSocketDir).
const DefaultContainerDir = vocab.DefaultContainerDir

// SocketName is the name of a container's socket in its directory, which
// the runtime mounts at vocab.InContainerSocketDir in the container.
const SocketName = vocab.SocketName

// ctrKey names a registered container: two containers of one id in two
// namespaces are two containers.
type ctrKey struct{ namespace, id string }

func (k ctrKey) String() string {
	if k.namespace == "" {
		return k.id
	}
	return fmt.Sprintf("%s (namespace %s)", k.id, k.namespace)
}

// container is a registered container: its grant, its own socket, and the
// connections that came through it.
type container struct {
	grant  isolation.Grant
	proc   process // its init process
	socket string
	// dir is the socket's directory, held open from registration to
	// closeSocket: the socket is unlinked through it, and the directory
	// told apart from any put at its path since.
	dir *os.File
	// ownDir: the mediator made dir (a registration without a runtime),
	// so closeSocket removes it. A runtime's directory is the runtime's
	// to remove (its poststop hook), as the runtime may already have made
	// it again, and mounted it, for the container's next start.
	ownDir   bool
	listener net.Listener
	budget   *budget // grant.Memory × oversubscribe, shared by its sessions
	// oversubscribe is the tenant's factor when the container registered;
	// each session keeps at most grant.Memory resident.
	oversubscribe float64
	// resident counts the frames its sessions hold, so that together they
	// keep at most residentFrames on devices (frameSource.Grant,
	// reserveResident).
	resident *budget
	// store holds its sessions' evicted chunks, if it oversubscribes: a
	// bounded view of the mediator's host store, with a share of its RAM
	// until the container is released.
	store *memory.BoundedStore
	// dedupCharge is the tenant's dedup_charge when the container
	// registered: the share of a frame its budget is charged for a sealed
	// weight frame stored once (dedup.go).
	dedupCharge float64
	hostMapped  budget // bytes of its sessions' host regions (hostmem.go)
	selfPace    pace   // spaces its answers to OpSelf (self.go)

	mu       sync.Mutex
	sessions map[*session]struct{} // open, for reserveResident
	conns    map[net.Conn]struct{}
	live     sync.WaitGroup // connections tracked and not yet torn down
	released bool
}

func (c *container) key() ctrKey { return ctrKey{c.grant.Namespace, c.grant.Container} }

// fragmentSlack is the frames a container that does not oversubscribe
// may hold beyond twice its grant (residentFrames).
const fragmentSlack = 16

// residentFrames is how many frames the sessions of a container granted
// grant bytes hold together at most. Oversubscribing, that is the grant in
// whole frames, at least one, as each session's own cap
// (memory.Space.Oversubscribe): colder chunks go to host memory. Without
// oversubscription nothing can be evicted, but the frames are bounded all
// the same: the budget counts bytes allocated, in whole 4 KiB pages, and
// an allocation of 2 MiB or more takes whole chunks, so allocations may
// hold up to twice their bytes in frames, and each pool (device and hint)
// of each session a chunk partly filled; a tenant that spreads small
// allocations over many pools and sessions would otherwise hold a frame
// for every page it is charged, and leave other tenants' devices full.
// Past the bound a grant fails with out-of-memory.
func residentFrames(grant uint64, oversubscribe float64) uint64 {
	if oversubscribe > 1 {
		return max(1, grant/memory.FrameSize)
	}
	return fragmentedFrames(grant)
}

// fragmentedFrames is the most frames allocations of n bytes need, spread
// over pools: twice n in frames, plus fragmentSlack.
func fragmentedFrames(n uint64) uint64 {
	frames := n / memory.FrameSize // rounded up below, without overflow
	if n%memory.FrameSize != 0 {
		frames++
	}
	return 2*frames + fragmentSlack // at most 2^44 + 16
}

// frameBytes is n frames in bytes, or the most a uint64 holds if more.
func frameBytes(n uint64) uint64 {
	if n > math.MaxUint64/memory.FrameSize {
		return math.MaxUint64
	}
	return n * memory.FrameSize
}

// reclaimTries bounds how often reserveResident goes round the other
// sessions, reclaimPause apart, while some are busy issuing.
const (
	reclaimTries = 20
	reclaimPause = time.Millisecond
)

// reserveResident reserves n frames of the container's resident memory for
// session s. Where its other sessions hold it all, it first evicts their
// coldest chunks, as one device's memory is shared by its processes' pages.
// A sibling amid issuing (its issueMu held) is not waited for, since it may
// itself be waiting here for s: it is tried again a few times, and if the
// memory is still held, the grant fails with out-of-memory.
func (c *container) reserveResident(s *session, n int) error {
	bytes := uint64(n) * memory.FrameSize
	err := c.resident.reserve(bytes)
	for try := 0; err != nil && c.store != nil && try < reclaimTries; try++ { // without a store, nothing evicts
		if try > 0 {
			time.Sleep(reclaimPause)
		}
		busy := c.reclaim(s, n)
		if err = c.resident.reserve(bytes); err != nil && !busy {
			break // nobody was busy: trying again changes nothing
		}
	}
	if err != nil {
		return fmt.Errorf("%v: %w", err, api.ErrOutOfMemory)
	}
	return nil
}

// reclaim evicts the coldest chunks of the container's sessions other than
// s, those holding the most first, until n frames are free, and reports
// whether it passed over a session that was busy issuing.
func (c *container) reclaim(s *session, n int) (busy bool) {
	c.mu.Lock()
	others := make([]*session, 0, len(c.sessions))
	for o := range c.sessions {
		if o != s {
			others = append(others, o)
		}
	}
	c.mu.Unlock()
	slices.SortFunc(others, func(a, b *session) int {
		return cmp.Compare(b.space.Stats().Frames, a.space.Stats().Frames)
	})
	for _, o := range others {
		short := n - int((c.resident.limit-c.resident.inUse())/memory.FrameSize)
		if short <= 0 {
			return false
		}
		if !o.issueMu.TryLock() {
			busy = true
			continue
		}
		_, err := o.space.Shrink(short)
		o.issueMu.Unlock()
		if err != nil {
			o.log.WithError(err).Info("evicting for another session of the container failed")
		}
	}
	return busy
}

// closeSocket stops accepting on the container's socket, unlinks it and
// lets go of its directory, removing it if the mediator made it and it is
// still the one at its path. Its sessions go on: they no longer need
// either.
func (c *container) closeSocket() {
	c.listener.Close()
	// Bound through /proc/self/fd, so the listener cannot unlink it (listenIn).
	unix.Unlinkat(int(c.dir.Fd()), SocketName, 0)
	if c.ownDir {
		path := filepath.Dir(c.socket)
		held, err1 := c.dir.Stat()
		now, err2 := os.Lstat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, now) {
			os.Remove(path) // empty unless someone else put something there
		}
	}
	c.dir.Close()
}

// MaxContainerConns bounds the connections open on a container's socket:
// each holds a descriptor and may hold a session, so without a bound one
// container could use up what the mediator serves everyone with.
const MaxContainerConns = 64

// errReleased is track's answer for a container released while a
// connection was being accepted.
var errReleased = errors.New("container released")

// track counts nc as one of the container's connections, unless the
// container was released or has MaxContainerConns open.
func (c *container) track(nc net.Conn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return errReleased
	}
	if len(c.conns) >= MaxContainerConns {
		return fmt.Errorf("container %v has %d connections open, the limit: %w", c.key(), len(c.conns), api.ErrQuotaExceeded)
	}
	c.conns[nc] = struct{}{}
	c.live.Add(1)
	return nil
}

// untrack is called once a connection's session has been torn down.
func (c *container) untrack(nc net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.conns[nc]; ok {
		delete(c.conns, nc)
		c.live.Done()
	}
}

// releaseWait bounds how long a release waits for the container's sessions
// to free their memory before it returns the container's quota anyway.
const releaseWait = 10 * time.Second

// close stops the socket, ends every session of the container and waits
// (up to releaseWait) until their teardown has freed their memory, so the
// quota returned afterwards is really free.
func (c *container) close() bool {
	c.mu.Lock()
	c.released = true
	conns := make([]net.Conn, 0, len(c.conns))
	for nc := range c.conns {
		conns = append(conns, nc)
	}
	c.mu.Unlock()
	c.closeSocket()
	for _, nc := range conns {
		nc.Close()
	}
	if c.store != nil {
		// Its sessions' entries are dropped as they end; its share of the
		// host's RAM goes to those still registered now.
		defer c.store.Close()
	}
	done := make(chan struct{})
	go func() {
		c.live.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(releaseWait):
		return false
	}
}

// loadQuota reads the quota file at start. A missing file is the built-in
// default (one tenant without caps, which every namespace maps to), so
// that a fresh install runs; missing reports it, for a warning.
func loadQuota(path string) (cfg *isolation.Config, missing bool, err error) {
	if path == "" {
		return isolation.Default(), false, nil
	}
	cfg, err = isolation.Load(path)
	if errors.Is(err, os.ErrNotExist) {
		return isolation.Default(), true, nil
	}
	return cfg, false, err
}

// Reload re-reads the quota file. An invalid file changes nothing; grants
// already made stay, new admissions see the new limits. A missing file is
// an error too, not the built-in default (one tenant without caps, which
// every namespace maps to): a file caught mid-replacement, or deleted by
// mistake, must not lift every limit.
func (m *Mediator) Reload() error {
	// Read and install as one, so that of two reloads at once the later
	// file is the one left in force.
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	if m.quotasFromEtcd() {
		return fmt.Errorf("reload: in cluster mode the quotas come from etcd, reloaded on every change; vgpuctl tenants apply FILE stores a new file: %w", api.ErrInvalidArgument)
	}
	cfg, err := isolation.Default(), error(nil)
	if m.cfg.Quota != "" {
		cfg, err = isolation.Load(m.cfg.Quota)
	}
	if err != nil {
		return fmt.Errorf("reload: keeping the current quotas: %w", err)
	}
	m.admission.SetConfig(cfg)
	m.log.WithField("file", m.cfg.Quota).Info("quotas reloaded")
	warnIfOpen(m.log, cfg)
	return nil
}

// Register admits a container being created: it decides its tenant, checks
// the tenant's quota and opens the container's own socket. A container is
// named by its containerd namespace and id together; an empty namespace
// (plain runc, without one) is a namespace of its own, whose containers'
// directories are in vocab.NoNamespace.
func (m *Mediator) Register(r api.Register) (*api.RegisterReply, error) {
	if _, err := vocab.ParseContainerID(r.Container); err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	if err := vocab.ValidNamespace(r.Namespace); err != nil {
		return nil, fmt.Errorf("register %s: %w", r.Container, err)
	}
	k := ctrKey{r.Namespace, r.Container}
	dir := vocab.HostSocketDir(m.cfg.ContainerDir, r.Namespace, r.Container)
	if r.SocketDir != "" && filepath.Clean(r.SocketDir) != dir {
		return nil, fmt.Errorf("register %v: socket directory %q: this container's socket lives in %s: %w", k, r.SocketDir, dir, api.ErrInvalidArgument)
	}
	if int(r.Devices) > len(m.deviceList()) {
		return nil, fmt.Errorf("register %v: %d devices asked, %d exist: %w", k, r.Devices, len(m.deviceList()), api.ErrInvalidArgument)
	}
	if reply := m.repeated(k, r); reply != nil {
		return reply, nil
	}
	if err := m.awaitRelease(k); err != nil {
		return nil, fmt.Errorf("register %v: %w", k, err)
	}
	if err := m.canServe(max(int(r.Devices), 1)); err != nil {
		return nil, fmt.Errorf("register %v: %w", k, err)
	}
	// One step, so that the tenant, its limits at admission and those the
	// container keeps come from one quota file even while a reload runs.
	grant, tenant, err := m.admission.Admit(isolation.Request{
		Namespace: r.Namespace, Container: r.Container, Tenant: r.Tenant, Memory: r.Memory, Compute: r.Compute, Devices: max(r.Devices, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("register %v: %w", k, err)
	}
	// Cluster-wide after locally: the local checks cost no round trip.
	if err := m.reserveCluster(grant, tenant); err != nil {
		m.admission.Release(r.Namespace, r.Container)
		return nil, fmt.Errorf("register %v: %w", k, err)
	}
	// Recorded before the container is opened, so before any release of
	// it can delete the record (regstore.go's order of records).
	proc := processOf(int(r.Pid))
	if err := m.regs.put(newRegistration(grant, tenant, proc, m.boot, dir, r.SocketDir != "")); err != nil {
		m.releaseGrant(r.Namespace, r.Container)
		return nil, fmt.Errorf("register %v: %w", k, err)
	}
	ctr, err := m.openContainer(grant, tenant, dir, r.SocketDir != "", proc, false)
	if err != nil {
		if err := m.regs.remove(k); err != nil {
			m.log.WithError(err).Error("a failed registration's record stays; the next start drops it if its container is gone")
		}
		m.releaseGrant(r.Namespace, r.Container)
		return nil, fmt.Errorf("register %v: %w", k, err)
	}
	m.log.WithFields(map[string]any{"container": r.Container, "namespace": r.Namespace, "tenant": grant.Tenant, "memory": grant.Memory}).Info("container registered")
	return &api.RegisterReply{Tenant: grant.Tenant, Memory: grant.Memory, Socket: ctr.socket}, nil
}

// repeated answers a registration that repeats one this mediator holds —
// the same container, its same init process, nothing asked otherwise — as
// the first was answered. A runtime hook repeats its registration when its
// connection was lost before the answer (an upgrade's handover closes
// connections): the first may or may not have been made, and the
// container's start must not fail either way. nil: not a repeat.
func (m *Mediator) repeated(k ctrKey, r api.Register) *api.RegisterReply {
	if r.Pid == 0 {
		return nil
	}
	m.mu.Lock()
	c := m.containers[k]
	m.mu.Unlock()
	if c == nil || c.proc.start == 0 || c.proc != processOf(int(r.Pid)) {
		return nil
	}
	g := c.grant
	if r.Tenant != "" && r.Tenant != g.Tenant || r.Memory != 0 && r.Memory != g.Memory ||
		r.Compute != 0 && r.Compute != g.Compute || max(r.Devices, 1) != g.Devices {
		return nil
	}
	m.log.WithFields(map[string]any{"container": r.Container, "namespace": r.Namespace}).Info("registration repeated: answered as the first")
	return &api.RegisterReply{Tenant: g.Tenant, Memory: g.Memory, Socket: c.socket}
}

// registerWait bounds how long a registration waits for the release of a
// container of the same key. It is well below the deadline of the hook
// that asks (runtimehook.HookDeadline, 8 s): a registration that outlived
// its hook would admit a container whose start has failed. A release may
// take longer (its sessions' teardown, up to releaseWait); the
// registration then fails, saying so, and the container's start with it.
const registerWait = 5 * time.Second

// awaitRelease waits until no container of key k is being released, so
// that a container registered again right after its release (a restarted
// Docker container keeps its id) finds its quota returned rather than
// "already admitted".
func (m *Mediator) awaitRelease(k ctrKey) error {
	m.mu.Lock()
	done := m.releasing[k]
	m.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-time.After(registerWait):
		return fmt.Errorf("the release of its previous registration is still in progress after %v: %w", registerWait, api.ErrUnavailable)
	}
}

// openDir opens directory name in parent, making it first if mk, and
// reports whether it made it. It follows no symlink, which could steer a
// socket elsewhere: the directory must be a plain one.
func openDir(parent *os.File, name string, mk bool) (d *os.File, made bool, err error) {
	path := filepath.Join(parent.Name(), name)
	if mk {
		err := unix.Mkdirat(int(parent.Fd()), name, 0o755)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, false, fmt.Errorf("socket directory %s: %v: %w", path, err, api.ErrInternal)
		}
		made = err == nil
	}
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) && !mk {
		return nil, false, fmt.Errorf("socket directory %s is missing; the runtime makes it, and mounts it in the container, before it registers the container: %w",
			path, api.ErrInvalidArgument)
	}
	if err != nil {
		return nil, false, fmt.Errorf("socket directory %s: %v: %w", path, err, api.ErrInvalidArgument)
	}
	return os.NewFile(uintptr(fd), path), made, nil
}

// listenIn listens on a socket named name in directory d. It binds through
// /proc/self/fd, so the socket's full path may be longer than a socket
// address holds (108 bytes): a namespace and a 64-character id below the
// container directory can pass it. The listener does not unlink the socket
// when closed; its owner unlinks it through d.
func listenIn(d *os.File, name string) (net.Listener, error) {
	l, err := daemon.ListenUnix(fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name), 0o666, -1) // container processes may run as any user
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false) // its name is not the socket's path
	return l, nil
}

// openContainer opens the socket of a container admitted with grant g under
// tenant t's limits, which it keeps as they are now. dir is its socket
// directory, below its namespace's. A runtime's registration (byRuntime)
// uses the directory the runtime made and mounted at the container's
// /run/vgpu: one made here in its place would not be the container's, so a
// missing one is an error. Without a runtime, the mediator makes it; a
// registration restored from an earlier mediator process (restored) made
// it then, so its directory is the mediator's to remove all the same.
func (m *Mediator) openContainer(g isolation.Grant, t *isolation.Tenant, dir string, byRuntime bool, proc process, restored bool) (*container, error) {
	if err := os.MkdirAll(m.cfg.ContainerDir, 0o755); err != nil {
		return nil, fmt.Errorf("container directory: %v: %w", err, api.ErrInternal)
	}
	top, err := os.Open(m.cfg.ContainerDir) // the operator's: trusted
	if err != nil {
		return nil, fmt.Errorf("container directory: %v: %w", err, api.ErrInternal)
	}
	defer top.Close()
	ns, _, err := openDir(top, filepath.Base(filepath.Dir(dir)), true) // shared by the namespace's containers: it stays
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	d, made, err := openDir(ns, filepath.Base(dir), !byRuntime)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, SocketName)
	l, ok := m.inherited(sock, restored)
	if !ok {
		l, err = listenIn(d, SocketName)
	}
	if err != nil {
		if made {
			os.Remove(dir)
		}
		d.Close()
		return nil, fmt.Errorf("container socket %s: %v: %w", sock, err, api.ErrInternal)
	}
	k := ctrKey{g.Namespace, g.Container}
	ctr := &container{
		grant: g, proc: proc, socket: sock, dir: d, ownDir: made || restored && !byRuntime, listener: l, conns: map[net.Conn]struct{}{}, sessions: map[*session]struct{}{},
		oversubscribe: t.Oversubscribe, dedupCharge: t.DedupCharge,
		budget:     &budget{owner: fmt.Sprintf("container %v of tenant %q", k, g.Tenant), limit: virtual(g.Memory, t.Oversubscribe), log: m.log},
		hostMapped: budget{owner: fmt.Sprintf("host regions of container %v", k), limit: MaxHostMappedPerContainer, log: m.log},
	}
	ctr.resident = &budget{owner: fmt.Sprintf("resident memory of container %v of tenant %q", k, g.Tenant),
		limit: frameBytes(residentFrames(g.Memory, t.Oversubscribe)), log: m.log}
	if t.Oversubscribe > 1 {
		// Its evicted chunks, bounded as a container's frames are
		// without oversubscription, over what it may allocate.
		ctr.store = m.store.Bounded(frameBytes(fragmentedFrames(ctr.budget.limit)))
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		ctr.closeSocket()
		if ctr.store != nil {
			ctr.store.Close()
		}
		return nil, fmt.Errorf("mediator closing: %w", api.ErrUnavailable)
	}
	m.containers[k] = ctr
	if restored {
		m.restoring = append(m.restoring, ctr) // served once New has restored the sessions too
		m.mu.Unlock()
		return ctr, nil
	}
	m.wg.Add(1) // with m.mu held: Close has not begun to wait
	m.mu.Unlock()
	m.serveContainer(ctr)
	return ctr, nil
}

// serveContainer accepts connections on ctr's socket until it is closed;
// the caller has counted it in m.wg.
func (m *Mediator) serveContainer(ctr *container) {
	go func() {
		defer m.wg.Done()
		if err := m.serve(ctr.listener, ctr); err != nil {
			m.log.WithError(err).WithFields(map[string]any{"container": ctr.grant.Container, "namespace": ctr.grant.Namespace}).Error("container socket stopped")
		}
	}()
}

// Release ends the registration of container id of namespace: its socket
// goes, its sessions end and free their memory, its quota reservation is
// returned. A container of the same id in another namespace is untouched.
func (m *Mediator) Release(namespace, id string) error {
	return m.releaseIf(ctrKey{namespace, id}, nil)
}

// ContainerGone is what a container engine's report that container id of
// namespace ended (containerd's /tasks/exit, /tasks/delete or
// /containers/delete) does: it releases the registration only if its init
// process is gone too, or is the one the report names (pid, 0 where the
// report names none): a pid that a new process took since does not keep a
// dead container's grant. Such a report arrives late: by then the container
// may have been registered again (a restarted Docker container keeps its
// id, not its pid), and must not lose its grant and sessions. A
// registration without a pid is released.
func (m *Mediator) ContainerGone(namespace, id string, pid uint32) error {
	k := ctrKey{namespace, id}
	return m.releaseIf(k, func(c *container) error {
		if c.proc.running() && (pid == 0 || uint32(c.proc.pid) != pid) {
			return fmt.Errorf("release: container %v: its process %d is still running: %w", k, c.proc.pid, api.ErrInvalidArgument)
		}
		return nil
	})
}

// releaseIf releases container k if check (nil: always) approves of its
// registration, deciding and unregistering in one critical section, so that
// a registration made after the decision is never the one released. Unless
// it fails unavailable, k is released, by this call or another, when it
// returns.
func (m *Mediator) releaseIf(k ctrKey, check func(*container) error) error {
	m.mu.Lock()
	ctr := m.containers[k]
	if ctr == nil {
		m.mu.Unlock()
		// Another caller (the reclaim loop, an earlier report) may be
		// releasing it still: answer once that is done, so that what the
		// caller reads next (its tenant's quota) shows it released.
		if err := m.awaitRelease(k); err != nil {
			return fmt.Errorf("release: container %q of namespace %q: %w", k.id, k.namespace, err)
		}
		return fmt.Errorf("release: container %q of namespace %q is not registered: %w", k.id, k.namespace, api.ErrInvalidArgument)
	}
	if check != nil {
		if err := check(ctr); err != nil {
			m.mu.Unlock()
			return err
		}
	}
	delete(m.containers, k)
	done := make(chan struct{})
	m.releasing[k] = done
	// Its sessions restored after a restart that no tenant has resumed
	// yet (resume.go) end with it, as its live ones do, before its quota
	// returns: left to their ResumeGrace, their memory would still be
	// held on the nodes while the quota was granted again.
	var restored []*session
	for h, s := range m.restored {
		if s.ctr == ctr {
			delete(m.restored, h)
			restored = append(restored, s)
		}
	}
	m.mu.Unlock()
	for _, s := range restored {
		s.expiry.Stop() // if it fires now, it finds the session gone from restored
		s.teardown()
	}
	log := m.log.WithFields(map[string]any{"container": k.id, "namespace": k.namespace})
	if !ctr.close() {
		log.Warn("sessions still tearing down after 10s; returning the quota anyway")
	}
	// Before the grant returns, so before the container can register
	// again (regstore.go's order of records).
	if err := m.regs.remove(k); err != nil {
		log.WithError(err).Error("the released container's record stays; the next start restores it if its process still runs")
	}
	m.releaseGrant(k.namespace, k.id)
	m.mu.Lock()
	delete(m.releasing, k)
	m.mu.Unlock()
	close(done)
	log.Info("container released")
	return nil
}

// reclaimLoop releases containers whose init process has vanished without
// a poststop hook (a killed shim, a crashed runtime).
func (m *Mediator) reclaimLoop() {
	tick := time.NewTicker(m.cfg.ReclaimInterval)
	defer tick.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
		m.mu.Lock()
		var gone []ctrKey
		for k, c := range m.containers {
			if c.proc.pid > 0 && !c.proc.running() {
				gone = append(gone, k)
			}
		}
		m.mu.Unlock()
		for _, k := range gone {
			// Checked again: k may have been released and registered
			// again, by a live process, since the scan.
			err := m.releaseIf(k, func(c *container) error {
				if c.proc.pid > 0 && !c.proc.running() {
					return nil
				}
				return fmt.Errorf("container %v was registered again: %w", k, api.ErrInvalidArgument)
			})
			if err == nil {
				m.log.WithFields(map[string]any{"container": k.id, "namespace": k.namespace}).Info("reclaimed a container that vanished without poststop")
			}
		}
	}
}

// alive reports whether a process exists; EPERM means it does, under
// another user.
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// privileged reports whether the peer of a Unix connection runs as root or
// as the mediator's own user.
func privileged(nc net.Conn) bool {
	cred, err := peerCred(nc)
	return err == nil && operator(cred.Uid)
}

// peerCred returns the credentials of the process on the other end of a
// Unix connection, as the kernel recorded them at connect.
func peerCred(nc net.Conn) (*unix.Ucred, error) {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("not a Unix connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, cerr
}

// tenantsJSON is Tenants for OpTenants.
func (m *Mediator) tenantsJSON() ([]byte, error) {
	b, err := json.Marshal(m.Tenants())
	if err != nil {
		return nil, fmt.Errorf("encode tenants: %v: %w", err, api.ErrInternal)
	}
	return b, nil
}

// Tenants lists tenants with limits, containers, reservations and the
// memory their sessions hold, by name.
func (m *Mediator) Tenants() []api.TenantInfo {
	uses := m.admission.Tenants()
	infos := make([]api.TenantInfo, len(uses))
	for i, u := range uses {
		t := u.Tenant
		infos[i] = api.TenantInfo{
			Name: t.Name, Memory: t.Memory, Compute: t.Compute, ComputeMax: t.ComputeMax, Bandwidth: t.Bandwidth,
			MaxContainers: t.MaxContainers, DefaultMemory: t.DefaultMemory, Oversubscribe: t.Oversubscribe,
			DedupCharge: t.DedupCharge, Containers: u.Containers, Reserved: u.Reserved,
		}
	}
	held, charged, lost := map[string]uint64{}, map[string]uint64{}, map[string]uint64{}
	m.mu.Lock()
	// A session restored after a restart holds its memory, charged to its
	// budget, before its tenant resumes it: it counts from the start, so
	// the listing after a restart is what it was before.
	count := func(s *session) {
		st := s.space.Stats()
		held[s.tenant] += st.Allocated
		lost[s.tenant] += st.Lost
		if s.ctr == nil { // the session's own budget
			charged[s.tenant] += s.budget.inUse()
		}
	}
	for _, s := range m.sessions {
		count(s)
	}
	for _, s := range m.restored {
		count(s)
	}
	for _, c := range m.containers {
		charged[c.grant.Tenant] += c.budget.inUse()
	}
	m.mu.Unlock()
	seen := map[string]bool{}
	for i := range infos {
		infos[i].Allocated, infos[i].Charged, infos[i].Lost = held[infos[i].Name], charged[infos[i].Name], lost[infos[i].Name]
		seen[infos[i].Name] = true
	}
	for name, n := range held { // host-socket tenants outside the quota file
		if !seen[name] {
			infos = append(infos, api.TenantInfo{Name: name, Allocated: n, Charged: charged[name], Lost: lost[name]})
		}
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	m.addClusterUse(infos)
	return infos
}

// admitPeer checks that the process on the other end of a connection to a
// container's socket runs inside that container: it must share the pid
// namespace of the container's init process. The socket is only mounted
// into the container, so this guards against a socket passed out of it.
func (c *container) admitPeer(nc net.Conn) error {
	if c.proc.pid <= 0 {
		return nil // registered without a process (tests, operators by hand)
	}
	cred, err := peerCred(nc)
	if err != nil {
		return fmt.Errorf("container %v: peer credentials: %v: %w", c.key(), err, api.ErrPermissionDenied)
	}
	peer, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", cred.Pid))
	init, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", c.proc.pid))
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("container %v: pid namespaces of peer %d and init %d: %v: %w", c.key(), cred.Pid, c.proc.pid, err, api.ErrPermissionDenied)
	}
	if peer != init {
		return fmt.Errorf("container %v: process %d is not in the container (pid namespace %s, the container's %s): %w",
			c.key(), cred.Pid, peer, init, api.ErrPermissionDenied)
	}
	return nil
}
