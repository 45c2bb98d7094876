package mediator

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// A stream executes one tenant stream's commands in order. Its executor
// translates each command and issues the node calls it needs without
// waiting for them; each call's continuation (wire.RPC.GoThen) counts it
// done, and the last one of a command answers the tenant. The node runs a
// connection's requests in order, so the stream's order holds while the
// pipeline is full. A command that finds its stream idle is issued by the
// session's reader itself (session.readLoop), saving a goroutine hand-off
// on the path of a small synchronous operation.
//
// A batch (api.OpBatch) is one command made of many: it is answered once,
// when all of its node calls completed, with the error of the first of its
// commands that failed.

// command is one queued stream operation, decoded and not yet translated.
type command struct {
	h       wire.Header // the tenant's request (a batch's, for its commands)
	op      wire.Op
	stream  uint32
	toDev   api.CopyToDevice
	fromDev api.CopyFromDevice
	host    api.CopyHost
	devCopy api.CopyDevice
	memset  api.Memset
	launch  api.Launch
	subs    []command     // a batch's commands, or the graph a graph launch runs
	pool    *[]byte       // the request body's buffer, for the payloads in it
	barrier chan struct{} // set for an internal drain marker: no reply
}

// weight is how many decoded commands cmd counts in flight (limits.go):
// a launched graph's own, a batch's with those of the graphs it launches
// (at least one either way), one for any other command, none for a
// drain's barrier. Graphs do not nest, so a batch's weight is its length
// plus its graphs' lengths.
func (cmd *command) weight() int64 {
	switch {
	case cmd.barrier != nil:
		return 0
	case cmd.op == api.OpGraphLaunch:
		return max(1, int64(len(cmd.subs)))
	case cmd.op == api.OpBatch:
		var n int64
		for i := range cmd.subs {
			n += cmd.subs[i].weight()
		}
		return max(1, n)
	}
	return 1
}

// inBatch says which operations a batch or graph may carry: those whose
// reply is empty (a copy from the device into the reply needs a request of
// its own). A switch, not a map: it is asked for every command of a batch.
func inBatch(op wire.Op) bool {
	switch op {
	case api.OpCopyToDevice, api.OpCopyToDeviceHost, api.OpCopyFromDeviceHost,
		api.OpCopyDevice, api.OpMemset, api.OpLaunch, api.OpGraphLaunch:
		return true
	}
	return false
}

// decodeInto decodes body into *dst through a copy of its own, so that
// only the message, not the command that holds dst, escapes to the heap
// (api.Decode takes an interface).
func decodeInto[T any, P interface {
	*T
	api.Message
}](body []byte, dst *T) error {
	var m T
	err := api.Decode(body, P(&m))
	*dst = m
	return err
}

