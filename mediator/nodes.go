package mediator

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// DialTimeout bounds connecting to a node and its handshake.
const DialTimeout = 10 * time.Second

// DefaultNodeTimeout is how long a node's host may stay silent before the
// calls on its connections fail (Config.NodeTimeout, wire.WatchPeer).
const DefaultNodeTimeout = wire.DefaultPeerTimeout

// statusTimeout bounds a node's answer to a status query.
const statusTimeout = 5 * time.Second

// nodeTenant is who a node connection acts for, as the node schedules it,
// and how long the mediator bears the node's silence on it.
type nodeTenant struct {
	name       string
	weight     uint32  // fair-share weight; 0 means 1
	computeMax float32 // cap on its share of a device; 0 means none
	// timeout bounds the node host's silence on the connection
	// (Config.NodeTimeout); 0 means DefaultNodeTimeout.
	timeout time.Duration
}

// dialNode connects to a node for tenant and says hello, over TLS when
// tlsCfg is set. The returned RPC is the tenant's own connection: the node
// ties frames to it. Connecting and the TLS handshake take at most
// DialTimeout, the hello as long again. Once the node's host has been silent
// for t.timeout (wire.WatchPeer), the connection fails and so does every call
// on it, with api.ErrUnavailable naming the node and how long it was silent;
// a node that is only busy keeps its connection however long it takes.
func dialNode(addr string, t nodeTenant, tlsCfg *tls.Config, push func(*wire.RPC, wire.Op, []byte)) (*wire.RPC, *api.HelloReply, error) {
	return dialNodeContext(context.Background(), addr, t, tlsCfg, push)
}

// dialNodeContext is dialNode, given up as soon as ctx ends.
func dialNodeContext(ctx context.Context, addr string, t nodeTenant, tlsCfg *tls.Config, push func(*wire.RPC, wire.Op, []byte)) (*wire.RPC, *api.HelloReply, error) {
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	nc, err := dialWatched(dctx, addr, cmp.Or(t.timeout, DefaultNodeTimeout), tlsCfg)
	if err != nil {
		return nil, nil, fmt.Errorf("dial node %s: %w", addr, api.WithCode(err, api.ErrUnavailable))
	}
	rpc := wire.NewRPCPush(wire.NewConn(nc), "node "+addr, push)
	hello := api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator,
		Tenant: t.name, Weight: t.weight, ComputeMax: t.computeMax}
	call := rpc.Go(api.OpHello, nil, api.Encode(&hello))
	select {
	case <-call.Done():
	case <-ctx.Done():
		rpc.Close()
		return nil, nil, fmt.Errorf("node %s: hello: %v: %w", addr, ctx.Err(), api.ErrUnavailable)
	case <-time.After(DialTimeout):
		rpc.Close()
		return nil, nil, fmt.Errorf("node %s: no hello reply within %v: %w", addr, DialTimeout, api.ErrUnavailable)
	}
	if call.Err != nil {
		rpc.Close()
		return nil, nil, fmt.Errorf("node %s: hello%s: %w", addr, tlsHint(tlsCfg, call.Err), call.Err)
	}
	var reply api.HelloReply
	if err := api.Decode(call.Body, &reply); err != nil {
		rpc.Close()
		return nil, nil, fmt.Errorf("node %s: hello reply: %w", addr, err)
	}
	return rpc, &reply, nil
}

// tlsHint is what the error of a failed hello adds where a node may want
// TLS that the mediator was not given: a node serving TLS drops a plain
// connection without a word, which reads as the node closing it.
func tlsHint(tlsCfg *tls.Config, err error) string {
	if tlsCfg != nil || !(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
		return ""
	}
	return " (the node closed the connection: if it requires TLS, give the mediator --node-tls-cert, --node-tls-key and --node-tls-ca)"
}

