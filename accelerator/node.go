// Package accelerator is the node side of vgpu: it exports a host's
// accelerators over the network to mediators.
//
// It owns the devices (a Backend's), the frame table of each device (which
// mediator connection holds which 2 MiB frame), and the execution of
// requests: copies, fills and kernel launches on physical memory.
//
// Invariants:
//   - A connection acts for one tenant of one mediator. It may touch only the
//     frames it was granted; every extent of every request is checked against
//     the frame table before the device sees it.
//   - Requests of one connection execute in the order they arrived, one at a
//     time; connections execute concurrently. Replies go out in order.
//   - When a connection ends, cleanly or not, every frame it held is scrubbed
//     and freed. A frame is always scrubbed before it can change hands.
//   - A bad request gets an error reply and affects nothing else; only a
//     broken frame (which cannot be resynchronised) ends the connection.
//
// Kernel launches run in slices on each device's compute scheduler
// (sched.go), which shares device time among tenants by weight; a launch
// blocks its connection until its last slice has run.
//
// Lock order: Node.mu, then a frameTable's mu; a scheduler's mu is a leaf.
// Devices are not locked: the frame table guarantees connections touch
// disjoint memory.
package accelerator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// Device is one accelerator as the node drives it. Extents passed to it have
// been checked against the device's size and the caller's frames.
type Device interface {
	Info() api.DeviceInfo
	Write(xs []api.Extent, p []byte) error
	Read(xs []api.Extent, send func(parts ...[]byte) error) error
	Fill(xs []api.Extent, v byte) error
	Copy(dst, src []api.Extent) error
	Launch(k *kernels.Kernel, args []api.NodeArg) error
	Scrub(addr, n uint64) error
	Close() error
}

// HandshakeTimeout bounds how long a new connection may take to say Hello.
const HandshakeTimeout = 10 * time.Second

// queueDepth is how many requests of one connection may wait for execution
// before the node stops reading from it (backpressure onto the sender).
const queueDepth = 64

type device struct {
	Device
	frames   *frameTable
	sched    *scheduler // shares the device's time among tenants (sched.go)
	launches atomic.Uint64
}

// Node serves devices to mediators.
type Node struct {
	backend string
	devs    []*device
	log     logrus.FieldLogger

	nextOwner atomic.Uint64
	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// New returns a node that serves devs, whose memory sizes must be multiples
// of FrameSize. backend names them in status ("sim").
func New(backend string, devs []Device, log logrus.FieldLogger) (*Node, error) {
	n := &Node{backend: backend, log: log, conns: map[net.Conn]struct{}{}}
	for i, d := range devs {
		info := d.Info()
		if info.Index != uint32(i) || info.Memory < FrameSize || info.Memory%FrameSize != 0 {
			return nil, fmt.Errorf("device %d (%s): index %d, memory %d: want index %d and a multiple of %d bytes: %w",
				i, info.Name, info.Index, info.Memory, i, FrameSize, api.ErrInvalidArgument)
		}
		n.devs = append(n.devs, &device{Device: d, frames: newFrameTable(info.Memory), sched: newScheduler(wallClock{time.Now()})})
	}
	return n, nil
}

// Serve accepts mediator connections on l until Close.
func (n *Node) Serve(l net.Listener) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return fmt.Errorf("node closed: %w", api.ErrUnavailable)
	}
	n.listeners = append(n.listeners, l)
	n.mu.Unlock()
	for {
		nc, err := l.Accept()
		if err != nil {
			n.mu.Lock()
			closed := n.closed
			n.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept on %s: %w", l.Addr(), err)
		}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			nc.Close()
			return nil
		}
		n.conns[nc] = struct{}{}
		n.wg.Add(1)
		n.mu.Unlock()
		go func() {
			defer n.wg.Done()
			n.serveConn(nc)
			n.mu.Lock()
			delete(n.conns, nc)
			n.mu.Unlock()
		}()
	}
}

// Close stops accepting, ends every connection (freeing its frames) and
// closes the devices.
func (n *Node) Close() error {
	n.mu.Lock()
	n.closed = true
	for _, l := range n.listeners {
		l.Close()
	}
	for c := range n.conns {
		c.Close()
	}
	n.mu.Unlock()
	// Launches still queued fail, so their connections end promptly.
	for _, d := range n.devs {
		d.sched.close()
	}
	n.wg.Wait()
	var errs []error
	for _, d := range n.devs {
		errs = append(errs, d.Close())
	}
	return errors.Join(errs...)
}