// decodeOne decodes one stream operation's body.
func (s *session) decodeOne(arena *api.LaunchArena, op wire.Op, body []byte) (command, error) {
	c := command{op: op}
	var err error
	switch op {
	case api.OpCopyToDevice:
		err = decodeInto(body, &c.toDev)
		c.stream = c.toDev.Stream
		if err == nil && len(c.toDev.Payload) == 0 {
			err = fmt.Errorf("copy of 0 bytes to %#x: %w", c.toDev.Dst, api.ErrInvalidArgument)
		}
	case api.OpCopyFromDevice:
		// With the message's type known, as for a launch below: no
		// allocation for the decoder or a copy of the message on the
		// small copy's path (#25).
		d := wire.NewDecoder(body)
		c.fromDev.Unmarshal(d)
		err = d.Finish()
		c.stream = c.fromDev.Stream
		if err == nil && (c.fromDev.Len == 0 || c.fromDev.Len > wire.MaxChunk) {
			err = fmt.Errorf("copy of %d bytes from %#x: want 1 to %d per request: %w", c.fromDev.Len, c.fromDev.Src, wire.MaxChunk, api.ErrInvalidArgument)
		}
	case api.OpCopyToDeviceHost, api.OpCopyFromDeviceHost:
		err = decodeInto(body, &c.host)
		c.stream = c.host.Stream
		if err == nil {
			err = s.checkHost(&c.host)
		}
	case api.OpCopyDevice:
		err = decodeInto(body, &c.devCopy)
		c.stream = c.devCopy.Stream
		if err == nil && c.devCopy.Len == 0 {
			err = fmt.Errorf("device copy of 0 bytes from %#x to %#x: %w", c.devCopy.Src, c.devCopy.Dst, api.ErrInvalidArgument)
		}
	case api.OpMemset:
		err = decodeInto(body, &c.memset)
		c.stream = c.memset.Stream
		if err == nil && c.memset.Len == 0 {
			err = fmt.Errorf("memset of 0 bytes at %#x: %w", c.memset.Dst, api.ErrInvalidArgument)
		}
	case api.OpLaunch:
		// With the message's type known, as the node decodes launches
		// (accelerator's checkLaunch): neither the decoder nor the message
		// escapes to the heap, and the arena allocates per batch rather
		// than per launch, which counts in a batch of tiny launches.
		d := wire.NewDecoder(body)
		arena.DecodeLaunch(d, &c.launch)
		err = d.Finish()
		c.stream = c.launch.Stream
	case api.OpSynchronize:
		var m api.StreamReq
		err = api.Decode(body, &m)
		c.stream = m.Stream
	case api.OpGraphLaunch:
		var m api.GraphLaunch
		err = api.Decode(body, &m)
		c.stream = m.Stream
		if err == nil {
			c.subs, err = s.graphs.get(m.Graph)
		}
	default:
		err = fmt.Errorf("%v is not a stream operation: %w", op, api.ErrInvalidArgument)
	}
	if err != nil {
		return c, fmt.Errorf("%v: %w", op, err)
	}
	return c, nil
}

// decodeCommands decodes a batch body into its commands, each of which
// must be allowed in a batch and (if stream is not nil) name *stream. They
// may weigh maxSessionInflight at most, the graphs they launch counted, so
// that a batch fits in a session with nothing in flight (limits.go); a
// batch of more commands is refused before any is decoded.
func (s *session) decodeCommands(body []byte, stream *uint32) (uint32, []command, error) {
	var b api.Batch
	if err := api.Decode(body, &b); err != nil {
		return 0, nil, err
	}
	if len(b.Cmds) > maxSessionInflight {
		return 0, nil, fmt.Errorf("%d commands, more than the %d a session may have in flight: %w", len(b.Cmds), maxSessionInflight, api.ErrQuotaExceeded)
	}
	cmds := takeCommands(len(b.Cmds))
	var weight int64
	var arena api.LaunchArena
	for i, bc := range b.Cmds {
		c, err := s.decodeBatched(&arena, bc, b.Stream, stream != nil)
		if err == nil {
			if weight += c.weight(); weight > maxSessionInflight {
				err = fmt.Errorf("brings the batch to %d commands with the graphs it launches, more than the %d a session may have in flight: %w",
					weight, maxSessionInflight, api.ErrQuotaExceeded)
			}
		}
		if err != nil {
			giveCommands(cmds)
			return 0, nil, fmt.Errorf("command %d: %w", i, err)
		}
		cmds[i] = c
	}
	return b.Stream, cmds, nil
}

// decodeBatched decodes command bc of a batch of stream id, which it must
// name if sameStream.
func (s *session) decodeBatched(arena *api.LaunchArena, bc api.Cmd, id uint32, sameStream bool) (command, error) {
	if !inBatch(bc.Op) {
		return command{}, fmt.Errorf("%v may not be batched: %w", bc.Op, api.ErrInvalidArgument)
	}
	c, err := s.decodeOne(arena, bc.Op, bc.Body)
	if err != nil {
		return command{}, err
	}
	if sameStream && c.stream != id {
		return command{}, fmt.Errorf("names stream %d in a batch of stream %d: %w", c.stream, id, api.ErrInvalidArgument)
	}
	return c, nil
}

