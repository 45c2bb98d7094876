// Package accelerator is the node side of vgpu: it exports a host's
// accelerators over the network to mediators.
//
// It owns the devices (a Backend's), the frame table of each device (which
// mediator connection holds which 2 MiB frame, and which frames are sealed),
// the node-wide index of sealed frames by content (content.go), and the
// execution of requests: copies, fills, kernel launches, batches of them,
// graphs of launches registered once and run many times (graph.go),
// sealing and deduplication on physical memory.
//
// Invariants:
//   - A connection acts for one tenant of one mediator. It may touch only the
//     frames it was granted; every extent of every request is checked against
//     the frame table before the device sees it. The one exception is the
//     source of a dedup: a sealed frame of any connection, read under the
//     content index's lock (content.go).
//   - A sealed frame is read-only: every request that would change it
//     (write, fill, copy destination, dedup destination, a launch's buffer
//     that its kernel may write) is refused with api.ErrPermissionDenied.
//   - Requests of one connection execute in the order they arrived, one at a
//     time; connections execute concurrently. Replies go out in order. A
//     request that finds its connection idle runs on the reader (a write's
//     payload then goes straight into device memory, write.go); the others
//     run in turn on the connection's executor.
//   - A batch executes its commands in that order too, every one of them,
//     and is answered once (batch.go). A graph's run executes its launches
//     in order up to the first that fails, and checks and plans all it can
//     before the first writes (graph.go).
//   - A connection's graphs are its own: it alone runs or frees them, and
//     they end with it. A graph's extents are checked against the frame
//     table at every run, so a frame that changed hands since its
//     registration is never touched through it.
//   - When a connection ends, cleanly or not, every frame it held is scrubbed
//     and freed; one that attached first waits for a reclaim for the
//     reattach grace (reattach.go), and is scrubbed and freed after it. A frame is always taken out of the content index, unsealed,
//     unaliased (its aliases given copies) and scrubbed before it can change
//     hands.
//   - A frame aliased to a sealed frame's memory (content.go) gets memory
//     of its own, with a copy of the bytes, before any request writes it.
//   - A bad request gets an error reply and affects nothing else; only a
//     broken frame (which cannot be resynchronised) ends the connection.
//
// Kernel launches, and fills and copies of more than a piece (pieceBytes),
// run in slices on each device's compute scheduler (sched.go), which shares
// device time among tenants by weight, serving decode work first within
// the shares; a launch, a batch's run of consecutive launches (launch.go),
// a graph's run (graph.go), and such a fill or copy (memwork.go) each
// block their connection until their last slice has run. Smaller
// fills and copies, hashing for seals, and copying frames for dedups and
// for aliased frames about to be written or losing their source, done on
// the connection's goroutine, are charged to its tenant as device time too,
// once they add up to a step (memwork.go).
//
// Lock order: Node.mu; then contentIndex.mu, then a frameTable's mu; a
// scheduler's mu is a leaf. Devices are not locked: the frame table
// guarantees connections write disjoint memory, and sealed frames, which
// others may read, are written by no one. Aliases are mapped and unmapped
// only under contentIndex.mu; a remapping that others may be reading
// through (a source freed under its aliases) keeps the bytes they see
// (content.go).
package accelerator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Device is one accelerator as the node drives it. Extents passed to it have
// been checked against the device's size and the caller's frames.
type Device interface {
	Info() api.DeviceInfo
	Write(xs []api.Extent, p []byte) error
	// WriteFrom is Write with the bytes read from r: exactly the extents'
	// total length, straight into device memory.
	WriteFrom(xs []api.Extent, r io.Reader) error
	// Read hands the memory of xs, in order, to send, before it returns;
	// it keeps neither xs nor send (a connection reuses both, conn.readExtents).
	Read(xs []api.Extent, send func(parts ...[]byte) error) error
	Fill(xs []api.Extent, v byte) error
	Copy(dst, src []api.Extent) error
	// Prepare readies a launch of k to run in slices of about maxWork
	// element operations, writing nothing yet: the caller steps the plan to
	// its end, then calls finish unless it is nil (sim.Device.Prepare).
	Prepare(k *kernels.Kernel, args []api.NodeArg, maxWork int) (p *kernels.Plan, finish func() error, err error)
	Scrub(addr, n uint64) error
	Close() error
}

