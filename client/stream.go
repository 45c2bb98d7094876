package client

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Stream is an in-order queue of device work.
//
// Commands are encoded into a batch as they are called and sent as one
// request when the batch is full, at Synchronize, or before a call that must
// see them (Free, Seal, a small copy from the device, which needs a reply of
// its own). The mediator answers a batch once all its commands completed.
type Stream struct {
	c  *Client
	id uint32

	mu      sync.Mutex
	cur     *inflight   // the batch being built; nil if empty
	pending []*inflight // sent, not yet settled, in order
	err     error       // first error found while settling
	staging *staging    // this stream's shared bounce buffer, made on first use
	capture *capture    // non-nil between BeginCapture and EndCapture
	// bodyHint is the length of the last batch sent, at most batchBytes:
	// the next batch's body starts with that room, so that a run of full
	// batches does not regrow each body a dozen times from empty.
	bodyHint int
}

// inflight is a request of the stream: a batch (while cur, call is nil) or
// a small copy from the device. afters run once it has completed: they copy
// staged bytes out to the caller's memory.
type inflight struct {
	body    []byte // batch: encoded commands
	n       int    // batch: commands in body
	call    *wire.Call
	afters  []func()
	settled bool
	// What sending it again after a reconnect needs (reconnect.go): the
	// request, the connection it went out on and that connection's
	// generation, whether it is safe to repeat, and where its body names
	// host regions, whose ids a resumed session changes.
	op     wire.Op
	into   []byte
	parts  [][]byte
	rpc    *wire.RPC
	sentOn uint64
	unsafe bool
	fixups []fixup
	// Room for a small request's one part and its body, so that sending
	// one costs a single allocation, the inflight's own (#25); parts then
	// points into them for as long as f may be sent again.
	part  [1][]byte
	small [smallReq]byte
	// callRoom is the call of its first sending, likewise (#25); one sent
	// again after a reconnect gets a new call.
	callRoom wire.Call
}

// smallReq is room enough for a small request's body (a CopyFromDevice is
// 20 bytes); a longer one grows onto the heap.
const smallReq = 32

// fixup is where a batch's body names region r by its id.
type fixup struct {
	at int
	r  *region
}

// regionAt is the offset of a CopyHost command's region id in its
// encoding (api.AppendCmd: op, length; then stream, address).
const regionAt = 2 + 4 + 4 + 8

// Batches are sent once they hold this many commands or bytes.
const (
	batchCmds  = 1024
	batchBytes = 256 << 10
)

// inlineMax is the largest copy whose bytes travel inside the request or
// reply itself: below it, staging through shared memory costs more than
// the bytes.
const inlineMax = 64 << 10

// reapEvery bounds how many requests a stream remembers between settles.
const reapEvery = 1024

func (c *Client) newStream(id uint32) *Stream {
	s := &Stream{c: c, id: id}
	c.mu.Lock()
	c.streams[s] = true
	c.mu.Unlock()
	return s
}

// add appends one command to the batch (or the capture), sending the batch
// when it is full. The caller holds s.mu.
func (s *Stream) add(op wire.Op, m api.Message) {
	if s.capture != nil {
		s.capture.add(op, m)
		return
	}
	f := s.batch(op)
	f.body = api.AppendCmd(f.body, op, m)
	s.added()
}

// batch is the batch being built, begun if none is, for a command op to
// be appended to its body. The caller holds s.mu and calls added after.
func (s *Stream) batch(op wire.Op) *inflight {
	if s.cur == nil {
		s.cur = &inflight{op: api.OpBatch, body: make([]byte, 0, s.bodyHint)}
	}
	switch op {
	case api.OpCopyToDevice, api.OpMemset, api.OpCopyToDeviceHost, api.OpCopyFromDeviceHost:
		// Repeated, they leave memory as one run would.
	default:
		s.cur.unsafe = true
	}
	return s.cur
}

// added counts a command appended to the batch, sending the batch when it
// is full. The caller holds s.mu.
func (s *Stream) added() {
	s.cur.n++
	if s.cur.n >= batchCmds || len(s.cur.body) >= batchBytes {
		s.flush()
	}
}