// commandLists recycles the command lists of tenant batches: a batch of
// 1024 launches decodes into some 290 KB of commands, the mediator's
// largest garbage under a stream of launches (#25). A list goes back once
// its batch is issued (stream.run), cleared so that it keeps no payload
// or argument alive; a graph keeps a copy of its own length
// (graphCommands).
var commandLists sync.Pool

// takeCommands is a list of n zero commands, recycled if one is at hand.
func takeCommands(n int) []command {
	if p, ok := commandLists.Get().(*[]command); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]command, n)
}

// giveCommands recycles cmds, which nothing uses any more.
func giveCommands(cmds []command) {
	clear(cmds)
	commandLists.Put(&cmds)
}

// decodeCommand decodes a stream request: one operation or a batch.
func (s *session) decodeCommand(h wire.Header, body []byte) (command, error) {
	if h.Op == api.OpBatch {
		var stream uint32
		id, subs, err := s.decodeCommands(body, &stream)
		if err != nil {
			return command{}, fmt.Errorf("batch: %w", err)
		}
		return command{h: h, op: h.Op, stream: id, subs: subs}, nil
	}
	var arena api.LaunchArena
	c, err := s.decodeOne(&arena, h.Op, body)
	c.h = h
	return c, err
}

// completion is a tenant request whose node calls are in flight. It is
// answered when the last of them completes, or when issuing ends if none
// is left by then (pending starts at one for the issuer).
type completion struct {
	st      *stream
	h       wire.Header
	pending atomic.Int32

	mu     sync.Mutex
	err    error
	errIdx int // the command of a batch that err belongs to
	errOp  wire.Op
	batch  bool
	weight int64 // the command's count in flight, given back once answered

	out      *[]byte // reply payload buffer (copy from device into the reply)
	outLen   int
	in, outN uint64 // bytes copied to and from the device, counted on success
	launches uint64

	// nodeCall is room for the first node call that call issues, a small
	// operation's only one, so it costs no allocation of its own (#25);
	// nodeCallTaken says it has been used.
	nodeCall      wire.Call
	nodeCallTaken atomic.Bool
	nodeCallIdx   int // the command of nodeCall, for firstCallDone
	// nodeBody is room for a small read's node request (fromDevice), which
	// must stay unchanged until its call is done (wire.RPC.Go).
	nodeBody     [nodeBodyRoom]byte
	nodeBodyUsed bool // by a read; only the issuer touches it
}

// nodeBodyRoom holds a node read of one extent.
const nodeBodyRoom = 48

func (st *stream) newCompletion(h wire.Header, weight int64) *completion {
	c := &completion{st: st, h: h, batch: h.Op == api.OpBatch, errIdx: -1, weight: weight}
	c.pending.Store(1)
	st.answers.add(1)
	return c
}

// fail records the error of command idx; the lowest index wins, so a
// batch reports its first failing command.
func (c *completion) fail(idx int, op wire.Op, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil || idx < c.errIdx {
		c.err, c.errIdx, c.errOp = err, idx, op
	}
}

// call issues a node call for command idx of c. While the stream issues a
// batch, calls with small bodies and empty replies are gathered into one
// node batch, and large writes and reads into host memory merged
// (nodebatch.go); any other call first sends what was gathered, so the
// node sees them in order.
func (c *completion) call(v vdev, idx int, op wire.Op, into []byte, parts ...[]byte) {
	st := c.st
	if st.gather && into == nil && gatherable(op, parts) {
		st.nb.add(c, v, idx, op, parts)
		return
	}
	if st.gather && op == api.OpNodeRead && c.out == nil {
		st.nb.addRead(c, v, idx, into, parts)
		return
	}
	st.nb.flush()
	// One closure, not send's check wrapped by track's: a small
	// operation's node call then allocates one continuation (#25).
	c.begin()
	if !c.nodeCallTaken.Swap(true) {
		// Nor a continuation of its own: it finds c in the call.
		c.nodeCall.Owner, c.nodeCallIdx = c, idx
		v.rpc.GoThenIn(&c.nodeCall, op, into, firstCallDone, parts...)
		return
	}
	v.rpc.GoThen(op, into, func(call *wire.Call) {
		if call.Err != nil {
			c.fail(idx, call.Op, call.Err)
		}
		c.end()
	}, parts...)
}