// aliaser is a Device that can make a range read another's physical memory
// (sim.Device.Alias), which the node uses to store identical sealed frames
// once (content.go). Devices without it get copies.
type aliaser interface {
	// Alias maps [dst, dst+n) onto the memory of [src, src+n), freeing
	// dst's own.
	Alias(dst, src, n uint64) error
	// Unalias maps [dst, dst+n) back onto its own memory, which first gets
	// the bytes the range shows now if keep, else reads zeros.
	Unalias(dst, n uint64, keep bool) error
}

// gpuReporter is a Device backed by a GPU that NVML can describe (the cuda
// backend, as vgpu-node wires it); the node puts what it says in status.
type gpuReporter interface {
	GPUStatus() *api.GPUStatus
}

func gpuStatus(d Device) *api.GPUStatus {
	if r, ok := d.(gpuReporter); ok {
		return r.GPUStatus()
	}
	return nil
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
	aliased  atomic.Int64 // frames aliased to another's memory (content.go)
	// allocMu is held by an allocation until it has its frames, so that
	// none takes the frames another reclaimed (content.go). unscrubbed
	// holds retained frames a reclaim took out of the index but failed to
	// scrub, for the next one.
	allocMu    sync.Mutex
	unscrubbed []uint64
}

// Node serves devices to mediators.
type Node struct {
	backend string
	boot    string // drawn at start (api.NodeStatus.Boot)
	devs    []*device
	log     logrus.FieldLogger

	content   *contentIndex // sealed frames by contents (content.go)
	objects   *objectTable  // shared objects this node is home of (shared.go)
	nextOwner atomic.Uint64
	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	tenants   map[string]*tenantLimits // of tenants with live connections (limits.go)
	// grace is how long an attached connection's frames are kept after it
	// drops, parked by owner until reclaimed (reattach.go).
	grace  time.Duration
	parked map[owner]*parkedConn
	// attached holds the live connections that attached, by owner, until
	// they end; parkedNote is closed and replaced whenever one is parked,
	// so that a reclaim racing its predecessor's drop can wait for it
	// (reattach.go).
	attached   map[owner]*conn
	parkedNote chan struct{}
	expired    atomic.Uint64 // parked connections released at the end of their grace
	// graphLimits bounds each connection's graphs (graph.go; tests lower it).
	graphLimits graphLimits
	// requests is told of each reply to a request (SimOptions.Requests);
	// set before Serve.
	requests wire.ReplyObserver
	closed   bool
	wg       sync.WaitGroup
}