// addHost is add for a copy through host region r, whose id the batch's
// body gets now and again whenever it is sent (link.send). The caller
// holds s.mu.
func (s *Stream) addHost(op wire.Op, m *api.CopyHost, r *region) {
	m.Region = s.c.regionID(r)
	if s.capture == nil {
		if s.cur == nil {
			s.cur = &inflight{op: api.OpBatch}
		}
		s.cur.fixups = append(s.cur.fixups, fixup{at: len(s.cur.body) + regionAt, r: r})
	}
	s.add(op, m)
}

// flush sends the batch being built. The caller holds s.mu.
func (s *Stream) flush() {
	f := s.cur
	if f == nil {
		return
	}
	s.cur = nil
	s.bodyHint = min(len(f.body), batchBytes)
	var hdr wire.Encoder
	hdr.U32(s.id)
	hdr.U32(uint32(f.n))
	f.parts = [][]byte{hdr.B, f.body}
	s.c.rpc.send(f)
	s.sent(f)
}

// sent remembers a request in flight, settling finished ones now and then
// so the list stays short. The caller holds s.mu.
func (s *Stream) sent(f *inflight) {
	s.pending = append(s.pending, f)
	if len(s.pending) < reapEvery {
		return
	}
	live := s.pending[:0]
	for _, p := range s.pending {
		select {
		case <-p.call.Done():
			s.settle(p)
		default:
			live = append(live, p)
		}
	}
	clear(s.pending[len(live):])
	s.pending = live
}

// settle waits for f, keeps its error and runs its afters, once. The
// caller holds s.mu.
func (s *Stream) settle(f *inflight) {
	if f.settled {
		return
	}
	f.settled = true
	err := f.call.Wait()
	if err != nil && broken(f.rpc, err) {
		err = s.c.rpc.resend(f)
	}
	if err != nil {
		if s.err == nil {
			s.err = fmt.Errorf("%v: %w", f.op, err)
		}
		return // the staged bytes are not a result
	}
	for _, a := range f.afters {
		a()
	}
}

// CopyToDevice queues a copy of src to dst. src must stay unchanged until
// Synchronize returns.
func (s *Stream) CopyToDevice(dst Ptr, src []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(src) == 0 {
		s.add(api.OpCopyToDevice, &api.CopyToDevice{Stream: s.id, Dst: uint64(dst)}) // refused, as before
		return
	}
	if s.viaRegion(api.OpCopyToDeviceHost, "to", dst, src) {
		return
	}
	if len(src) <= inlineMax {
		s.add(api.OpCopyToDevice, &api.CopyToDevice{Stream: s.id, Dst: uint64(dst), Payload: src})
		return
	}
	for off := 0; off < len(src); off += stagingSlot {
		part := src[off:min(off+stagingSlot, len(src))]
		slot, err := s.slot()
		if err != nil {
			s.fail(err)
			return
		}
		copy(slot.buf, part)
		s.addHost(api.OpCopyToDeviceHost, &api.CopyHost{Stream: s.id, Addr: uint64(dst) + uint64(off), Off: slot.off, Len: uint64(len(part))}, s.staging.region)
		slot.user = s.last()
	}
}

// CopyFromDevice queues a copy of len(dst) bytes at src into dst, which holds
// them once Synchronize returns.
func (s *Stream) CopyFromDevice(dst []byte, src Ptr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.viaRegion(api.OpCopyFromDeviceHost, "from", src, dst) {
		return
	}
	if len(dst) <= inlineMax {
		// Its own request, whose reply carries the bytes; what is queued
		// goes first, so order holds.
		s.flush()
		req := api.CopyFromDevice{Stream: s.id, Src: uint64(src), Len: uint64(len(dst))}
		f := &inflight{op: api.OpCopyFromDevice, into: dst}
		e := wire.Encoder{B: f.small[:0]}
		req.Marshal(&e)
		f.part[0] = e.B
		f.parts = f.part[:]
		s.c.rpc.send(f)
		s.sent(f)
		return
	}
	for off := 0; off < len(dst); off += stagingSlot {
		part := dst[off:min(off+stagingSlot, len(dst))]
		slot, err := s.slot()
		if err != nil {
			s.fail(err)
			return
		}
		s.addHost(api.OpCopyFromDeviceHost, &api.CopyHost{Stream: s.id, Addr: uint64(src) + uint64(off), Off: slot.off, Len: uint64(len(part))}, s.staging.region)
		buf := slot.buf[:len(part)]
		f := s.last()
		f.afters = append(f.afters, func() { copy(part, buf) })
		slot.user = f
	}
}