// firstCallDone is the continuation of a completion's first node call.
func firstCallDone(call *wire.Call) {
	c := call.Owner.(*completion)
	if call.Err != nil {
		c.fail(c.nodeCallIdx, call.Op, call.Err)
	}
	c.end()
}

// send issues one node call whose completion counts towards c; check sees
// the call before c counts it done.
func (c *completion) send(rpc *wire.RPC, op wire.Op, into []byte, check func(*wire.Call), parts ...[]byte) {
	rpc.GoThen(op, into, c.track(check), parts...)
}

// track counts a call about to be sent as pending on c and in flight on
// its stream, and returns its continuation: check the reply, then count it
// done.
func (c *completion) track(check func(*wire.Call)) func(*wire.Call) {
	c.begin()
	return func(call *wire.Call) {
		check(call)
		c.end()
	}
}

// begin counts a call about to be sent as pending on c and in flight on
// its stream; end, run once its reply has been checked, counts it done.
func (c *completion) begin() {
	c.pending.Add(1)
	c.st.calls.add(1)
}

func (c *completion) end() {
	c.done()
	c.st.calls.add(-1)
}

// done drops one pending count and answers the tenant after the last.
func (c *completion) done() {
	if c.pending.Add(-1) != 0 {
		return
	}
	s := c.st.s
	err := c.err
	if err != nil && c.batch {
		err = &api.BatchError{Index: c.errIdx, Op: c.errOp, Err: err}
	}
	var werr error
	switch {
	case err != nil:
		werr = s.c.ReplyError(c.h, err)
	case c.out != nil:
		s.copiedOut.Add(uint64(c.outLen))
		werr = s.c.Reply(c.h, (*c.out)[:c.outLen])
	default:
		s.copiedIn.Add(c.in)
		s.copiedOut.Add(c.outN)
		s.launches.Add(c.launches)
		werr = s.c.Reply(c.h)
	}
	if werr != nil {
		// The tenant is gone or reads no replies (ReplyTimeout): end the
		// session, whose reader then stops and frees everything.
		s.end(true)
		_ = s.c.Close()
	}
	if c.out != nil {
		putOut(c.out)
		<-s.outBufs
	}
	s.answered(c.weight)
	c.st.answers.add(-1)
}

// flight counts what a stream has in flight: commands not yet answered, or
// node calls not yet completed.
type flight struct {
	mu   sync.Mutex
	cond *sync.Cond
	n    int
}

func (f *flight) add(d int) {
	f.mu.Lock()
	f.n += d
	if f.n == 0 && f.cond != nil {
		f.cond.Broadcast()
	}
	f.mu.Unlock()
}

// wait returns once nothing is in flight.
func (f *flight) wait() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cond == nil {
		f.cond = sync.NewCond(&f.mu)
	}
	for f.n != 0 {
		f.cond.Wait()
	}
}

type stream struct {
	s       *session
	id      uint32
	cmds    chan command
	queued  atomic.Int32 // commands handed to the executor and not yet issued
	done    chan struct{}
	answers flight // commands not yet answered
	calls   flight // node calls not yet completed
	gather  bool   // issuing a batch: gather node calls into nb
	nb      nodeBatch
	// scratch is where a launch's node body is encoded while gathering:
	// nb copies it, so one buffer serves every launch. Like nb, only the
	// stream's issuer touches it.
	scratch []byte
	// translated and extents hold a launch's translations while its node
	// body is encoded (launch), which keeps none of them, and extents a
	// read's (fromDevice); only the stream's issuer touches them.
	translated []memory.Translation
	extents    []api.Extent
	// lastKernel is the kernel the last launch named, lastInfo its
	// signature (kernel); only the issuer touches them.
	lastKernel string
	lastInfo   api.KernelInfo
	// hostPending says a copy into host memory may still be landing: the
	// next command that touches host memory waits for it (stream order).
	hostPending bool
	lastNode    int // node of calls possibly still in flight; -1 none
}