// New returns a node that serves devs, whose memory sizes must be multiples
// of FrameSize. backend names them in status ("sim").
func New(backend string, devs []Device, log logrus.FieldLogger) (*Node, error) {
	n := &Node{backend: backend, boot: bootID(), log: log, content: newContentIndex(), objects: newObjectTable(), conns: map[net.Conn]struct{}{},
		tenants: map[string]*tenantLimits{}, grace: DefaultReattachGrace, parked: map[owner]*parkedConn{}, attached: map[owner]*conn{}, parkedNote: make(chan struct{}), graphLimits: graphLimits{MaxNodeGraphs, MaxNodeGraphLaunches, MaxNodeGraphExtents}}
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
	// Nothing is parked from here on: the frames kept for a reclaim go now.
	n.releaseParked()
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

// bootID draws a node's boot id: 64 random bits, so that two starts of a
// node share one with a chance of 2⁻⁶⁴.
func bootID() string {
	return fmt.Sprintf("%016x", rand.Uint64())
}

// Status reports devices and their use.
func (n *Node) Status() api.NodeStatus {
	st := api.NodeStatus{Backend: n.backend, Boot: n.boot, Coherence: n.objects.status()}
	n.mu.Lock()
	st.Connections = len(n.conns)
	n.mu.Unlock()
	for _, d := range n.devs {
		total, free, retained := d.frames.usage()
		info := d.Info()
		st.Devices = append(st.Devices, api.DeviceStatus{
			Index: info.Index, Name: info.Name, Memory: info.Memory,
			Used: uint64(total-free-retained) * FrameSize, Frames: total, Free: free + retained, Retained: retained,
			Launches: d.launches.Load(), GPU: gpuStatus(d.Device),
		})
		st.Shares = append(st.Shares, d.sched.usage(info.Index)...)
	}
	return st
}

// conn is one mediator connection: one tenant's view of the node.
type conn struct {
	node    *Node
	c       *wire.Conn
	owner   owner
	tenant  string
	share   tenantShare // its tenant, whose weight and compute cap are in share.limits
	log     logrus.FieldLogger
	pending atomic.Int64 // requests queued for or running in the executor
	exports int          // objects exported and not ended; under objectTable.mu
	// exportExtents is the extents of those objects, and of one being
	// made; under objectTable.mu.
	exportExtents int
	pushes        *pusher // from the handshake on (push.go)
	graphs        connGraphs
	// token is the secret a reclaim of this connection's frames must
	// present, once it attached (reattach.go); grace, if not 0, is the
	// shorter grace it asked for. Set and read by its requests, which run
	// one at a time, and by end after them.
	token string
	grace time.Duration
	// A small read's request body, extents and reply, kept for the next
	// one (#25): reads run one at a time (inline when idle, else on the
	// executor) and keep nothing of their request once answered. body is
	// the reader's; the rest belong to the read that runs.
	readBody    [readBodyRoom]byte
	readExtents [4]api.Extent
	readH       wire.Header
	readReply   func(parts ...[]byte) error // replies to readH
}

// readBodyRoom is room for a read request of a few extents.
const readBodyRoom = 128

func (c *conn) replyRead(parts ...[]byte) error { return c.c.Reply(c.readH, parts...) }

type request struct {
	h    wire.Header
	body []byte
	pool *[]byte // body's buffer, returned to bodyPool after execution
}

// bodyPool recycles buffers for bulk bodies, so a stream of 1 MiB chunks
// does not allocate per chunk.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, wire.MaxBody); return &b }}

func (n *Node) serveConn(nc net.Conn) {
	c := &conn{node: n, c: wire.NewConn(nc), log: n.log.WithField("peer", nc.RemoteAddr().String())}
	c.readReply = c.replyRead
	if n.requests != nil {
		c.c.Observe(n.requests)
	}
	defer nc.Close()
	if err := c.handshake(); err != nil {
		c.log.WithError(err).Info("handshake refused")
		return
	}
	c.log.Info("mediator connected")
	c.pushes = startPusher(c.c, c.log)
	defer c.pushes.stop()
	queue := make(chan request, queueDepth)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.execute(queue)
	}()
	err := c.readLoop(queue)
	close(queue)
	<-done
	c.end() // releases its frames, or keeps them for a reclaim (reattach.go)
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		c.log.Info("mediator disconnected")
	} else {
		c.log.WithError(err).Info("connection dropped")
	}
}

