// Package client is the tenant SDK: what a program imports to use a vGPU.
//
// A Client is one session with the mediator on this host, reached through
// its Unix socket (VGPU_SOCKET, or /run/vgpu/mediator.sock). A session has
// virtual devices, a private device address space, and streams.
//
// Stream operations are asynchronous, like CUDA's *Async calls: they are
// queued and pipelined to the mediator without waiting, and Synchronize
// waits for them and returns the first error any of them met. Until then a
// source slice must not be modified and a destination slice holds no result.
// Client and Stream are safe for concurrent use; one stream's operations
// take effect in the order they were called.
package client

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/vgpu/vgpu/api"
)

// DefaultSocket is where the mediator listens unless told otherwise.
const DefaultSocket = "/run/vgpu/mediator.sock"

// Options configure a session.
type Options struct {
	Socket  string // default: $VGPU_SOCKET, else DefaultSocket
	Tenant  string // default: $VGPU_TENANT; the mediator may override it
	Devices int    // virtual devices wanted; default: $VGPU_DEVICES, else 1
}

// Ptr is a device virtual address.
type Ptr uint64

// Add returns p advanced by off bytes.
func (p Ptr) Add(off uint64) Ptr { return p + Ptr(off) }

// Client is a session with a mediator.
type Client struct {
	rpc     *api.RPC
	session uint64
	devices []api.DeviceInfo
	def     *Stream
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
	if opt.Devices == 0 {
		if v := os.Getenv("VGPU_DEVICES"); v != "" {
			if _, err := fmt.Sscanf(v, "%d", &opt.Devices); err != nil || opt.Devices < 1 {
				return nil, fmt.Errorf("VGPU_DEVICES=%q: want a positive whole number: %w", v, api.ErrInvalidArgument)
			}
		}
	}
	rpc, reply, err := dial(opt.Socket, api.Hello{
		Magic: api.Magic, Version: api.Version, Role: api.RoleTenant,
		Tenant: opt.Tenant, Devices: uint32(opt.Devices),
	})
	if err != nil {
		return nil, err
	}
	c := &Client{rpc: rpc, session: reply.Session, devices: reply.Devices}
	c.def = &Stream{c: c, id: api.DefaultStream}
	return c, nil
}

func dial(socket string, hello api.Hello) (*api.RPC, *api.HelloReply, error) {
	nc, err := net.DialTimeout("unix", socket, 10*time.Second)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to mediator at %s: %v: %w", socket, err, api.ErrUnavailable)
	}
	rpc := api.NewRPC(api.NewConn(nc), "mediator "+socket)
	body, err := rpc.Call(api.OpHello, nil, api.Encode(&hello))
	if err != nil {
		rpc.Close()
		return nil, nil, fmt.Errorf("mediator at %s: %w", socket, err)
	}
	var reply api.HelloReply
	if err := api.Decode(body, &reply); err != nil {
		rpc.Close()
		return nil, nil, fmt.Errorf("mediator at %s: hello reply: %w", socket, err)
	}
	return rpc, &reply, nil
}

// Close ends the session; the mediator frees all its device memory.
func (c *Client) Close() error { return c.rpc.Close() }

// Session is the mediator's id for this session.
func (c *Client) Session() uint64 { return c.session }

// Devices lists the session's virtual devices.
func (c *Client) Devices() []api.DeviceInfo { return c.devices }

// Malloc allocates size bytes of device memory on virtual device dev. The
// memory reads as zeros until written.
func (c *Client) Malloc(dev int, size uint64) (Ptr, error) {
	body, err := c.rpc.Call(api.OpMalloc, nil, api.Encode(&api.Malloc{Device: uint32(dev), Size: size}))
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
	_, err := c.rpc.Call(api.OpFree, nil, api.Encode(&api.Free{Addr: uint64(p)}))
	return err
}

// Kernels lists the kernels the session can launch.
func (c *Client) Kernels() ([]api.KernelInfo, error) {
	return kernels(c.rpc)
}

func kernels(rpc *api.RPC) ([]api.KernelInfo, error) {
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
	return &Stream{c: c, id: r.Stream}, nil
}