const streamDepth = 256

func (s *session) newStream(id uint32) *stream {
	st := &stream{
		s: s, id: id, lastNode: -1,
		cmds: make(chan command, streamDepth),
		done: make(chan struct{}),
	}
	go st.execute()
	return st
}

// idle says whether every command queued on st so far has completed
// (been answered), when a drain would only cost two goroutine hand-offs.
func (st *stream) idle() bool {
	if st.queued.Load() != 0 {
		return false // some not issued yet
	}
	st.answers.mu.Lock()
	defer st.answers.mu.Unlock()
	return st.answers.n == 0
}

// drain returns once every command queued before it has completed.
func (st *stream) drain() {
	ch := make(chan struct{})
	st.queued.Add(1)
	_ = st.s.enqueue(st, command{barrier: ch})
	st.s.await(ch)
}

// stop finishes the queued commands and ends the stream's goroutine.
func (st *stream) stop() {
	close(st.cmds)
	st.s.await(st.done)
}

func (st *stream) execute() {
	defer close(st.done)
	defer st.calls.wait()
	defer st.answers.wait()
	for cmd := range st.cmds {
		if cmd.barrier != nil {
			st.answers.wait()
			st.lastNode = -1
			close(cmd.barrier)
		} else {
			st.run(&cmd)
		}
		st.queued.Add(-1)
	}
}

// run issues a command and arranges its answer.
func (st *stream) run(cmd *command) {
	if cmd.op == api.OpSynchronize {
		// Answered only after every earlier command of the stream
		// (api.OpSynchronize), so the executor waits here as for a drain's
		// barrier; the reader never runs it (session.cheap).
		st.answers.wait()
	}
	c := st.newCompletion(cmd.h, cmd.weight())
	// Gathering would let an eviction's node calls overtake gathered ones
	// that touch the evicted frame, so spaces that evict send each call.
	st.gather = (cmd.op == api.OpBatch || cmd.op == api.OpGraphLaunch) && !st.s.evicts
	defer func() { st.unblock(); st.gather = false }()
	if st.s.gone.Load() {
		// A tenant that is gone gets no more work done.
		c.fail(0, cmd.op, fmt.Errorf("%v not issued: the tenant reads no replies: %w", cmd.op, api.ErrUnavailable))
	} else if cmd.op == api.OpBatch {
		st.issueAll(cmd.subs, c, -1)
	} else {
		st.issueOne(cmd, c, 0)
	}
	st.unblock()
	if cmd.op == api.OpBatch {
		// Issued and what was gathered sent: the node calls carry
		// encodings of their own.
		giveCommands(cmd.subs)
		cmd.subs = nil
	}
	if cmd.pool != nil {
		st.s.putIn(cmd.pool) // the payloads are on the wire already
	}
	c.done()
}

// issueAll issues cmds as commands of c; idx is their index in c's batch,
// or -1 when each is its own index.
func (st *stream) issueAll(cmds []command, c *completion, idx int) {
	for i := range cmds {
		at := idx
		if at < 0 {
			at = i
		}
		st.issueOne(&cmds[i], c, at)
	}
}

