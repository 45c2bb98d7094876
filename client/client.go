// Package client is the tenant SDK: what a program imports to use a vGPU.
//
// A Client is one session with the mediator on this host, reached through
// its Unix socket (VGPU_SOCKET, or /run/vgpu/mediator.sock). A session has
// virtual devices, a private device address space, and streams.
//
// Stream operations are asynchronous, like CUDA's *Async calls: they are
// queued without waiting and sent in batches, and Synchronize sends what is
// queued and waits for it, returning the first error any of it met: one
// round trip per Synchronize, not per call. Until then a source slice must
// not be modified and a destination slice holds no result.
// Client and Stream are safe for concurrent use; one stream's operations
// take effect in the order they were called.
//
// Bulk bytes never pass through the socket: copies from or to memory of
// HostAlloc move straight between that shared memory and the network, and
// other host memory is staged through a shared buffer of the stream's
// (stream.go, hostmem.go).
//
// A model's work can also be registered once as a tensor graph, its
// tensors and operations with their meaning, and invoked in one round trip
// (tensorgraph.go, docs/graphs.md).
package client

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/api/wire"
)

// DefaultSocket is where the mediator listens unless told otherwise.
const DefaultSocket = vocab.DefaultSocket

// Options configure a session.
type Options struct {
	Socket  string // default: $VGPU_SOCKET, else DefaultSocket
	Tenant  string // default: $VGPU_TENANT; the mediator may override it
	Devices int    // virtual devices wanted; default: $VGPU_DEVICES, else 1
	// Reconnect is how long to try to reach the mediator again when the
	// connection breaks, resuming the session (reconnect.go); 0 means
	// DefaultReconnect, a negative value never.
	Reconnect time.Duration
}

// Ptr is a device virtual address.
type Ptr uint64

// Add returns p advanced by off bytes.
func (p Ptr) Add(off uint64) Ptr { return p + Ptr(off) }

// Client is a session with a mediator.
type Client struct {
	rpc     *link
	session uint64
	devices []api.DeviceInfo
	def     *Stream

	mu      sync.Mutex
	streams map[*Stream]bool // live streams, flushed before calls that wait for them
	regions []*region        // HostAlloc memory, by address
}

// Dial opens a tenant session.
func Dial(opt Options) (*Client, error) {
	if opt.Socket == "" {
		opt.Socket = os.Getenv("VGPU_SOCKET")
	}
	if opt.Socket == "" {
		opt.Socket = DefaultSocket
	}
	if opt.Tenant == "" {
		opt.Tenant = os.Getenv("VGPU_TENANT")
	}
	if opt.Devices < 0 {
		return nil, fmt.Errorf("devices %d: want a positive whole number: %w", opt.Devices, api.ErrInvalidArgument)
	}
	if opt.Devices == 0 {
		if v := os.Getenv("VGPU_DEVICES"); v != "" {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("VGPU_DEVICES=%q: want a positive whole number: %w", v, api.ErrInvalidArgument)
			}
			opt.Devices = int(n)
		}
	}
	// No bound on the hello: the mediator answers it once it has connected
	// to the nodes of the session's devices, which have their own.
	hello := api.Hello{
		Magic: api.Magic, Version: api.Version, Role: api.RoleTenant,
		Tenant: opt.Tenant, Devices: uint32(opt.Devices), Resumable: true,
	}
	rpc, reply, err := dial(opt.Socket, hello, 0)
	if err != nil {
		return nil, err
	}
	if opt.Reconnect == 0 {
		opt.Reconnect = DefaultReconnect
	}
	c := &Client{session: reply.Session, devices: reply.Devices, streams: map[*Stream]bool{}}
	c.rpc = &link{socket: opt.Socket, hello: hello, wait: opt.Reconnect, c: c, rpc: rpc, token: reply.Token}
	c.def = c.newStream(api.DefaultStream)
	return c, nil
}

// Requests is how many requests the session has sent to the mediator
// since its hello: each is one round trip on the tenant's socket.
func (c *Client) Requests() uint64 { return c.rpc.requests.Load() }

// dial connects to the mediator at socket and says hello, giving up on
// the hello after timeout (0: never; see answeredWithin).
func dial(socket string, hello api.Hello, timeout time.Duration) (*wire.RPC, *api.HelloReply, error) {
	nc, err := net.DialTimeout("unix", socket, 10*time.Second)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to mediator at %s: %w: %w", socket, err, api.ErrUnavailable)
	}
	rpc := wire.NewRPCCallerReads(wire.NewConn(nc), "mediator "+socket)
	var body []byte
	err = answeredWithin(rpc, socket, api.OpHello, timeout, func() (err error) {
		if body, err = rpc.Call(api.OpHello, nil, api.Encode(&hello)); err != nil {
			return fmt.Errorf("mediator at %s: %w", socket, err)
		}
		return nil
	})
	if err != nil {
		rpc.Close()
		return nil, nil, err
	}
	var reply api.HelloReply
	if err := api.Decode(body, &reply); err != nil {
		rpc.Close()
		return nil, nil, fmt.Errorf("mediator at %s: hello reply: %w", socket, err)
	}
	return rpc, &reply, nil
}

