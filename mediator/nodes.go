package mediator

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vgpu/vgpu/api"
)

// DialTimeout bounds connecting to a node and its handshake.
const DialTimeout = 10 * time.Second

// statusTimeout bounds a node's answer to a status query.
const statusTimeout = 5 * time.Second

// nodeTenant is who a node connection acts for, as the node schedules it.
type nodeTenant struct {
	name       string
	weight     uint32  // fair-share weight; 0 means 1
	computeMax float32 // cap on its share of a device; 0 means none
}

// dialNode connects to a node for tenant and says hello, over TLS when
// tlsCfg is set. The returned RPC is
// the tenant's own connection: the node ties frames to it.
func dialNode(addr string, t nodeTenant, tlsCfg *tls.Config, push func(*api.RPC, api.Op, []byte)) (*api.RPC, *api.HelloReply, error) {
	d := &net.Dialer{Timeout: DialTimeout}
	var nc net.Conn
	var err error
	if tlsCfg != nil {
		nc, err = tls.DialWithDialer(d, "tcp", addr, tlsCfg)
	} else {
		nc, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("dial node %s: %v: %w", addr, err, api.ErrUnavailable)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	rpc := api.NewRPCPush(api.NewConn(nc), "node "+addr, push)
	hello := api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator,
		Tenant: t.name, Weight: t.weight, ComputeMax: t.computeMax}
	call := rpc.Go(api.OpHello, nil, api.Encode(&hello))
	select {
	case <-call.Done():
	case <-time.After(DialTimeout):
		rpc.Close()
		return nil, nil, fmt.Errorf("node %s: no hello reply within %v: %w", addr, DialTimeout, api.ErrUnavailable)
	}
	if call.Err != nil {
		rpc.Close()
		return nil, nil, fmt.Errorf("node %s: hello: %w", addr, call.Err)
	}
	var reply api.HelloReply
	if err := api.Decode(call.Body, &reply); err != nil {
		rpc.Close()
		return nil, nil, fmt.Errorf("node %s: hello reply: %w", addr, err)
	}
	return rpc, &reply, nil
}

// node is a node the mediator uses: its devices, its kernel catalog, and a
// connection of the mediator's own for status queries.
type node struct {
	addr    string
	devices []api.DeviceInfo
	tls     *tls.Config // nil: plain TCP
	cache   *pageCache  // copies of pages of its shared objects (shared.go)

	mu  sync.Mutex
	ctl *api.RPC // redialled when it breaks, so status recovers with the node
}

func connectNode(addr string, tlsCfg *tls.Config) (*node, map[string]api.KernelInfo, error) {
	rpc, hello, err := dialNode(addr, nodeTenant{}, tlsCfg, nil)
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
	return &node{addr: addr, devices: hello.Devices, tls: tlsCfg, ctl: rpc}, catalog, nil
}

// control returns the mediator's own connection to the node, dialling a
// new one if the old one broke.
func (n *node) control() (*api.RPC, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.ctl.Closed():
		rpc, _, err := dialNode(n.addr, nodeTenant{}, n.tls, nil)
		if err != nil {
			return nil, err
		}
		n.ctl = rpc
	default:
	}
	return n.ctl, nil
}

func (n *node) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ctl.Close()
}

func (n *node) status() api.NodeStatus {
	st := api.NodeStatus{Addr: n.addr}
	ctl, err := n.control()
	if err != nil {
		st.Error = err.Error()
		return st
	}
	call := ctl.Go(api.OpNodeStatus, nil)
	select {
	case <-call.Done():
	case <-time.After(statusTimeout):
		st.Error = fmt.Sprintf("no status within %v", statusTimeout)
		return st
	}
	if call.Err != nil {
		st.Error = call.Err.Error()
		return st
	}
	if err := json.Unmarshal(call.Body, &st); err != nil {
		st.Error = fmt.Sprintf("malformed status: %v", err)
	}
	st.Addr = n.addr
	return st
}