// last is the request that carries the command just added: the batch being
// built, or the one add has just sent. The caller holds s.mu.
func (s *Stream) last() *inflight {
	if s.cur != nil {
		return s.cur
	}
	return s.pending[len(s.pending)-1]
}

// viaRegion queues a copy between device address addr and host memory b
// that names b's registered region, if it lies in one. During a capture it
// refuses other memory: a replay could not find it. It reports whether it
// dealt with the copy. The caller holds s.mu.
func (s *Stream) viaRegion(op wire.Op, dir string, addr Ptr, b []byte) bool {
	if r, off, ok := s.c.hostRegion(b); ok {
		s.addHost(op, &api.CopyHost{Stream: s.id, Addr: uint64(addr), Off: off, Len: uint64(len(b))}, r)
		return true
	}
	if s.capture != nil {
		s.capture.fail(fmt.Errorf("copy of %d bytes %s %#x: only memory of HostAlloc can be captured: %w", len(b), dir, uint64(addr), api.ErrInvalidArgument))
		return true
	}
	return false
}

// fail records an error found before anything was sent. The caller holds s.mu.
func (s *Stream) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// CopyDevice queues a copy of n bytes from src to dst, device to device.
func (s *Stream) CopyDevice(dst, src Ptr, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(api.OpCopyDevice, &api.CopyDevice{Stream: s.id, Dst: uint64(dst), Src: uint64(src), Len: n})
}

// Memset queues setting n bytes at dst to v.
func (s *Stream) Memset(dst Ptr, v byte, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(api.OpMemset, &api.Memset{Stream: s.id, Dst: uint64(dst), Value: v, Len: n})
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capture != nil {
		// A capture keeps its commands; args is the caller's.
		s.add(api.OpLaunch, &api.Launch{Stream: s.id, Kernel: kernel, Args: slices.Clone(args)})
		return
	}
	// Encoded in place with the message's type known, so that neither the
	// message nor args escapes: queuing a launch allocates nothing.
	l := api.Launch{Stream: s.id, Kernel: kernel, Args: args}
	f := s.batch(api.OpLaunch)
	e, at := api.BeginCmd(f.body, api.OpLaunch)
	l.Marshal(&e)
	f.body = api.EndCmd(e.B, at)
	s.added()
}

// Synchronize sends what is queued, waits for everything queued on the
// stream and returns the first error any of it met since the last
// Synchronize.
func (s *Stream) Synchronize() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flush()
	for _, f := range s.pending {
		s.settle(f)
	}
	clear(s.pending)
	s.pending = s.pending[:0]
	err := s.err
	s.err = nil
	return err
}

// Destroy synchronizes and removes the stream; buffers allocated to be
// freed with it are freed.
func (s *Stream) Destroy() error {
	if s.id == api.DefaultStream {
		return fmt.Errorf("the default stream cannot be destroyed: %w", api.ErrInvalidArgument)
	}
	err := s.Synchronize()
	_, derr := s.c.rpc.Call(api.OpStreamDestroy, nil, api.Encode(&api.StreamReq{Stream: s.id}))
	s.c.mu.Lock()
	delete(s.c.streams, s)
	s.c.mu.Unlock()
	s.mu.Lock()
	s.closeStaging()
	s.mu.Unlock()
	return errors.Join(err, derr)
}