// Status reports devices and their use.
func (n *Node) Status() api.NodeStatus {
	st := api.NodeStatus{Backend: n.backend}
	n.mu.Lock()
	st.Connections = len(n.conns)
	n.mu.Unlock()
	for _, d := range n.devs {
		total, free := d.frames.usage()
		info := d.Info()
		st.Devices = append(st.Devices, api.DeviceStatus{
			Index: info.Index, Name: info.Name, Memory: info.Memory,
			Used: uint64(total-free) * FrameSize, Frames: total, Free: free,
			Launches: d.launches.Load(),
		})
		st.Shares = append(st.Shares, d.sched.usage(info.Index)...)
	}
	return st
}

// conn is one mediator connection: one tenant's view of the node.
type conn struct {
	node    *Node
	c       *api.Conn
	owner   owner
	tenant  string
	share   tenantShare // tenant, weight and compute cap from the Hello
	log     logrus.FieldLogger
	pending atomic.Int64 // requests queued for or running in the executor
}

type request struct {
	h    api.Header
	body []byte
	pool *[]byte // body's buffer, returned to bodyPool after execution
}

// bodyPool recycles buffers for bulk bodies, so a stream of 1 MiB chunks
// does not allocate per chunk.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, api.MaxBody); return &b }}

func (n *Node) serveConn(nc net.Conn) {
	c := &conn{node: n, c: api.NewConn(nc), log: n.log.WithField("peer", nc.RemoteAddr().String())}
	defer nc.Close()
	if err := c.handshake(); err != nil {
		c.log.WithError(err).Info("handshake refused")
		return
	}
	c.log.Info("mediator connected")
	queue := make(chan request, queueDepth)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.execute(queue)
	}()
	err := c.readLoop(queue)
	close(queue)
	<-done
	c.releaseAll()
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		c.log.Info("mediator disconnected")
	} else {
		c.log.WithError(err).Info("connection dropped")
	}
}

func (c *conn) handshake() error {
	_ = c.c.NetConn().SetDeadline(time.Now().Add(HandshakeTimeout))
	defer c.c.NetConn().SetDeadline(time.Time{})
	h, err := c.c.ReadHeader()
	if err != nil {
		return err
	}
	body := make([]byte, h.Len)
	if err := c.c.ReadBody(body); err != nil {
		return err
	}
	var hello api.Hello
	switch {
	case h.Op != api.OpHello:
		err = fmt.Errorf("first request is %v, want hello: %w", h.Op, api.ErrProtocol)
	case api.Decode(body, &hello) != nil:
		err = fmt.Errorf("hello: %w", api.Decode(body, &hello))
	case hello.Magic != api.Magic:
		err = fmt.Errorf("hello magic %#x, want %#x: %w", hello.Magic, api.Magic, api.ErrProtocol)
	case hello.Version != api.Version:
		err = fmt.Errorf("protocol version %d, this node speaks %d: %w", hello.Version, api.Version, api.ErrProtocol)
	case hello.Role != api.RoleMediator:
		err = fmt.Errorf("role %d may not connect to a node, only mediators (%d): %w", hello.Role, api.RoleMediator, api.ErrPermissionDenied)
	}
	if err != nil {
		_ = c.c.ReplyError(h, err)
		return err
	}
	c.owner = owner(c.node.nextOwner.Add(1))
	c.tenant = hello.Tenant
	c.share = tenantShare{name: hello.Tenant, weight: hello.Weight, computeMax: hello.ComputeMax,
		waiting: func() bool { return c.pending.Load() > 1 }} // more than the request in execution
	c.log = c.log.WithField("tenant", hello.Tenant)
	reply := api.HelloReply{Version: api.Version, Session: uint64(c.owner)}
	for _, d := range c.node.devs {
		reply.Devices = append(reply.Devices, d.Info())
	}
	return c.c.Reply(h, api.Encode(&reply))
}

