package mediator

// Cluster mode (Config.Cluster, vgpu-mediator --etcd): the nodes a mediator
// uses come from the registry in etcd and change while it runs — a node
// that registers is connected and placed on, a node whose lease expired is
// placed on no more (its sessions go on, or fail as its connections do) —
// and containers' grants are reserved cluster-wide (cluster.Quotas), so a
// tenant's containers on all mediators together stay within its caps. The
// quota file, when etcd has one (vgpuctl tenants apply), replaces --quota
// and is reloaded on every change.
//
// Nodes only join Mediator.nodes, never leave it: an index into nodes or
// devices keeps its meaning for the sessions that hold it. A node that
// left is marked gone, and one that registers again at its address is the
// same node again.

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/cluster"
	"github.com/vgpu/vgpu/internal/version"
	"github.com/vgpu/vgpu/isolation"
)

// ClusterConfig is cluster mode's part of Config.
type ClusterConfig struct {
	Session *cluster.Session
	// ID names this mediator in the cluster and its reservations; unique
	// among live mediators. A mediator restarted with its ID takes back
	// its reservations.
	ID string
	// WaitNodes bounds how long New waits for a first node to register;
	// default 30s.
	WaitNodes time.Duration
	// Quota tunes the reservations (chunk, trim delay); its ID is ID.
	Quota cluster.QuotaOptions
}

// clusterState is a mediator's membership.
type clusterState struct {
	cfg    ClusterConfig
	quotas *cluster.Quotas
	cache  int64 // page cache of a node that joins later (Config.CacheMemory split as at start)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex // guards the fields below
	// joining holds the addresses being connected, so that one node is
	// dialled once however many registry changes name it.
	joining map[string]bool
	// fromEtcd: the quota file in force is etcd's; Reload refuses.
	fromEtcd bool
}

