package mediator

import (
	"fmt"
	"sort"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/memory"
)

// command is one queued stream operation, decoded and not yet translated.
type command struct {
	h       api.Header
	stream  uint32
	toDev   api.CopyToDevice
	fromDev api.CopyFromDevice
	devCopy api.CopyDevice
	memset  api.Memset
	launch  api.Launch
	pool    *[]byte       // the request body's buffer, for the payload of toDev
	barrier chan struct{} // set for an internal drain marker: no reply
}

func decodeCommand(h api.Header, body []byte) (command, error) {
	c := command{h: h}
	var err error
	switch h.Op {
	case api.OpCopyToDevice:
		err = api.Decode(body, &c.toDev)
		c.stream = c.toDev.Stream
		if err == nil && len(c.toDev.Payload) == 0 {
			err = fmt.Errorf("copy of 0 bytes to %#x: %w", c.toDev.Dst, api.ErrInvalidArgument)
		}
	case api.OpCopyFromDevice:
		err = api.Decode(body, &c.fromDev)
		c.stream = c.fromDev.Stream
		if err == nil && (c.fromDev.Len == 0 || c.fromDev.Len > api.MaxChunk) {
			err = fmt.Errorf("copy of %d bytes from %#x: want 1 to %d per request: %w", c.fromDev.Len, c.fromDev.Src, api.MaxChunk, api.ErrInvalidArgument)
		}
	case api.OpCopyDevice:
		err = api.Decode(body, &c.devCopy)
		c.stream = c.devCopy.Stream
		if err == nil && c.devCopy.Len == 0 {
			err = fmt.Errorf("device copy of 0 bytes from %#x to %#x: %w", c.devCopy.Src, c.devCopy.Dst, api.ErrInvalidArgument)
		}
	case api.OpMemset:
		err = api.Decode(body, &c.memset)
		c.stream = c.memset.Stream
		if err == nil && c.memset.Len == 0 {
			err = fmt.Errorf("memset of 0 bytes at %#x: %w", c.memset.Dst, api.ErrInvalidArgument)
		}
	case api.OpLaunch:
		err = api.Decode(body, &c.launch)
		c.stream = c.launch.Stream
	case api.OpSynchronize:
		var m api.StreamReq
		err = api.Decode(body, &m)
		c.stream = m.Stream
	}
	if err != nil {
		return c, fmt.Errorf("%v: %w", h.Op, err)
	}
	return c, nil
}

// completion is a command whose node calls are in flight; the completer
// answers the tenant once they are all done, in stream order.
type completion struct {
	h       api.Header
	calls   []*api.Call
	err     error
	out     *[]byte // reply payload buffer (copy from device)
	outLen  int
	in      uint64 // bytes copied to the device, counted on success
	launch  bool
	barrier chan struct{}
}

// stream executes one tenant stream: an executor translates commands and
// issues node calls without waiting for them; a completer waits for them in
// order and replies. The node runs a connection's requests in order, so the
// stream's order holds while the pipeline is full.
type stream struct {
	s        *session
	id       uint32
	cmds     chan command
	pending  chan completion
	done     chan struct{}
	lastNode int // node of calls possibly still in flight; -1 none
}

const streamDepth = 256

func (s *session) newStream(id uint32) *stream {
	st := &stream{
		s: s, id: id, lastNode: -1,
		cmds:    make(chan command, streamDepth),
		pending: make(chan completion, streamDepth),
		done:    make(chan struct{}),
	}
	go st.execute()
	go st.complete()
	return st
}

// drain returns once every command queued before it has completed.
func (st *stream) drain() {
	ch := make(chan struct{})
	_ = st.s.enqueue(st, command{barrier: ch})
	st.s.await(ch)
}

// stop finishes the queued commands and ends the stream's goroutines.
func (st *stream) stop() {
	close(st.cmds)
	st.s.await(st.done)
}

func (st *stream) execute() {
	defer close(st.pending)
	for cmd := range st.cmds {
		if cmd.barrier != nil {
			st.pending <- completion{barrier: cmd.barrier}
			continue
		}
		// Bandwidth is paid for before the session's lock is taken, so a
		// wait holds up this stream alone. A tenant that is gone gets no
		// more work done.
		var err error
		if st.s.gone.Load() {
			err = fmt.Errorf("%v not issued: the tenant reads no replies: %w", cmd.h.Op, api.ErrUnavailable)
		} else if n := st.charge(&cmd); n > 0 {
			err = st.s.bw.wait(n, st.s.ending)
		}
		// A copy from the device needs a reply buffer of the session's.
		out := false
		if err == nil && cmd.h.Op == api.OpCopyFromDevice {
			err = st.s.takeBuffer(st.s.outBufs)
			out = err == nil
		}
		if err != nil {
			if cmd.pool != nil {
				st.s.putIn(cmd.pool)
			}
			st.pending <- completion{h: cmd.h, err: err}
			continue
		}
		// Translation may evict and fault in the session's memory; issuing
		// under the session's lock keeps another stream from moving a
		// chunk between this command's translation and its node calls.
		st.s.issueMu.Lock()
		c := st.issue(&cmd)
		st.s.issueMu.Unlock()
		if cmd.pool != nil {
			st.s.putIn(cmd.pool) // the payload is on the wire already
		}
		if out && c.out == nil {
			<-st.s.outBufs // refused before it took a buffer
		}
		st.pending <- c
	}
}

