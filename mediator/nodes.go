package mediator

import (
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

// dialNode connects to a node for tenant and says hello. The returned RPC is
// the tenant's own connection: the node ties frames to it.
func dialNode(addr, tenant string) (*api.RPC, *api.HelloReply, error) {
	nc, err := net.DialTimeout("tcp", addr, DialTimeout)
	if err != nil {
		return nil, nil, fmt.Errorf("dial node %s: %v: %w", addr, err, api.ErrUnavailable)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	rpc := api.NewRPC(api.NewConn(nc), "node "+addr)
	hello := api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator, Tenant: tenant}
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

	mu  sync.Mutex
	ctl *api.RPC // redialled when it breaks, so status recovers with the node
}

func connectNode(addr string) (*node, map[string]api.KernelInfo, error) {
	rpc, hello, err := dialNode(addr, "")
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
	return &node{addr: addr, devices: hello.Devices, ctl: rpc}, catalog, nil
}

// control returns the mediator's own connection to the node, dialling a
// new one if the old one broke.
func (n *node) control() (*api.RPC, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.ctl.Closed():
		rpc, _, err := dialNode(n.addr, "")
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