func (c *conn) handshake() error {
	h, hello, err := api.ReadHello(c.c, time.Now().Add(HandshakeTimeout), "node")
	if err == nil && hello.Role != api.RoleMediator {
		err = fmt.Errorf("role %d may not connect to a node, only mediators (%d): %w", hello.Role, api.RoleMediator, api.ErrPermissionDenied)
	}
	if err != nil {
		if h.Op != 0 {
			_ = c.c.ReplyError(h, err)
		}
		return err
	}
	c.owner = owner(c.node.nextOwner.Add(1))
	c.tenant = hello.Tenant
	c.log = c.log.WithField("tenant", hello.Tenant)
	reply := api.HelloReply{Version: api.Version, Session: uint64(c.owner)}
	for _, d := range c.node.devs {
		reply.Devices = append(reply.Devices, d.Info())
	}
	if err := c.c.Reply(h, api.Encode(&reply)); err != nil {
		return err
	}
	// From here the connection ends in releaseAll, which leaves the tenant.
	limits, disagree := c.node.joinTenant(hello.Tenant, c.owner, limit{hello.Weight, hello.ComputeMax})
	if disagree {
		w, cmax := limits.get()
		c.log.WithFields(logrus.Fields{"weight": hello.Weight, "compute_max": hello.ComputeMax, "weight_in_force": w, "compute_max_in_force": cmax}).
			Warn("mediators give this tenant different weights or compute caps (do they share one quota file?): the least count for all its connections")
	}
	c.share = tenantShare{name: hello.Tenant, limits: limits,
		waiting: func() bool { return c.pending.Load() > 1 }} // more than the request in execution
	return nil
}

func (c *conn) readLoop(queue chan<- request) error {
	// Replies to requests run here stay buffered while the next request has
	// already arrived, so a burst is answered in a few writes (wire.Conn.Hold).
	held := false
	release := func() {
		if held {
			_ = c.c.Release() // a broken connection fails the next read
			held = false
		}
	}
	defer release()
	for {
		h, err := c.c.ReadHeader()
		if err != nil {
			return err
		}
		if h.Flags&wire.FlagReply != 0 {
			return fmt.Errorf("mediator sent a reply (%v, id %d) to a node: %w", h.Op, h.ID, api.ErrProtocol)
		}
		// A request that finds nothing queued or running is executed here:
		// handing it to the executor would only add a goroutine switch to
		// its latency, and a write's payload can go straight from the
		// connection into device memory (write.go). Order holds because
		// only this goroutine queues, so pending == 0 means every earlier
		// request is done.
		idle := c.pending.Load() == 0
		if h.Op == api.OpNodeInvalAck || h.Op == api.OpNodeRevokedAck {
			// Acknowledgements are answered here even while the executor is
			// busy: it may be waiting for one (shared.go). Replies held for
			// a burst go out first: an acknowledgement may end it.
			release()
			r := request{h: h, body: make([]byte, h.Len)}
			if err := c.c.ReadBody(r.body); err != nil {
				return err
			}
			if !c.run(r) {
				return fmt.Errorf("reply to %v: connection broken: %w", h.Op, net.ErrClosed)
			}
			continue
		}
		if idle && h.Op == api.OpNodeWrite {
			more := c.c.Arrived() >= int(h.Len)+wire.HeaderSize
			if !more {
				release() // the payload may take a while to arrive
			} else if !held {
				c.c.Hold()
				held = true
			}
			if err := c.writeDirect(h); err != nil {
				return err
			}
			if !more {
				release()
			}
			continue
		}
		r := request{h: h}
		if h.Len > 4096 {
			r.pool = bodyPool.Get().(*[]byte)
			r.body = (*r.pool)[:h.Len]
		} else if idle && h.Op == api.OpNodeRead && h.Len <= readBodyRoom {
			// Run here below, before the next request is read.
			r.body = c.readBody[:h.Len]
		} else {
			r.body = make([]byte, h.Len)
		}
		if err := c.c.ReadBody(r.body); err != nil {
			return err
		}
		// Other bulk requests go to the executor, so the reader goes on
		// reading. So do those that wait for the device's scheduler
		// (waitsForDevice), and writes of shared objects, which wait for
		// acknowledgements this reader may have to take, as does the
		// unexport of a connection that exports objects: ending one tells
		// its importers, this connection among them perhaps.
		if idle && r.pool == nil && !waitsForDevice(h.Op, r.body) && h.Op != api.OpNodeObjWrite && h.Op != api.OpNodeRevoke &&
			(h.Op != api.OpNodeUnexport || !c.node.objects.exporting(c)) {
			// Only what this reader has buffered counts: asking the kernel
			// would cost a system call per small request, and a burst's
			// next frames are read along with this one.
			more := c.c.Buffered() >= wire.HeaderSize
			if more && !held {
				c.c.Hold()
				held = true
			}
			if !c.run(r) {
				return fmt.Errorf("reply to %v: connection broken: %w", h.Op, net.ErrClosed)
			}
			if !more {
				release()
			}
			continue
		}
		release() // the executor answers from here on
		c.pending.Add(1)
		queue <- r
	}
}