// registeredNodes sets cfg.Nodes to the nodes registered in etcd, waiting
// up to WaitNodes for a first one.
func registeredNodes(cfg *Config) error {
	c := cfg.Cluster
	if c.Session == nil || c.ID == "" {
		return fmt.Errorf("cluster mode needs an etcd session and a mediator id: %w", api.ErrInvalidArgument)
	}
	if len(cfg.Nodes) > 0 {
		return fmt.Errorf("nodes %v given in cluster mode, where they come from etcd's registry: %w", cfg.Nodes, api.ErrInvalidArgument)
	}
	deadline := time.Now().Add(cmp.Or(c.WaitNodes, 30*time.Second))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), c.Session.Options().OpTimeout)
		nodes, err := c.Session.Nodes(ctx)
		cancel()
		if err == nil && len(nodes) > 0 {
			for _, n := range nodes {
				cfg.Nodes = append(cfg.Nodes, n.Addr)
			}
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("no node registered in etcd: %w", api.ErrUnavailable)
			}
			return fmt.Errorf("cluster mode: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// node returns node i.
func (m *Mediator) node(i int) *node {
	m.nodesMu.RLock()
	defer m.nodesMu.RUnlock()
	return m.nodes[i]
}

// nodeList returns the nodes; a node that joins later is not in it.
func (m *Mediator) nodeList() []*node {
	m.nodesMu.RLock()
	defer m.nodesMu.RUnlock()
	return m.nodes
}

// deviceList returns the devices; a node that joins later adds its own
// after them.
func (m *Mediator) deviceList() []*device {
	m.nodesMu.RLock()
	defer m.nodesMu.RUnlock()
	return m.devices
}

// usableDevices returns the devices of the nodes that have not left the cluster.
func (m *Mediator) usableDevices() []*device {
	nodes, devices := m.nodeList(), m.deviceList()
	out := make([]*device, 0, len(devices))
	for _, d := range devices {
		if d.node < len(nodes) && !nodes[d.node].gone.Load() {
			out = append(out, d)
		}
	}
	return out
}

// appendNode adds n and its devices.
func (m *Mediator) appendNode(n *node) {
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	i := len(m.nodes)
	m.nodes = append(m.nodes, n)
	for _, d := range n.devices {
		m.devices = append(m.devices, &device{node: i, info: d})
	}
}

// joinCluster registers the mediator, starts its reservations, and
// follows the node registry and the quota file in etcd until leaveCluster.
// It returns once the quota file in etcd, if any, is in force.
func (m *Mediator) joinCluster() error {
	c := m.cfg.Cluster
	host, _ := os.Hostname()
	if _, err := c.Session.RegisterMediator(cluster.MediatorInfo{ID: c.ID, Host: host, Version: version.String("vgpu-mediator"), Started: time.Now().UTC()}); err != nil {
		return err
	}
	qo := c.Quota
	qo.ID = c.ID
	quotas, err := cluster.NewQuotas(c.Session, qo)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	cs := &clusterState{cfg: *c, quotas: quotas, ctx: ctx, cancel: cancel, joining: map[string]bool{},
		cache: cmp.Or(m.cfg.CacheMemory, CacheMemory) / int64(max(len(m.cfg.Nodes), 1))}
	m.cluster = cs
	first := make(chan struct{})
	var once sync.Once
	cs.wg.Go(func() {
		c.Session.WatchTenants(ctx, func(cfg *isolation.Config, present bool, err error) {
			m.clusterTenants(cfg, present, err)
			once.Do(func() { close(first) })
		})
	})
	cs.wg.Go(func() { m.followNodes(ctx) })
	select {
	case <-first:
	case <-time.After(2 * c.Session.Options().OpTimeout):
		m.log.Warn("cluster: the quota file in etcd could not be read yet; the local quotas apply until it is")
	}
	return nil
}

// followNodes keeps the nodes in step with the registry: on every change,
// and every few seconds for the nodes that could not be reached before.
func (m *Mediator) followNodes(ctx context.Context) {
	var mu sync.Mutex // guards last
	var last []cluster.NodeInfo
	go func() {
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			mu.Lock()
			l := last
			mu.Unlock()
			if l != nil {
				m.syncNodes(l)
			}
		}
	}()
	m.cfg.Cluster.Session.WatchNodes(ctx, func(ns []cluster.NodeInfo) {
		mu.Lock()
		last = ns
		mu.Unlock()
		m.syncNodes(ns)
	})
}

// syncNodes marks the nodes not registered as gone and those registered as
// not, takes their devices' free memory for placement, and connects to
// registered nodes the mediator does not have.
func (m *Mediator) syncNodes(registered []cluster.NodeInfo) {
	byAddr := make(map[string]cluster.NodeInfo, len(registered))
	for _, n := range registered {
		byAddr[n.Addr] = n
	}
	nodes, devices := m.nodeList(), m.deviceList()
	have := map[string]bool{}
	for i, n := range nodes {
		have[n.addr] = true
		info, ok := byAddr[n.addr]
		if was := n.gone.Swap(!ok); was == ok {
			if ok {
				m.log.WithField("node", n.addr).Info("cluster: node registered again; placing on it")
			} else {
				m.log.WithField("node", n.addr).Warn("cluster: node left the registry (lease expired or revoked); placing on it no more")
			}
		}
		for _, d := range devices {
			if d.node != i {
				continue
			}
			for _, di := range info.Devices {
				if di.Index == d.info.Index {
					d.free.Store(di.Free)
				}
			}
		}
	}
	for addr := range byAddr {
		if !have[addr] {
			m.tryJoin(addr)
		}
	}
}