// issueOne charges a command's bytes to the tenant's bandwidth, translates
// it and issues its node calls.
func (st *stream) issueOne(cmd *command, c *completion, idx int) {
	if cmd.op == api.OpGraphLaunch {
		st.issueAll(cmd.subs, c, idx)
		return
	}
	// Bandwidth is paid for before the session's lock is taken, so a
	// wait holds up this stream alone.
	n := st.charge(cmd)
	if n == 0 && cmd.op == api.OpCopyDevice {
		// Its source lay in no allocation when it was to be paid for: it
		// fails now, as its translation would, rather than pass unpaid
		// if an allocation made meanwhile covers it by then.
		m := &cmd.devCopy
		c.fail(idx, cmd.op, fmt.Errorf("device copy of %d bytes from %#x: not within one live allocation: %w", m.Len, m.Src, api.ErrInvalidAddress))
		return
	}
	if n > 0 {
		if err := st.s.bw.wait(n, st.s.ending, st.unblock); err != nil {
			c.fail(idx, cmd.op, err)
			return
		}
	}
	if cmd.op == api.OpCopyToDeviceHost || cmd.op == api.OpCopyFromDeviceHost {
		// A copy into host memory lands when its reply arrives. A later
		// copy out of host memory waits for it; so does a later copy into
		// it from a shared buffer, which may land at once from the cache.
		// Copies into it from one node land in order (one connection, its
		// replies read in order; on() waits when the node changes).
		if st.hostPending {
			r, _ := st.s.sharedAt(cmd.host.Addr, cmd.host.Len)
			if cmd.op == api.OpCopyToDeviceHost || r != nil {
				st.waitIdle()
			}
		}
		if cmd.op == api.OpCopyFromDeviceHost {
			st.hostPending = true
		}
	}
	if done, err := st.viaShared(cmd, c, idx); done {
		if err != nil {
			c.fail(idx, cmd.op, err)
		}
		return
	}
	var err error
	switch cmd.op {
	case api.OpCopyToDeviceHost:
		err = st.toDeviceHost(&cmd.host, c, idx)
	case api.OpCopyFromDeviceHost:
		err = st.fromDeviceHost(&cmd.host, c, idx)
	case api.OpCopyFromDevice:
		// A copy from the device needs a reply buffer of the session's.
		st.unblock()
		if err = st.s.takeBuffer(st.s.outBufs); err == nil {
			c.out = getOut(cmd.fromDev.Len)
			st.s.issueMu.Lock()
			err = st.fromDevice(&cmd.fromDev, c, idx)
			st.s.issueMu.Unlock()
			if err != nil {
				putOut(c.out)
				c.out = nil
				<-st.s.outBufs
			}
		}
	default:
		// Translation may evict and fault in the session's memory; issuing
		// under the session's lock keeps another stream from moving a
		// chunk between this command's translation and its node calls.
		st.s.issueMu.Lock()
		err = st.issueLocked(cmd, c, idx)
		st.s.issueMu.Unlock()
	}
	if err != nil {
		c.fail(idx, cmd.op, err)
	}
}

// charge is how many bytes cmd copies, for the tenant's bandwidth bucket. A
// device copy whose source allocation is shorter than it is refused by its
// translation; it is not charged, so a forged length costs nothing. A copy
// from a shared buffer pays more as it misses the cache (readShared).
func (st *stream) charge(cmd *command) uint64 {
	switch cmd.op {
	case api.OpCopyToDevice:
		return uint64(len(cmd.toDev.Payload))
	case api.OpCopyFromDevice:
		return cmd.fromDev.Len
	case api.OpCopyToDeviceHost, api.OpCopyFromDeviceHost:
		return cmd.host.Len
	case api.OpCopyDevice:
		m := &cmd.devCopy
		if _, end, err := st.s.space.Span(m.Src); err != nil || m.Len > end-m.Src {
			return 0
		}
		return m.Len
	}
	return 0
}

// unblock sends what the stream has gathered: the issuer calls it before
// anything that may wait.
func (st *stream) unblock() { st.nb.flush() }