// dialWatched connects to the node at addr, watched for silence past
// timeout, with TLS on top when tlsCfg is set.
func dialWatched(ctx context.Context, addr string, timeout time.Duration, tlsCfg *tls.Config) (net.Conn, error) {
	// Keepalive is WatchPeer's, set as soon as the connection exists.
	d := &net.Dialer{KeepAlive: -1}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	_ = tc.SetNoDelay(true)
	nc, err := wire.WatchPeer(tc, "node "+addr, timeout)
	if err != nil {
		tc.Close()
		return nil, err
	}
	if tlsCfg == nil {
		return nc, nil
	}
	if tlsCfg.ServerName == "" { // as tls.Dial: the node's certificate must name the host dialled
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		tlsCfg = tlsCfg.Clone()
		tlsCfg.ServerName = host
	}
	sc := tls.Client(nc, tlsCfg)
	if err := sc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return sc, nil
}

// node is a node the mediator uses: its devices, its kernel catalog, and a
// connection of the mediator's own for status queries.
type node struct {
	addr    string
	devices []api.DeviceInfo
	tls     *tls.Config   // nil: plain TCP
	timeout time.Duration // bound on the node host's silence (Config.NodeTimeout)
	cache   *pageCache    // copies of pages of its shared objects (shared.go)
	// gone: the node left the cluster's registry (cluster.go); nothing new
	// is placed on it.
	gone atomic.Bool
	// ctx ends with close, and with it a redial in flight.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards ctl, redial and boot; nothing blocks on the network under
	// it, so the status of a node that cannot be reached waits for no lock.
	mu     sync.Mutex
	ctl    *wire.RPC // redialled when it breaks, so status recovers with the node
	redial *redial   // the redial of ctl in flight; nil when none is
	// boot is the node's boot id (api.NodeStatus.Boot) as its last status
	// said; "" if none has.
	boot string
}

// redial is one redial of a node's control connection, shared by the
// status queries that find ctl broken while it runs. rpc and err are set
// before done is closed.
type redial struct {
	done chan struct{}
	rpc  *wire.RPC
	err  error
}

func connectNode(addr string, tlsCfg *tls.Config, timeout time.Duration) (*node, map[string]api.KernelInfo, error) {
	rpc, hello, err := dialNode(addr, nodeTenant{timeout: timeout}, tlsCfg, nil)
	if err != nil {
		return nil, nil, err
	}
	body, err := rpc.Call(api.OpKernels, nil)
	var list api.KernelList
	if err == nil {
		err = api.Decode(body, &list)
	}
	if err != nil {
		rpc.Close()
		return nil, nil, fmt.Errorf("node %s: kernel catalog: %w", addr, err)
	}
	catalog := make(map[string]api.KernelInfo, len(list.Kernels))
	for _, k := range list.Kernels {
		catalog[k.Name] = k
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{addr: addr, devices: hello.Devices, tls: tlsCfg, timeout: timeout, ctx: ctx, cancel: cancel, ctl: rpc}
	n.boot, _ = bootOf(rpc) // "" if it cannot tell: a restart then is not told from a dropped connection
	return n, catalog, nil
}

// control returns the mediator's own connection to the node. When it has
// broken, it is redialled by one redial at a time, which callers share:
// each waits for it until ctx ends.
func (n *node) control(ctx context.Context) (*wire.RPC, error) {
	n.mu.Lock()
	if n.ctx.Err() != nil {
		n.mu.Unlock()
		return nil, n.errClosed()
	}
	select {
	case <-n.ctl.Closed():
	default:
		ctl := n.ctl
		n.mu.Unlock()
		return ctl, nil
	}
	r := n.redial
	if r == nil {
		r = &redial{done: make(chan struct{})}
		n.redial = r
		go n.redialControl(r)
	}
	n.mu.Unlock()
	select {
	case <-r.done:
		return r.rpc, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("node %s unreachable: reconnecting, %v: %w", n.addr, context.Cause(ctx), api.ErrUnavailable)
	}
}

// up says, without blocking, whether the mediator's control connection to
// the node is open. It closes when the node goes away or its host is
// silent past the node timeout (wire.WatchPeer), and opens again when a
// status query or an admission finds the node back (control).
func (n *node) up() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.ctl.Closed():
		return false
	default:
		return true
	}
}