// tryJoin connects to a newly registered node in the background, unless a
// connection to it is being made already.
func (m *Mediator) tryJoin(addr string) {
	cs := m.cluster
	cs.mu.Lock()
	if cs.joining[addr] || cs.ctx.Err() != nil {
		cs.mu.Unlock()
		return
	}
	cs.joining[addr] = true
	cs.wg.Add(1) // under mu, so never after leaveCluster's Wait began
	cs.mu.Unlock()
	go func() {
		defer cs.wg.Done()
		defer func() {
			cs.mu.Lock()
			delete(cs.joining, addr)
			cs.mu.Unlock()
		}()
		log := m.log.WithField("node", addr)
		n, catalog, err := connectNode(addr, m.cfg.NodeTLS, m.cfg.NodeTimeout)
		if err != nil {
			log.WithError(err).Warn("cluster: a registered node cannot be reached; trying again later")
			return
		}
		if missing := missingKernels(m.catalog, catalog); missing != "" {
			n.close()
			log.WithField("missing", missing).Error("cluster: ignoring a node that lacks kernels the other nodes offer")
			return
		}
		if n.cache, err = newPageCache(m, cs.cache); err != nil {
			n.close()
			log.WithError(err).Error("cluster: ignoring a node whose page cache cannot be made")
			return
		}
		if cs.ctx.Err() != nil { // the mediator is closing
			n.close()
			return
		}
		m.appendNode(n)
		log.WithField("devices", len(n.devices)).Info("cluster: node joined")
	}()
}

// missingKernels names a kernel of want that have lacks or offers with
// other parameters, or returns "".
func missingKernels(want, have map[string]api.KernelInfo) string {
	if got := intersect(want, have); len(got) != len(want) {
		for name := range want {
			if _, ok := got[name]; !ok {
				return name
			}
		}
	}
	return ""
}

// clusterTenants installs a quota file from etcd. An invalid one, or none,
// leaves the quotas in force.
func (m *Mediator) clusterTenants(cfg *isolation.Config, present bool, err error) {
	log := m.log.WithField("source", cluster.TenantsSource)
	switch {
	case err != nil:
		log.WithError(err).Error("cluster: the quota file in etcd is invalid; keeping the quotas in force")
		return
	case !present:
		log.Info("cluster: etcd has no quota file (vgpuctl tenants apply); the local quota file applies")
		return
	}
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	m.admission.SetConfig(cfg)
	m.cluster.mu.Lock()
	m.cluster.fromEtcd = true
	m.cluster.mu.Unlock()
	log.Info("quotas loaded from etcd")
	warnIfOpen(m.log, cfg)
}

// quotasFromEtcd says whether the quota file in force is etcd's.
func (m *Mediator) quotasFromEtcd() bool {
	if m.cluster == nil {
		return false
	}
	m.cluster.mu.Lock()
	defer m.cluster.mu.Unlock()
	return m.cluster.fromEtcd
}

// reserveCluster reserves a container's grant, admitted here under limits
// t, cluster-wide; outside cluster mode it does nothing.
func (m *Mediator) reserveCluster(g isolation.Grant, t *isolation.Tenant) error {
	if m.cluster == nil {
		return nil
	}
	return m.cluster.quotas.Reserve(g.Tenant, cluster.Limits{Memory: t.Memory, MaxContainers: t.MaxContainers}, g.Memory, 1)
}

// restoreCluster counts a restored container's grant cluster-wide without
// checking the caps: the container runs, and was admitted.
func (m *Mediator) restoreCluster(g isolation.Grant) {
	if m.cluster != nil {
		m.cluster.quotas.Restore(g.Tenant, g.Memory, 1)
	}
}

// releaseGrant returns a container's grant, here and cluster-wide.
func (m *Mediator) releaseGrant(namespace, container string) {
	if g, ok := m.admission.Release(namespace, container); ok && m.cluster != nil {
		m.cluster.quotas.Release(g.Tenant, g.Memory, 1)
	}
}