func (c *conn) readLoop(queue chan<- request) error {
	for {
		h, err := c.c.ReadHeader()
		if err != nil {
			return err
		}
		if h.Flags&api.FlagReply != 0 {
			return fmt.Errorf("mediator sent a reply (%v, id %d) to a node: %w", h.Op, h.ID, api.ErrProtocol)
		}
		r := request{h: h}
		if h.Len > 4096 {
			r.pool = bodyPool.Get().(*[]byte)
			r.body = (*r.pool)[:h.Len]
		} else {
			r.body = make([]byte, h.Len)
		}
		if err := c.c.ReadBody(r.body); err != nil {
			return err
		}
		// A small request that finds nothing queued or running is executed
		// here: handing it to the executor would only add a goroutine
		// switch to its latency. Order holds because only this goroutine
		// queues, so pending == 0 means every earlier request is done.
		// Launches always go to the executor: they wait for the device's
		// scheduler, and reading on meanwhile shows it that the tenant has
		// more work queued (tenantShare.waiting).
		if r.pool == nil && c.pending.Load() == 0 && h.Op != api.OpNodeLaunch {
			if !c.run(r) {
				return fmt.Errorf("reply to %v: connection broken: %w", h.Op, net.ErrClosed)
			}
			continue
		}
		c.pending.Add(1)
		queue <- r
	}
}

func (c *conn) execute(queue <-chan request) {
	ok := true
	for r := range queue {
		if ok {
			ok = c.run(r)
		} else if r.pool != nil {
			bodyPool.Put(r.pool)
		}
		c.pending.Add(-1)
	}
}

// run executes one request and answers it; false means the reply could not
// be sent and the connection is broken (it is closed, so the reader stops).
func (c *conn) run(r request) bool {
	defer func() {
		if r.pool != nil {
			bodyPool.Put(r.pool)
		}
	}()
	err := c.do(r)
	if err == nil {
		return true
	}
	c.log.WithError(err).WithField("op", r.h.Op).Debug("request failed")
	if werr := c.c.ReplyError(r.h, err); werr != nil {
		c.c.Close()
		return false
	}
	return true
}

func (c *conn) device(i uint32) (*device, error) {
	if int(i) >= len(c.node.devs) {
		return nil, fmt.Errorf("device %d: node has %d: %w", i, len(c.node.devs), api.ErrInvalidArgument)
	}
	return c.node.devs[i], nil
}

// do executes one request and sends its reply; a returned error has not been
// replied to yet.
func (c *conn) do(r request) error {
	switch r.h.Op {
	case api.OpKernels:
		return c.c.Reply(r.h, api.Encode(&api.KernelList{Kernels: kernels.Catalog()}))
	case api.OpNodeStatus:
		b, err := json.Marshal(c.node.Status())
		if err != nil {
			return fmt.Errorf("encode status: %v: %w", err, api.ErrInternal)
		}
		return c.c.Reply(r.h, b)
	case api.OpNodeAlloc:
		var m api.NodeAlloc
		if err := api.Decode(r.body, &m); err != nil {
			return fmt.Errorf("%v: %w", r.h.Op, err)
		}
		d, err := c.device(m.Device)
		if err != nil {
			return err
		}
		frames, err := d.frames.alloc(c.owner, int(m.Count))
		if err != nil {
			return fmt.Errorf("%s: %w", d.Info().Name, err)
		}
		return c.c.Reply(r.h, api.Encode(&api.NodeFrames{Device: m.Device, Frames: frames}))
	case api.OpNodeFree:
		var m api.NodeFrames
		if err := api.Decode(r.body, &m); err != nil {
			return fmt.Errorf("%v: %w", r.h.Op, err)
		}
		d, err := c.device(m.Device)
		if err != nil {
			return err
		}
		if err := d.frames.checkOwned(c.owner, m.Frames); err != nil {
			return fmt.Errorf("%s: free: %w", d.Info().Name, err)
		}
		if err := c.scrubAndRelease(d, m.Frames); err != nil {
			return err
		}
		return c.c.Reply(r.h)
	}
	return c.doAccess(r)
}