// waitsForDevice says whether a request of op with body is device work
// that waits for the device's scheduler: a launch, a batch, a graph's
// run, a fill or copy of more than one piece (memwork.go), a seal or
// dedup, whose work is charged with empty jobs as it adds up, a publish or
// export, which copies an object's bytes (shared.go), or a free or an
// allocation, whose scrubbing (of frames retained, for an allocation:
// content.go) is charged so too. They run on the executor, so that the
// reader reading on meanwhile shows the scheduler that the tenant has more
// work queued (tenantShare.waiting), and takes acknowledgements (shared.go)
// while a capped tenant's job waits its turn. Smaller fills and copies
// (a mediator zeroes every small allocation with a fill) run on the calling
// goroutine, where a hand-off to the executor would cost more than they do.
func waitsForDevice(op wire.Op, body []byte) bool {
	switch op {
	case api.OpNodeLaunch, api.OpNodeBatch, api.OpNodeGraphRun, api.OpNodeSeal, api.OpNodeDedup, api.OpNodePublish, api.OpNodeExport, api.OpNodeFree, api.OpNodeAlloc:
		return true
	case api.OpNodeFill, api.OpNodeCopy:
		return !movesOnePiece(body)
	}
	return false
}

// movesOnePiece says whether the body of a fill or copy request (whose
// destination extents come first, after the device) moves pieceBytes or
// less, without decoding all of it. A body that does not decode says yes:
// its error is answered at once.
func movesOnePiece(body []byte) bool {
	d := wire.NewDecoder(body)
	d.U32()
	var n uint64
	for range d.Len(16) {
		d.U64()
		l := d.U64()
		if l > pieceBytes-n {
			return false
		}
		n += l
	}
	return true
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
	return c.answer(r.h, c.do(r))
}