// answeredWithin runs call, which waits on rpc for the reply to op, and
// gives up after timeout (0: never) by closing rpc, which ends the call: a
// late reply must not be taken for a later call's. The error then says
// that the mediator at socket did not answer in time, and wraps
// api.ErrUnavailable.
func answeredWithin(rpc *wire.RPC, socket string, op wire.Op, timeout time.Duration, call func() error) error {
	if timeout == 0 {
		return call()
	}
	var late atomic.Bool
	t := time.AfterFunc(timeout, func() {
		late.Store(true)
		rpc.Close()
	})
	err := call()
	t.Stop()
	if err != nil && late.Load() {
		return fmt.Errorf("mediator at %s did not answer %v within %v; connection closed: %w", socket, op, timeout, api.ErrUnavailable)
	}
	return err
}

// Close ends the session; the mediator frees all its device memory. Work
// not synchronized is abandoned.
func (c *Client) Close() error {
	err := c.rpc.Close()
	c.mu.Lock()
	streams := make([]*Stream, 0, len(c.streams))
	for s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	for _, s := range streams { // lock order: a stream's mu, then c.mu
		s.mu.Lock()
		s.staging = nil
		s.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.regions {
		r.unmap()
	}
	c.regions = nil
	return err
}

// Session is the mediator's id for this session.
func (c *Client) Session() uint64 { return c.session }

// Devices lists the session's virtual devices.
func (c *Client) Devices() []api.DeviceInfo { return c.devices }

// Malloc allocates size bytes of device memory on virtual device dev. The
// memory reads as zeros until written.
func (c *Client) Malloc(dev int, size uint64) (Ptr, error) {
	return c.MallocWith(dev, size, AllocOptions{})
}

// AllocOptions say what a buffer is for.
type AllocOptions struct {
	Hint api.Hint // how the mediator should place, evict and cache it
	// Near places the buffer on the device of the allocation holding Near
	// instead of dev (a KV cache next to the weights that use it).
	Near Ptr
	// FreeWith frees the buffer when that stream is destroyed (an
	// activation that lives as long as the stream's work).
	FreeWith *Stream
}

// MallocWith is Malloc with a residency hint and placement options.
func (c *Client) MallocWith(dev int, size uint64, o AllocOptions) (Ptr, error) {
	m := api.Malloc{Device: uint32(dev), Size: size, Hint: o.Hint}
	if o.Near != 0 {
		m.Flags |= api.MallocNear
		m.Near = uint64(o.Near)
	}
	if o.FreeWith != nil {
		m.Flags |= api.MallocFreeWithStream
		m.Stream = o.FreeWith.id
	}
	body, err := c.rpc.Call(api.OpMalloc, nil, api.Encode(&m))
	if err != nil {
		return 0, err
	}
	var r api.MallocReply
	if err := api.Decode(body, &r); err != nil {
		return 0, err
	}
	return Ptr(r.Addr), nil
}

// Free releases the allocation at p once work already queued is done.
func (c *Client) Free(p Ptr) error {
	c.flushAll()
	_, err := c.rpc.Call(api.OpFree, nil, api.Encode(&api.Free{Addr: uint64(p)}))
	return err
}

// Seal makes the allocation at p immutable once work already queued is
// done: later writes to it fail with api.ErrPermissionDenied. A sealed
// weight whose contents a node already holds is not sent to it again.
func (c *Client) Seal(p Ptr) error {
	c.flushAll()
	_, err := c.rpc.Call(api.OpSeal, nil, api.Encode(&api.Seal{Addr: uint64(p)}))
	return err
}

// Stats reports what the session's work has cost so far, as the mediator
// counted it, network bytes to and from nodes included.
func (c *Client) Stats() (api.SessionStats, error) {
	var st api.SessionStats
	body, err := c.rpc.Call(api.OpSessionStats, nil)
	if err == nil {
		err = api.Decode(body, &st)
	}
	return st, err
}

// flushAll sends what every stream has queued, so that a call which the
// mediator orders after queued work (free, seal) sees it.
func (c *Client) flushAll() {
	c.mu.Lock()
	streams := make([]*Stream, 0, len(c.streams))
	for s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	for _, s := range streams {
		s.mu.Lock()
		s.flush()
		s.mu.Unlock()
	}
}

// Kernels lists the kernels the session can launch.
func (c *Client) Kernels() ([]api.KernelInfo, error) {
	return kernels(c.rpc)
}

func kernels(rpc interface {
	Call(wire.Op, []byte, ...[]byte) ([]byte, error)
}) ([]api.KernelInfo, error) {
	body, err := rpc.Call(api.OpKernels, nil)
	if err != nil {
		return nil, err
	}
	var l api.KernelList
	if err := api.Decode(body, &l); err != nil {
		return nil, err
	}
	return l.Kernels, nil
}

// Stream returns the session's default stream.
func (c *Client) Stream() *Stream { return c.def }

// NewStream creates a stream that runs independently of the others.
func (c *Client) NewStream() (*Stream, error) {
	body, err := c.rpc.Call(api.OpStreamCreate, nil)
	if err != nil {
		return nil, err
	}
	var r api.StreamReq
	if err := api.Decode(body, &r); err != nil {
		return nil, err
	}
	return c.newStream(r.Stream), nil
}