// Stream is an in-order queue of device work.
type Stream struct {
	c  *Client
	id uint32

	mu      sync.Mutex
	pending []*api.Call
	err     error // first error found while reaping
}

// reapEvery bounds how many calls a stream remembers between reaps.
const reapEvery = 4096

func (s *Stream) add(call *api.Call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = append(s.pending, call)
	if len(s.pending) < reapEvery {
		return
	}
	live := s.pending[:0]
	for _, p := range s.pending {
		select {
		case <-p.Done():
			if s.err == nil && p.Err != nil {
				s.err = fmt.Errorf("%v: %w", p.Op, p.Err)
			}
		default:
			live = append(live, p)
		}
	}
	clear(s.pending[len(live):])
	s.pending = live
}

// CopyToDevice queues a copy of src to dst. src must stay unchanged until
// Synchronize returns.
func (s *Stream) CopyToDevice(dst Ptr, src []byte) {
	for off := 0; off < len(src); off += api.MaxChunk {
		end := min(off+api.MaxChunk, len(src))
		var e api.Encoder
		e.U32(s.id)
		e.U64(uint64(dst) + uint64(off))
		s.add(s.c.rpc.Go(api.OpCopyToDevice, nil, e.B, src[off:end]))
	}
}

// CopyFromDevice queues a copy of len(dst) bytes at src into dst, which holds
// them once Synchronize returns.
func (s *Stream) CopyFromDevice(dst []byte, src Ptr) {
	for off := 0; off < len(dst); off += api.MaxChunk {
		end := min(off+api.MaxChunk, len(dst))
		req := api.CopyFromDevice{Stream: s.id, Src: uint64(src) + uint64(off), Len: uint64(end - off)}
		s.add(s.c.rpc.Go(api.OpCopyFromDevice, dst[off:end], api.Encode(&req)))
	}
}

// CopyDevice queues a copy of n bytes from src to dst, device to device.
func (s *Stream) CopyDevice(dst, src Ptr, n uint64) {
	s.add(s.c.rpc.Go(api.OpCopyDevice, nil, api.Encode(&api.CopyDevice{Stream: s.id, Dst: uint64(dst), Src: uint64(src), Len: n})))
}

// Memset queues setting n bytes at dst to v.
func (s *Stream) Memset(dst Ptr, v byte, n uint64) {
	s.add(s.c.rpc.Go(api.OpMemset, nil, api.Encode(&api.Memset{Stream: s.id, Dst: uint64(dst), Value: v, Len: n})))
}

// Arg is a kernel argument: Buf, I64 or F32.
type Arg = api.Arg

// Buf passes a device buffer; the kernel may touch it up to the end of its
// allocation.
func Buf(p Ptr) Arg { return Arg{Kind: api.ArgBuffer, Bits: uint64(p)} }

// I64 passes an integer.
func I64(v int64) Arg { return Arg{Kind: api.ArgI64, Bits: uint64(v)} }

// F32 passes a float.
func F32(v float32) Arg { return Arg{Kind: api.ArgF32, Bits: api.F32Bits(v)} }

// Launch queues a kernel launch.
func (s *Stream) Launch(kernel string, args ...Arg) {
	s.add(s.c.rpc.Go(api.OpLaunch, nil, api.Encode(&api.Launch{Stream: s.id, Kernel: kernel, Args: args})))
}

// Synchronize waits for everything queued on the stream and returns the
// first error any of it met since the last Synchronize. The mediator
// answers each command once it has completed, in stream order, so waiting
// for those answers is enough: synchronizing sends nothing.
func (s *Stream) Synchronize() error {
	s.mu.Lock()
	pending, err := s.pending, s.err
	s.pending, s.err = nil, nil
	s.mu.Unlock()
	for _, p := range pending {
		if perr := p.Wait(); err == nil && perr != nil {
			err = fmt.Errorf("%v: %w", p.Op, perr)
		}
	}
	return err
}

// Destroy synchronizes and removes the stream.
func (s *Stream) Destroy() error {
	err := s.Synchronize()
	if _, derr := s.c.rpc.Call(api.OpStreamDestroy, nil, api.Encode(&api.StreamReq{Stream: s.id})); err == nil {
		err = derr
	}
	return err
}