// notConnectedWithin is a deadline for control: its error then says how
// long the redial was given.
func notConnectedWithin(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(context.Background(), d, fmt.Errorf("not connected within %v", d))
}

// admitTimeout bounds how long an admission waits for the redial of a node
// whose connection is down. With registerWait it stays below the deadline
// of the hook that asks (runtimehook.HookDeadline, 8 s).
const admitTimeout = 2 * time.Second

// canServe returns nil when the nodes that can be reached now have at
// least want devices; otherwise an api.ErrUnavailable error naming each
// node that cannot. A node counts as reachable when its control
// connection is open or is redialled within admitTimeout, so that a
// container is not admitted only to fail at its first call, and is not
// refused while reachable nodes can serve it.
func (m *Mediator) canServe(want int) error {
	ctx, cancel := notConnectedWithin(admitTimeout)
	defer cancel()
	nodes := m.nodeList()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		if n.gone.Load() {
			errs[i] = fmt.Errorf("node %s left the cluster: %w", n.addr, api.ErrUnavailable)
			continue
		}
		wg.Go(func() { _, errs[i] = n.control(ctx) })
	}
	wg.Wait()
	usable := 0
	var down []string
	for i, n := range nodes {
		if errs[i] != nil {
			down = append(down, errs[i].Error())
			continue
		}
		usable += len(n.devices)
	}
	if usable >= want {
		return nil
	}
	return fmt.Errorf("%d devices asked, %d on nodes that can be reached (%s): %w", want, usable, strings.Join(down, "; "), api.ErrUnavailable)
}

// redialControl dials a new control connection for r and installs it, or
// closes it if the mediator closed meanwhile: close would not see it.
func (n *node) redialControl(r *redial) {
	rpc, _, err := dialNodeContext(n.ctx, n.addr, nodeTenant{timeout: n.timeout}, n.tls, nil)
	var boot string
	if err == nil {
		boot, _ = bootOf(rpc) // the node may have restarted while ctl was down
	}
	n.mu.Lock()
	if err == nil && n.ctx.Err() != nil {
		rpc.Close()
		rpc, err = nil, n.errClosed()
	}
	if err == nil {
		n.ctl, n.boot = rpc, boot
	}
	r.rpc, r.err = rpc, err
	n.redial = nil
	n.mu.Unlock()
	close(r.done)
}

func (n *node) errClosed() error {
	return fmt.Errorf("node %s: mediator closed: %w", n.addr, api.ErrUnavailable)
}

// close closes the control connection and ends a redial in flight.
func (n *node) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cancel()
	n.ctl.Close()
}

// status asks the node for its status, taking at most statusTimeout in
// all, reconnecting included.
func (n *node) status() api.NodeStatus {
	ctx, cancel := notConnectedWithin(statusTimeout)
	defer cancel()
	st := api.NodeStatus{Addr: n.addr}
	ctl, err := n.control(ctx)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	call := ctl.Go(api.OpNodeStatus, nil)
	select {
	case <-call.Done():
	case <-ctx.Done():
		st.Error = fmt.Sprintf("node %s: no status within %v", n.addr, statusTimeout)
		return st
	}
	if call.Err != nil {
		st.Error = call.Err.Error()
		return st
	}
	if err := json.Unmarshal(call.Body, &st); err != nil {
		st.Error = fmt.Sprintf("node %s: malformed status: %v", n.addr, err)
	} else if st.Boot != "" {
		n.mu.Lock()
		n.boot = st.Boot
		n.mu.Unlock()
	}
	st.Addr = n.addr
	return st
}