// waitIdle waits for every call in flight, so that work can move to another
// node without overtaking it.
func (st *stream) waitIdle() {
	st.unblock()
	st.calls.wait()
	st.lastNode = -1
	st.hostPending = false
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

// issueLocked issues the commands that touch device memory only. The caller
// holds issueMu.
func (st *stream) issueLocked(cmd *command, c *completion, idx int) error {
	space := st.s.space
	switch cmd.op {
	case api.OpSynchronize:
	case api.OpCopyToDevice:
		m := &cmd.toDev
		dev, xs, err := space.TranslateWrite(m.Dst, uint64(len(m.Payload)))
		if err != nil {
			return fmt.Errorf("copy %d bytes to device: %w", len(m.Payload), err)
		}
		v := st.on(dev)
		c.call(v, idx, api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: xs}), m.Payload)
		c.in += uint64(len(m.Payload))
	case api.OpMemset:
		m := &cmd.memset
		dev, xs, err := space.TranslateWrite(m.Dst, m.Len)
		if err != nil {
			return fmt.Errorf("memset %d bytes: %w", m.Len, err)
		}
		v := st.on(dev)
		c.call(v, idx, api.OpNodeFill, nil, api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: xs, Value: m.Value}))
	case api.OpCopyDevice:
		return st.copyDevice(&cmd.devCopy, c, idx)
	case api.OpLaunch:
		if err := st.launch(&cmd.launch, c, idx); err != nil {
			return err
		}
		c.launches++
	}
	return nil
}

// fromDevice issues a copy from the device into the reply. The caller
// holds issueMu.
func (st *stream) fromDevice(m *api.CopyFromDevice, c *completion, idx int) error {
	// Translated into the stream's buffer of extents, as a launch's
	// buffers are: they are encoded below and not kept, so a small read
	// allocates none (#25).
	var ts [1]memory.Translation
	if err := st.s.space.TranslateInto([]memory.Range{{VA: m.Src, Len: m.Len}}, ts[:], st.spareExtents()); err != nil {
		return fmt.Errorf("copy %d bytes from device: %w", m.Len, err)
	}
	v := st.on(ts[0].Dev)
	c.outLen = int(m.Len)
	// Encoded into c's room, once a completion (a batch may read more
	// than once): c outlives the call (#25). What does not fit grows out.
	var e wire.Encoder
	if !c.nodeBodyUsed {
		e.B, c.nodeBodyUsed = c.nodeBody[:0], true
	}
	(&api.NodeAccess{Device: v.dev.info.Index, Extents: ts[0].Extents}).Marshal(&e)
	c.call(v, idx, api.OpNodeRead, (*c.out)[:m.Len], e.B)
	return nil
}

// spareExtents is the stream's room for the extents of a translation
// that is encoded and not kept. Only the issuer calls it.
func (st *stream) spareExtents() []api.Extent {
	if st.extents == nil {
		st.extents = make([]api.Extent, 0, 4*launchArgsOnStack)
	}
	return st.extents
}