// answer sends the error reply to request h that err calls for, if any;
// false means it could not be sent and the connection is broken (it is
// closed, so the reader stops).
func (c *conn) answer(h wire.Header, err error) bool {
	if err == nil {
		return true
	}
	c.log.WithError(err).WithField("op", h.Op).Debug("request failed")
	if werr := c.c.ReplyError(h, err); werr != nil {
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

// decode decodes the body of an op request into m.
func decode(op wire.Op, body []byte, m api.Message) error {
	if err := api.Decode(body, m); err != nil {
		return fmt.Errorf("%v: %w", op, err)
	}
	return nil
}

// do executes one request and sends its reply; a returned error has not been
// replied to yet.
func (c *conn) do(r request) error {
	if ok, err := c.objectOp(r); ok {
		return err
	}
	if ok, err := c.graphOp(r); ok {
		return err
	}
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
		if err := decode(r.h.Op, r.body, &m); err != nil {
			return err
		}
		d, err := c.device(m.Device)
		if err != nil {
			return err
		}
		frames, err := c.alloc(d, int(m.Count))
		if err != nil {
			return fmt.Errorf("%s: %w", d.Info().Name, err)
		}
		return c.c.Reply(r.h, api.Encode(&api.NodeFrames{Device: m.Device, Frames: frames}))
	case api.OpNodeFree, api.OpNodeSeal:
		var m api.NodeFrames
		if err := decode(r.h.Op, r.body, &m); err != nil {
			return err
		}
		d, err := c.device(m.Device)
		if err != nil {
			return err
		}
		if r.h.Op == api.OpNodeSeal {
			return c.replySeal(r.h, d, m.Frames)
		}
		if err := d.frames.checkOwned(c.owner, m.Frames); err != nil {
			return fmt.Errorf("%s: free: %w", d.Info().Name, err)
		}
		if err := c.scrubAndRelease(d, m.Frames); err != nil {
			return err
		}
		return c.c.Reply(r.h)
	case api.OpNodeDedup:
		var m api.NodeDedup
		if err := decode(r.h.Op, r.body, &m); err != nil {
			return err
		}
		d, err := c.device(m.Device)
		if err != nil {
			return err
		}
		reply, err := c.dedup(d, &m)
		if err != nil {
			return err
		}
		return c.c.Reply(r.h, api.Encode(reply))
	case api.OpNodeRead:
		// Decoded with the message's type known, as decode cannot (it
		// takes an interface): neither the decoder nor the message
		// escapes to the heap on the small read's path (#25).
		var m api.NodeAccess
		dec := wire.NewDecoder(r.body)
		api.DecodeNodeAccessInto(dec, &m, c.readExtents[:])
		if err := dec.Finish(); err != nil {
			return fmt.Errorf("%v: %w", r.h.Op, err)
		}
		d, err := c.device(m.Device)
		if err != nil {
			return err
		}
		name := d.Info().Name
		if err := d.frames.checkAccess(c.owner, m.Extents); err != nil {
			return fmt.Errorf("%s: read: %w", name, err)
		}
		if n := api.ExtentsLen(m.Extents); n > wire.MaxChunk {
			return fmt.Errorf("%s: read of %d bytes exceeds the %d-byte chunk limit: %w", name, n, wire.MaxChunk, api.ErrInvalidArgument)
		}
		c.readH = r.h
		return d.Read(m.Extents, c.readReply)
	case api.OpNodeBatch:
		return c.batch(r.h, r.body)
	case api.OpNodeAttach:
		return c.attach(r.h, r.body)
	case api.OpNodeWrite, api.OpNodeFill, api.OpNodeCopy, api.OpNodeLaunch:
		if err := c.apply(r.h.Op, r.body); err != nil {
			return err
		}
		return c.c.Reply(r.h)
	}
	return fmt.Errorf("unknown operation %v: %w", r.h.Op, api.ErrProtocol)
}

// apply decodes and executes a command that changes device memory and
// answers nothing: a write, fill, copy or launch, as a request of its own or
// as a command of a batch.
func (c *conn) apply(op wire.Op, body []byte) error {
	if op == api.OpNodeLaunch {
		var arena api.LaunchArena
		d, l, err := c.checkLaunch(&arena, body)
		if err != nil {
			return err
		}
		return d.launchAll(c.share, []checkedLaunch{l})[0]
	}
	var (
		dev uint32
		m   api.NodeAccess
		cp  api.NodeCopy
		err error
	)
	if op == api.OpNodeCopy {
		err = decode(op, body, &cp)
		dev = cp.Device
	} else {
		err = decode(op, body, &m)
		dev = m.Device
	}
	if err != nil {
		return err
	}
	d, err := c.device(dev)
	if err != nil {
		return err
	}
	name := d.Info().Name
	switch op {
	case api.OpNodeWrite:
		if err := c.checkWrite(d, m.Extents, len(m.Payload)); err != nil {
			return err
		}
		return d.Write(m.Extents, m.Payload)
	case api.OpNodeFill:
		if err := d.frames.checkWrite(c.owner, m.Extents); err != nil {
			return fmt.Errorf("%s: fill: %w", name, err)
		}
		if err := c.node.content.own(c.share, d, m.Extents); err != nil {
			return err
		}
		return d.fillFor(c.share, m.Extents, m.Value)
	default: // OpNodeCopy
		if err := d.frames.checkWrite(c.owner, cp.Dst); err != nil {
			return fmt.Errorf("%s: copy destination: %w", name, err)
		}
		if err := d.frames.checkAccess(c.owner, cp.Src); err != nil {
			return fmt.Errorf("%s: copy source: %w", name, err)
		}
		if err := c.node.content.own(c.share, d, cp.Dst); err != nil {
			return err
		}
		return d.copyFor(c.share, cp.Dst, cp.Src)
	}
}

// alloc grants n frames of d to c. Where too few are free but enough are
// retained (content.go), it reclaims the difference first, and charges
// that work to c's tenant once other allocations may go on.
func (c *conn) alloc(d *device, n int) ([]uint64, error) {
	frames, took, err := c.allocLocked(d, n)
	if took > 0 {
		d.chargeOff(c.share, took)
	}
	return frames, err
}

// allocLocked is alloc but for the charge, which it returns, under
// d.allocMu.
func (c *conn) allocLocked(d *device, n int) (frames []uint64, took time.Duration, err error) {
	d.allocMu.Lock()
	defer d.allocMu.Unlock()
	for {
		if frames, err = d.frames.alloc(c.owner, n); !errors.Is(err, api.ErrOutOfMemory) {
			return frames, took, err
		}
		total, free, retained := d.frames.usage()
		if retained == 0 {
			return nil, took, err
		}
		if n > free+retained {
			return nil, took, fmt.Errorf("allocate %d frames (%d MiB): %d of %d free, %d more retained: %w",
				n, n*FrameSize>>20, free, total, retained, api.ErrOutOfMemory)
		}
		got, work, err := c.node.content.reclaim(d, n-free, true)
		took += work
		if err != nil {
			return nil, took, fmt.Errorf("reclaim %d retained frames: %w", n-free, err)
		}
		if got == 0 {
			return nil, took, fmt.Errorf("allocate %d frames: %d of %d free, %d retained but none to reclaim: %w", n, free, total, retained, api.ErrInternal)
		}
	}
}

// scrubAndRelease frees frames: it retains those the content index keeps,
// and takes the others out of it (unsealing and unaliasing them, and
// giving their aliases copies), scrubs and releases them: device work of
// c's tenant, charged once the frames are free.
func (c *conn) scrubAndRelease(d *device, frames []uint64) error {
	c.node.dropObjects(c, d, frames)
	scrub, kept, err := c.node.content.forget(c.share, c.owner, d, frames)
	if err != nil {
		return err
	}
	if err := d.offRunner(c.share, func() error { return d.scrubRelease(scrub) }); err != nil {
		c.node.content.unkeep(c.owner, c.tenant, kept) // the free failed: all stay c's
		return err
	}
	c.trimRetained(d)
	return nil
}

// trimRetained gives up the frames d retains past the node's bound
// (LimitRetention), least recently used first, as device work of c's
// tenant, whose free went past it. A failure is logged: the free is done,
// and frames whose scrub failed wait for the next reclaim.
func (c *conn) trimRetained(d *device) {
	if c.node.content.overRetained(d) == 0 {
		return
	}
	// Counted again under allocMu: two frees must not both give up what
	// one went past.
	d.allocMu.Lock()
	n := c.node.content.overRetained(d)
	var took time.Duration
	var err error
	if n > 0 {
		_, took, err = c.node.content.reclaim(d, n, false)
	}
	d.allocMu.Unlock()
	d.chargeOff(c.share, took)
	if err != nil {
		c.log.WithError(err).WithField("frames", n).Warn("giving up retained frames past the bound failed")
	}
}

// scrubRelease zeroes frames, ascending, in runs of contiguous frames, then
// marks them free. Nothing else may use them meanwhile.
func (d *device) scrubRelease(frames []uint64) error {
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
	// Nothing else uses c.share now: its reader and executor are done.
	c.share.ending = true
	defer c.node.leaveTenant(c.tenant, c.owner)
	c.node.dropObjects(c, nil, nil)
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