// doAccess executes the requests that touch device memory.
func (c *conn) doAccess(r request) error {
	var (
		dev uint32
		m   api.NodeAccess
		cp  api.NodeCopy
		l   api.NodeLaunch
		err error
	)
	switch r.h.Op {
	case api.OpNodeWrite, api.OpNodeRead, api.OpNodeFill:
		err = api.Decode(r.body, &m)
		dev = m.Device
	case api.OpNodeCopy:
		err = api.Decode(r.body, &cp)
		dev = cp.Device
	case api.OpNodeLaunch:
		err = api.Decode(r.body, &l)
		dev = l.Device
	default:
		return fmt.Errorf("unknown operation %v: %w", r.h.Op, api.ErrProtocol)
	}
	if err != nil {
		return fmt.Errorf("%v: %w", r.h.Op, err)
	}
	d, err := c.device(dev)
	if err != nil {
		return err
	}
	name := d.Info().Name
	switch r.h.Op {
	case api.OpNodeWrite:
		if err := d.frames.checkAccess(c.owner, m.Extents); err != nil {
			return fmt.Errorf("%s: write: %w", name, err)
		}
		if err := d.Write(m.Extents, m.Payload); err != nil {
			return err
		}
		return c.c.Reply(r.h)
	case api.OpNodeRead:
		if err := d.frames.checkAccess(c.owner, m.Extents); err != nil {
			return fmt.Errorf("%s: read: %w", name, err)
		}
		if n := api.ExtentsLen(m.Extents); n > api.MaxChunk {
			return fmt.Errorf("%s: read of %d bytes exceeds the %d-byte chunk limit: %w", name, n, api.MaxChunk, api.ErrInvalidArgument)
		}
		return d.Read(m.Extents, func(parts ...[]byte) error { return c.c.Reply(r.h, parts...) })
	case api.OpNodeFill:
		if err := d.frames.checkAccess(c.owner, m.Extents); err != nil {
			return fmt.Errorf("%s: fill: %w", name, err)
		}
		if err := d.Fill(m.Extents, m.Value); err != nil {
			return err
		}
		return c.c.Reply(r.h)
	case api.OpNodeCopy:
		if err := d.frames.checkAccess(c.owner, cp.Dst); err != nil {
			return fmt.Errorf("%s: copy destination: %w", name, err)
		}
		if err := d.frames.checkAccess(c.owner, cp.Src); err != nil {
			return fmt.Errorf("%s: copy source: %w", name, err)
		}
		if err := d.Copy(cp.Dst, cp.Src); err != nil {
			return err
		}
		return c.c.Reply(r.h)
	default: // OpNodeLaunch
		if err := c.launch(d, &l); err != nil {
			return err
		}
		return c.c.Reply(r.h)
	}
}

func (c *conn) launch(d *device, l *api.NodeLaunch) error {
	k, err := kernels.Lookup(l.Kernel)
	if err != nil {
		return err
	}
	kinds := make([]api.ArgKind, len(l.Args))
	for i, a := range l.Args {
		kinds[i] = a.Kind
	}
	if err := k.CheckKinds(kinds); err != nil {
		return err
	}
	for i, a := range l.Args {
		if a.Kind != api.ArgBuffer {
			continue
		}
		if err := d.frames.checkAccess(c.owner, a.Extents); err != nil {
			return fmt.Errorf("%s: %s argument %d (%s): %w", d.Info().Name, l.Kernel, i, k.Info.Params[i].Name, err)
		}
	}
	if err := d.launch(c.share, k, l.Args); err != nil {
		return fmt.Errorf("%s: %w", d.Info().Name, err)
	}
	d.launches.Add(1)
	return nil
}

// scrubAndRelease zeroes frames, in runs of contiguous frames, then frees them.
func (c *conn) scrubAndRelease(d *device, frames []uint64) error {
	for i := 0; i < len(frames); {
		j := i + 1
		for j < len(frames) && frames[j] == frames[j-1]+FrameSize {
			j++
		}
		if err := d.Scrub(frames[i], uint64(j-i)*FrameSize); err != nil {
			return err
		}
		i = j
	}
	d.frames.release(frames)
	return nil
}

func (c *conn) releaseAll() {
	for _, d := range c.node.devs {
		frames := d.frames.ownedBy(c.owner)
		if len(frames) == 0 {
			continue
		}
		if err := c.scrubAndRelease(d, frames); err != nil {
			c.log.WithError(err).Error("scrub on disconnect failed; frames stay held")
			continue
		}
		c.log.WithField("frames", len(frames)).Debug("released frames of closed connection")
	}
}