func (st *stream) copyDevice(m *api.CopyDevice, c *completion, idx int) error {
	space := st.s.space
	ts, err := space.TranslateAll([]memory.Range{{VA: m.Src, Len: m.Len}, {VA: m.Dst, Len: m.Len, Write: true}})
	if err != nil {
		return fmt.Errorf("device copy of %d bytes from %#x to %#x: %w", m.Len, m.Src, m.Dst, err)
	}
	sdev, sxs, ddev, dxs := ts[0].Dev, ts[0].Extents, ts[1].Dev, ts[1].Extents
	if sdev == ddev {
		v := st.on(sdev)
		c.call(v, idx, api.OpNodeCopy, nil, api.Encode(&api.NodeCopy{Device: v.dev.info.Index, Dst: dxs, Src: sxs}))
		return nil
	}
	// Between devices the bytes pass through here, a chunk at a time.
	st.waitIdle()
	buf := bodyPool.Get().(*[]byte)
	defer bodyPool.Put(buf)
	for off := uint64(0); off < m.Len; off += wire.MaxChunk {
		n := min(wire.MaxChunk, m.Len-off)
		ts, err := space.TranslateAll([]memory.Range{{VA: m.Src + off, Len: n}, {VA: m.Dst + off, Len: n, Write: true}})
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

// kernel is the signature of m's kernel, if it is in the catalog and m
// gives it as many arguments as it takes.
func (m *Mediator) kernel(l *api.Launch) (api.KernelInfo, error) {
	k, ok := m.catalog[l.Kernel]
	if !ok {
		return api.KernelInfo{}, fmt.Errorf("kernel %q is not in the catalog: %w", l.Kernel, api.ErrUnknownKernel)
	}
	if len(l.Args) != len(k.Params) {
		return api.KernelInfo{}, fmt.Errorf("kernel %s takes %d arguments, %d given: %w", l.Kernel, len(k.Params), len(l.Args), api.ErrInvalidArgument)
	}
	return k, nil
}

// kernel is Mediator.kernel, answered from the stream's last launch while
// launches name its kernel with as many arguments: a batch's launches
// share their kernel name's string (api.LaunchArena), which compares
// equal at once where a map would hash it, and the catalog is fixed
// before the mediator serves.
func (st *stream) kernel(l *api.Launch) (api.KernelInfo, error) {
	if st.lastKernel == "" || l.Kernel != st.lastKernel || len(l.Args) != len(st.lastInfo.Params) {
		k, err := st.s.m.kernel(l)
		if err != nil {
			return k, err
		}
		st.lastKernel, st.lastInfo = l.Kernel, k
	}
	return st.lastInfo, nil
}

// launchArgsOnStack is how many arguments a launch translates without
// allocating its working slices.
const launchArgsOnStack = 8

// launch checks a launch against the kernel's signature, translates each
// buffer argument to the physical runs from its address to the end of its
// allocation (all the kernel may touch), and sends it to the buffers' device.
func (st *stream) launch(m *api.Launch, c *completion, idx int) error {
	k, err := st.kernel(m)
	if err != nil {
		return err
	}
	// A launch's slices stay on the stack for the usual few arguments: a
	// tiny launch is dominated by allocation otherwise (docs/datapath.md).
	var argsOn [launchArgsOnStack]api.NodeArg
	var rangesOn [launchArgsOnStack]memory.Range
	var bufsOn [launchArgsOnStack]int
	args, ranges, bufs := argsOn[:0], rangesOn[:0], bufsOn[:0] // bufs: the arguments ranges belong to
	if len(m.Args) > launchArgsOnStack {
		args = make([]api.NodeArg, 0, len(m.Args))
	}
	args = args[:len(m.Args)]
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
		write := p.Access == api.AccessWrite || p.Access == api.AccessReadWrite
		ranges = append(ranges, memory.Range{VA: a.Bits, Len: n, Write: write})
		bufs = append(bufs, i)
	}
	if dev == -1 {
		dev = 0
	}
	// All buffers are made resident together, so that faulting one in
	// cannot evict another. The translations are encoded below and not
	// kept, so the stream's buffers serve every launch.
	if cap(st.translated) < len(ranges) {
		st.translated = make([]memory.Translation, len(ranges))
	}
	ts := st.translated[:len(ranges)]
	defer clear(ts) // keeps no extents alive
	if len(ranges) > 0 {
		if err := st.s.space.TranslateInto(ranges, ts, st.spareExtents()); err != nil {
			return fmt.Errorf("kernel %s: buffers: %w", m.Kernel, err)
		}
	}
	for j, i := range bufs {
		args[i].Extents = ts[j].Extents
	}
	v := st.on(uint32(dev))
	nl := api.NodeLaunch{Device: v.dev.info.Index, Kernel: m.Kernel, Args: args}
	var e wire.Encoder
	if st.gather {
		// Gathered (or, if too large, written out) before call returns:
		// the buffer is free again for the next launch.
		e.B = st.scratch[:0]
	} else {
		e.B = make([]byte, 0, nodeLaunchSize(&nl)) // one allocation, not one and a regrowth
	}
	nl.Marshal(&e)
	c.call(v, idx, api.OpNodeLaunch, nil, e.B)
	if st.gather {
		st.scratch = e.B
	}
	return nil
}

// nodeLaunchSize is the encoded size of l, or a little more.
func nodeLaunchSize(l *api.NodeLaunch) int {
	n := 16 + len(l.Kernel)
	for _, a := range l.Args {
		n += 13 + 16*len(a.Extents)
	}
	return n
}

func sortKernels(ks []api.KernelInfo) {
	sort.Slice(ks, func(i, j int) bool { return ks[i].Name < ks[j].Name })
}