// clusterStatus reports the cluster as etcd has it: nil outside cluster
// mode; Error set where etcd cannot be read within its operation timeout.
func (m *Mediator) clusterStatus() *api.ClusterStatus {
	cs := m.cluster
	if cs == nil {
		return nil
	}
	s := cs.cfg.Session
	st := &api.ClusterStatus{ID: cs.cfg.ID, Etcd: s.Options().Endpoints}
	ctx, cancel := context.WithTimeout(context.Background(), s.Options().OpTimeout)
	defer cancel()
	nodes, err := s.Nodes(ctx)
	var meds []cluster.MediatorInfo
	var use map[string]cluster.Reservation
	if err == nil {
		meds, err = s.Mediators(ctx)
	}
	if err == nil {
		use, err = s.Usage(ctx)
	}
	if err != nil {
		st.Error = err.Error()
		return st
	}
	connected := map[string]bool{} // used for placement, and the connection up
	for _, n := range m.nodeList() {
		connected[n.addr] = !n.gone.Load() && n.up()
	}
	for _, n := range nodes {
		cn := api.ClusterNode{Addr: n.Addr, Backend: n.Backend, TLS: n.TLS, Connections: n.Connections, Devices: len(n.Devices), Connected: connected[n.Addr]}
		for _, d := range n.Devices {
			cn.Memory += d.Memory
			cn.Free += d.Free
		}
		st.Nodes = append(st.Nodes, cn)
	}
	for _, md := range meds {
		st.Mediators = append(st.Mediators, api.ClusterMediator{ID: md.ID, Host: md.Host, Version: md.Version, Started: md.Started})
	}
	for name, r := range use {
		st.Tenants = append(st.Tenants, api.ClusterTenant{Name: name, Reserved: r.Memory, Containers: r.Containers})
	}
	slices.SortFunc(st.Tenants, func(a, b api.ClusterTenant) int { return strings.Compare(a.Name, b.Name) })
	return st
}

// leaveCluster stops following etcd and ends the reservations. The
// session, and with it the lease, is the caller's to close.
func (m *Mediator) leaveCluster() {
	cs := m.cluster
	if cs == nil {
		return
	}
	cs.mu.Lock()
	cs.cancel()
	cs.mu.Unlock()
	cs.wg.Wait()
	cs.quotas.Close()
}

// clusterCharge charges a host session's allocations to its tenant's
// cluster-wide memory cap, from the mediator's reserved chunk without an
// etcd round trip while the chunk lasts (cluster.Quotas). A tenant the
// quota file does not name has no cap; its use is still counted.
type clusterCharge struct {
	m      *Mediator
	tenant string
}

// clusterCharge is the charge of a host session of tenant; nil outside
// cluster mode.
func (m *Mediator) clusterCharge(tenant string) *clusterCharge {
	if m.cluster == nil {
		return nil
	}
	return &clusterCharge{m: m, tenant: tenant}
}

func (c *clusterCharge) reserve(n uint64) error {
	if n == 0 {
		return nil
	}
	var lim cluster.Limits
	if t := c.m.admission.Limits(c.tenant); t != nil {
		lim.Memory = t.Memory
	}
	return c.m.cluster.quotas.Reserve(c.tenant, lim, n, 0)
}

func (c *clusterCharge) release(n uint64) { c.m.cluster.quotas.Release(c.tenant, n, 0) }

// addClusterUse fills in each tenant's use over all mediators, in cluster
// mode, as etcd has it; where etcd cannot be read within its operation
// timeout, the tenants are left without it.
func (m *Mediator) addClusterUse(infos []api.TenantInfo) {
	if m.cluster == nil {
		return
	}
	s := m.cluster.cfg.Session
	ctx, cancel := context.WithTimeout(context.Background(), s.Options().OpTimeout)
	defer cancel()
	use, err := s.Usage(ctx)
	if err != nil {
		m.log.WithError(err).Warn("cluster: tenants listed without their cluster-wide use")
		return
	}
	for i := range infos {
		u := use[infos[i].Name]
		infos[i].Cluster = &api.ClusterUse{Reserved: u.Memory, Containers: u.Containers}
	}
}