// charge is how many bytes cmd copies, for the tenant's bandwidth bucket. A
// device copy whose source allocation is shorter than it is refused by its
// translation; it is not charged, so a forged length costs nothing.
func (st *stream) charge(cmd *command) uint64 {
	switch cmd.h.Op {
	case api.OpCopyToDevice:
		return uint64(len(cmd.toDev.Payload))
	case api.OpCopyFromDevice:
		return cmd.fromDev.Len
	case api.OpCopyDevice:
		m := &cmd.devCopy
		if _, end, err := st.s.space.Span(m.Src); err != nil || m.Len > end-m.Src {
			return 0
		}
		return m.Len
	}
	return 0
}

// waitIdle waits for every call in flight, so that work can move to another
// node without overtaking it.
func (st *stream) waitIdle() {
	ch := make(chan struct{})
	st.pending <- completion{barrier: ch}
	<-ch
	st.lastNode = -1
}

// on returns the connection for virtual device dev, first waiting for work in
// flight on another node.
func (st *stream) on(dev uint32) vdev {
	v := st.s.vdevs[dev]
	if st.lastNode != -1 && st.lastNode != v.dev.node {
		st.waitIdle()
	}
	st.lastNode = v.dev.node
	return v
}

func (st *stream) issue(cmd *command) completion {
	c := completion{h: cmd.h}
	space := st.s.space
	switch cmd.h.Op {
	case api.OpSynchronize:
	case api.OpCopyToDevice:
		m := &cmd.toDev
		dev, xs, err := space.Translate(m.Dst, uint64(len(m.Payload)))
		if err != nil {
			c.err = fmt.Errorf("copy %d bytes to device: %w", len(m.Payload), err)
			break
		}
		v := st.on(dev)
		hdr := api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: xs})
		c.calls = append(c.calls, v.rpc.Go(api.OpNodeWrite, nil, hdr, m.Payload))
		c.in = uint64(len(m.Payload))
	case api.OpCopyFromDevice:
		m := &cmd.fromDev
		dev, xs, err := space.Translate(m.Src, m.Len)
		if err != nil {
			c.err = fmt.Errorf("copy %d bytes from device: %w", m.Len, err)
			break
		}
		v := st.on(dev)
		c.out = bodyPool.Get().(*[]byte)
		c.outLen = int(m.Len)
		req := api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: xs})
		c.calls = append(c.calls, v.rpc.Go(api.OpNodeRead, (*c.out)[:m.Len], req))
	case api.OpMemset:
		m := &cmd.memset
		dev, xs, err := space.Translate(m.Dst, m.Len)
		if err != nil {
			c.err = fmt.Errorf("memset %d bytes: %w", m.Len, err)
			break
		}
		v := st.on(dev)
		c.calls = append(c.calls, v.rpc.Go(api.OpNodeFill, nil, api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: xs, Value: m.Value})))
	case api.OpCopyDevice:
		c.err = st.copyDevice(&cmd.devCopy, &c)
	case api.OpLaunch:
		c.err = st.launch(&cmd.launch, &c)
		c.launch = c.err == nil
	}
	return c
}

func (st *stream) copyDevice(m *api.CopyDevice, c *completion) error {
	space := st.s.space
	ts, err := space.TranslateAll([]memory.Range{{VA: m.Src, Len: m.Len}, {VA: m.Dst, Len: m.Len}})
	if err != nil {
		return fmt.Errorf("device copy of %d bytes from %#x to %#x: %w", m.Len, m.Src, m.Dst, err)
	}
	sdev, sxs, ddev, dxs := ts[0].Dev, ts[0].Extents, ts[1].Dev, ts[1].Extents
	if sdev == ddev {
		v := st.on(sdev)
		c.calls = append(c.calls, v.rpc.Go(api.OpNodeCopy, nil, api.Encode(&api.NodeCopy{Device: v.dev.info.Index, Dst: dxs, Src: sxs})))
		return nil
	}
	// Between devices the bytes pass through here, a chunk at a time.
	st.waitIdle()
	buf := bodyPool.Get().(*[]byte)
	defer bodyPool.Put(buf)
	for off := uint64(0); off < m.Len; off += api.MaxChunk {
		n := min(api.MaxChunk, m.Len-off)
		ts, err := space.TranslateAll([]memory.Range{{VA: m.Src + off, Len: n}, {VA: m.Dst + off, Len: n}})
		if err != nil {
			return err
		}
		sx, dx := ts[0].Extents, ts[1].Extents
		sv, dv := st.s.vdevs[sdev], st.s.vdevs[ddev]
		if _, err := sv.rpc.Call(api.OpNodeRead, (*buf)[:n], api.Encode(&api.NodeAccess{Device: sv.dev.info.Index, Extents: sx})); err != nil {
			return fmt.Errorf("device copy: read device %d: %w", sdev, err)
		}
		if _, err := dv.rpc.Call(api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Device: dv.dev.info.Index, Extents: dx}), (*buf)[:n]); err != nil {
			return fmt.Errorf("device copy: write device %d: %w", ddev, err)
		}
	}
	return nil
}

// launch checks a launch against the kernel's signature, translates each
// buffer argument to the physical runs from its address to the end of its
// allocation (all the kernel may touch), and sends it to the buffers' device.
func (st *stream) launch(m *api.Launch, c *completion) error {
	k, ok := st.s.m.catalog[m.Kernel]
	if !ok {
		return fmt.Errorf("kernel %q is not in the catalog: %w", m.Kernel, api.ErrUnknownKernel)
	}
	if len(m.Args) != len(k.Params) {
		return fmt.Errorf("kernel %s takes %d arguments, %d given: %w", m.Kernel, len(k.Params), len(m.Args), api.ErrInvalidArgument)
	}
	args := make([]api.NodeArg, len(m.Args))
	var ranges []memory.Range
	var bufs []int // the arguments ranges belong to
	dev := -1
	for i, a := range m.Args {
		p := k.Params[i]
		if a.Kind != p.Kind {
			return fmt.Errorf("kernel %s argument %d (%s): %v given, %v wanted: %w", m.Kernel, i, p.Name, a.Kind, p.Kind, api.ErrInvalidArgument)
		}
		args[i] = api.NodeArg{Kind: a.Kind, Bits: a.Bits}
		if a.Kind != api.ArgBuffer {
			continue
		}
		d, end, err := st.s.space.Span(a.Bits)
		if err != nil {
			return fmt.Errorf("kernel %s argument %d (%s): %w", m.Kernel, i, p.Name, err)
		}
		if dev != -1 && int(d) != dev {
			return fmt.Errorf("kernel %s argument %d (%s) at %#x is on device %d, earlier buffers on device %d: %w", m.Kernel, i, p.Name, a.Bits, d, dev, api.ErrInvalidArgument)
		}
		dev = int(d)
		// The signature says how much the kernel touches; only that needs
		// to be resident. Past the allocation the node's check refuses it.
		n := end - a.Bits
		if need, ok := k.Extent(i, m.Args); ok && need < n {
			n = need
		}
		if n == 0 {
			continue // touches nothing: no extents
		}
		ranges = append(ranges, memory.Range{VA: a.Bits, Len: n})
		bufs = append(bufs, i)
	}
	if dev == -1 {
		dev = 0
	}
	// All buffers are made resident together, so that faulting one in
	// cannot evict another.
	var ts []memory.Translation
	if len(ranges) > 0 {
		var err error
		if ts, err = st.s.space.TranslateAll(ranges); err != nil {
			return fmt.Errorf("kernel %s: buffers: %w", m.Kernel, err)
		}
	}
	for j, i := range bufs {
		args[i].Extents = ts[j].Extents
	}
	v := st.on(uint32(dev))
	c.calls = append(c.calls, v.rpc.Go(api.OpNodeLaunch, nil, api.Encode(&api.NodeLaunch{Device: v.dev.info.Index, Kernel: m.Kernel, Args: args})))
	return nil
}

func (st *stream) complete() {
	defer close(st.done)
	for c := range st.pending {
		if c.barrier != nil {
			close(c.barrier)
			continue
		}
		err := c.err
		for _, call := range c.calls {
			if cerr := call.Wait(); err == nil && cerr != nil {
				err = cerr
			}
		}
		s := st.s
		var werr error
		switch {
		case err != nil:
			werr = s.c.ReplyError(c.h, err)
		case c.out != nil:
			s.copiedOut.Add(uint64(c.outLen))
			werr = s.c.Reply(c.h, (*c.out)[:c.outLen])
		default:
			s.copiedIn.Add(c.in)
			if c.launch {
				s.launches.Add(1)
			}
			werr = s.c.Reply(c.h)
		}
		if werr != nil {
			// The tenant is gone or reads no replies (ReplyTimeout): end
			// the session, whose reader then stops and frees everything.
			s.end(true)
			_ = s.c.Close()
		}
		if c.out != nil {
			bodyPool.Put(c.out)
			<-s.outBufs
		}
	}
}

func sortKernels(ks []api.KernelInfo) {
	sort.Slice(ks, func(i, j int) bool { return ks[i].Name < ks[j].Name })
}
