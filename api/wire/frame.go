package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/vgpu/vgpu/api/vocab"
	"golang.org/x/sys/unix"
)

// HeaderSize is the size of a frame header on the wire.
const HeaderSize = 16

// MaxChunk is the largest bulk payload one frame carries; bigger copies are
// split into chunks of this size and pipelined.
const MaxChunk = 1 << 20

// MaxBody is the largest frame body a peer accepts: a chunk plus room for the
// fields in front of it. A header announcing more is a protocol error.
const MaxBody = MaxChunk + 64<<10

// BodyTimeout bounds how long a peer may take to deliver a body once its
// header has arrived, so a connection that stalls mid-frame is dropped. It is
// a variable only so tests can shorten it; set it before any Conn reads, and
// never while one does (it is read without synchronisation).
var BodyTimeout = 30 * time.Second

// Frame flags.
const (
	FlagReply uint16 = 1 << iota // the frame answers request ID
	FlagError                    // the reply body is an error (code, message)
	FlagPush                     // an unsolicited notice from the server; never answered
)

// Header precedes every frame: body length, operation, flags, request id.
// Replies carry the id of their request, so requests pipeline.
type Header struct {
	Len   uint32
	Op    Op
	Flags uint16
	ID    uint64
	// read is when a Conn with an observer read this request (observe.go);
	// 0 otherwise. Not on the wire.
	read int64
}

// directMin is the body size from which a frame bypasses the connection's
// buffers: it is written with its header in one vectored write (writev)
// instead of being copied into the write buffer first, and its body is
// read, once what is buffered has been taken, from the socket straight
// into its destination. A bulk chunk so crosses user space once on each
// side, as a raw stream's bytes do; smaller frames still share buffers and
// system calls.
const directMin = 16 << 10

// bulkLead is how much more than asked for a read buffer that is empty
// takes while bulk frames are read: the next frame's header and a bulk
// write's fields (device and extents), not the payload behind them.
const bulkLead = 512

// Conn frames a byte stream. Reads are for one goroutine at a time; writes
// may come from many and are serialised whole frames at a time.
type Conn struct {
	nc   net.Conn
	src  capReader // what r reads from: nc, or the descriptor reader (fd.go)
	r    *bufio.Reader
	bulk bool // the frame being read, or last read, has a bulk body (directMin or more); reader only
	wmu  sync.Mutex
	w    *bufio.Writer
	whdr [HeaderSize]byte // the header being written; guarded by wmu
	// vec writes buffers to nc in one system call where nc can (a TCP or
	// Unix socket, watched or not); nil otherwise (TLS).
	vec func(*net.Buffers) (int64, error)
	iov net.Buffers // a vectored write's buffers; guarded by wmu
	hdr [HeaderSize]byte
	fds *fdReader // descriptors received, if the peer may send them (fd.go)

	sent, recv atomic.Uint64 // frame bytes written and read
	holds      atomic.Int32  // Hold calls not yet released: writes stay buffered
	obs        ReplyObserver // told of each reply to a request read here; set before the first read (Observe)
}

// Hold keeps frames written from now on in the connection's buffer, so that
// a burst of them leaves in a few large writes rather than one system call
// each, until every Hold is Released. Frames written with force (RPC.Go,
// RPC.Call: someone waits for their reply) still flush everything. A
// holder must Release before it blocks on anything.
func (c *Conn) Hold() { c.holds.Add(1) }

// Release ends a Hold; the last one flushes what is buffered.
func (c *Conn) Release() error {
	if c.holds.Add(-1) != 0 {
		return nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.Flush()
}

// Buffered is how many bytes have been read from the connection and not yet
// consumed: more than a header means the peer's next frame has arrived.
func (c *Conn) Buffered() int { return c.r.Buffered() }

// Arrived is Buffered plus what the kernel holds for the connection and
// nobody has read yet, where the connection can tell (a TCP or Unix
// socket): how much of the peer's next frames is already here.
func (c *Conn) Arrived() int {
	n := c.r.Buffered()
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return n
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return n
	}
	_ = raw.Control(func(fd uintptr) {
		if q, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			n += q
		}
	})
	return n
}

// Counts returns the bytes of frames, headers included, written to and
// read from the connection so far.
func (c *Conn) Counts() (sent, recv uint64) { return c.sent.Load(), c.recv.Load() }

// NewConn wraps nc.
func NewConn(nc net.Conn) *Conn {
	c := &Conn{nc: nc, src: capReader{r: nc}, w: bufio.NewWriterSize(nc, 64<<10), vec: vectored(nc)}
	c.r = bufio.NewReaderSize(&c.src, 64<<10)
	return c
}

// vectored returns a vectored write to nc, or nil where nc has none.
func vectored(nc net.Conn) func(*net.Buffers) (int64, error) {
	switch c := nc.(type) {
	case *net.TCPConn:
		return func(b *net.Buffers) (int64, error) { return b.WriteTo(c) }
	case *net.UnixConn:
		return func(b *net.Buffers) (int64, error) { return b.WriteTo(c) }
	case *watchedConn:
		return c.writeBuffers
	}
	return nil
}

// capReader passes reads on to r, at most max bytes each while max is
// set: the read buffer fills from it, and a capped fill leaves a bulk
// payload in the socket, to be read straight into its destination.
type capReader struct {
	r   io.Reader
	max int // 0: no cap
}

func (s *capReader) Read(p []byte) (int, error) {
	if s.max > 0 && len(p) > s.max {
		p = p[:s.max]
	}
	return s.r.Read(p)
}

// NetConn returns the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.nc }

// Close closes the connection; blocked reads and writes return.
func (c *Conn) Close() error {
	if c.fds != nil {
		c.fds.closeAll()
	}
	return c.nc.Close()
}

// ReadHeader reads and validates the next frame header.
func (c *Conn) ReadHeader() (Header, error) {
	if c.bulk && c.r.Buffered() < HeaderSize {
		// Bulk frames tend to follow each other: take this one's header
		// and leading fields, and leave its payload to be read into place.
		// Also when part of the header came with the last frame's end:
		// the read for the rest would otherwise fill the whole buffer.
		c.src.max = bulkLead
	}
	_, err := io.ReadFull(c.r, c.hdr[:])
	c.src.max = 0
	if err != nil {
		return Header{}, err
	}
	c.recv.Add(HeaderSize)
	h := Header{
		Len:   binary.LittleEndian.Uint32(c.hdr[0:]),
		Op:    Op(binary.LittleEndian.Uint16(c.hdr[4:])),
		Flags: binary.LittleEndian.Uint16(c.hdr[6:]),
		ID:    binary.LittleEndian.Uint64(c.hdr[8:]),
	}
	c.bulk = h.Len >= directMin
	if c.obs != nil && h.Flags&(FlagReply|FlagPush) == 0 {
		h.read = monotonic()
	}
	if h.Len > MaxBody {
		return h, fmt.Errorf("frame %d (%v) announces a %d-byte body, limit %d: %w", h.ID, h.Op, h.Len, MaxBody, vocab.ErrProtocol)
	}
	return h, nil
}

// ReadBody reads the body of the frame whose header was just read into p,
// which must be exactly h.Len long. The body must arrive within BodyTimeout.
func (c *Conn) ReadBody(p []byte) error { return c.readBody(p) }

// readBody is ReadBody for a body read into the pieces of ps in order, as
// long together as the body.
func (c *Conn) readBody(ps ...[]byte) error {
	n := 0
	for _, p := range ps {
		n += len(p)
	}
	if n == 0 {
		return nil
	}
	if c.r.Buffered() < n {
		_ = c.nc.SetReadDeadline(time.Now().Add(BodyTimeout))
		defer c.nc.SetReadDeadline(time.Time{})
	}
	for _, p := range ps {
		n, err := c.readFull(p)
		c.recv.Add(uint64(n))
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readFull fills p by read.
func (c *Conn) readFull(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := c.read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// read reads into p from the read buffer while it holds bytes. Once it is
// empty, p of directMin bytes or more is read from the socket itself,
// without passing through the buffer; a smaller p of a bulk frame (its
// fields, or the rest of a payload that arrived in pieces) refills the
// buffer with p and at most bulkLead more, so that the next frame's
// payload is not drawn into the buffer either. The caller never asks for
// more than the frame holds, so no other frame's bytes bypass the buffer.
func (c *Conn) read(p []byte) (int, error) {
	if c.r.Buffered() == 0 {
		if len(p) >= directMin {
			return c.src.Read(p)
		}
		if c.bulk {
			c.src.max = len(p) + bulkLead
			n, err := c.r.Read(p)
			c.src.max = 0
			return n, err
		}
	}
	return c.r.Read(p)
}

// BodyReader returns a reader of the next n body bytes of the frame whose
// header was just read, under the same BodyTimeout as ReadBody, for a
// receiver that reads the fields in front of a payload and then the payload
// straight into where it goes. The caller must consume exactly n bytes.
func (c *Conn) BodyReader(n int) io.Reader {
	return &bodyReader{c: c, left: n}
}

type bodyReader struct {
	c     *Conn
	left  int
	timed bool // the connection's read deadline is set for this body
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	if !b.timed && b.c.r.Buffered() < len(p) {
		// Once per body, not per read: the payload is read in pieces.
		_ = b.c.nc.SetReadDeadline(time.Now().Add(BodyTimeout))
		b.timed = true
	}
	n, err := b.c.read(p)
	if b.left -= n; b.left == 0 && b.timed {
		_ = b.c.nc.SetReadDeadline(time.Time{})
	}
	b.c.recv.Add(uint64(n))
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// skipBody discards the n-byte body of the frame whose header was just read,
// under the same BodyTimeout as ReadBody, so the stream stays in step.
func (c *Conn) skipBody(n int) error {
	if c.r.Buffered() < n {
		_ = c.nc.SetReadDeadline(time.Now().Add(BodyTimeout))
		defer c.nc.SetReadDeadline(time.Time{})
	}
	got, err := c.r.Discard(n)
	c.recv.Add(uint64(got))
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// WriteFrame writes one frame whose body is the concatenation of parts,
// and flushes it unless the connection is held (Hold). A body of directMin
// bytes or more goes straight to the socket without being copied, where
// the socket takes vectored writes.
func (c *Conn) WriteFrame(op Op, flags uint16, id uint64, parts ...[]byte) error {
	return c.writeFrame(false, op, flags, id, parts...)
}

func (c *Conn) writeFrame(force bool, op Op, flags uint16, id uint64, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n > MaxBody {
		return fmt.Errorf("frame %d (%v): %d-byte body exceeds limit %d: %w", id, op, n, MaxBody, vocab.ErrInvalidArgument)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	hdr := &c.whdr // a local array would escape through bufio's io.Writer
	binary.LittleEndian.PutUint32(hdr[0:], uint32(n))
	binary.LittleEndian.PutUint16(hdr[4:], uint16(op))
	binary.LittleEndian.PutUint16(hdr[6:], flags)
	binary.LittleEndian.PutUint64(hdr[8:], id)
	if n >= directMin && c.vec != nil {
		return c.writeVectored(n, parts)
	}
	if _, err := c.w.Write(hdr[:]); err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := c.w.Write(p); err != nil {
			return err
		}
	}
	c.sent.Add(uint64(HeaderSize + n))
	if !force && c.holds.Load() > 0 {
		return nil
	}
	return c.w.Flush()
}

// writeVectored writes the frame whose header is in whdr and whose n-byte
// body is parts in one system call, after what is buffered. Such a frame
// is not kept back by Hold: a burst of them gains nothing from buffering.
// The caller holds wmu.
func (c *Conn) writeVectored(n int, parts [][]byte) error {
	if c.w.Buffered() > 0 {
		if err := c.w.Flush(); err != nil {
			return err
		}
	}
	c.iov = append(append(c.iov[:0], c.whdr[:]), parts...)
	all := c.iov
	_, err := c.vec(&c.iov) // consumes c.iov
	clear(all)              // keeps no reference to the caller's parts
	c.iov = all[:0]
	if err != nil {
		return err
	}
	c.sent.Add(uint64(HeaderSize + n))
	return nil
}

// Push sends the peer an unsolicited notice (FlagPush), flushed at once
// even while the connection is held.
func (c *Conn) Push(op Op, body []byte) error {
	return c.writeFrame(true, op, FlagPush, 0, body)
}

// Reply answers request h with a body made of parts.
func (c *Conn) Reply(h Header, parts ...[]byte) error {
	err := c.WriteFrame(h.Op, FlagReply, h.ID, parts...)
	c.observe(h, vocab.CodeOK)
	return err
}

// ReplyError answers request h with err's code and message, cut to
// MaxString bytes (cutMessage). A nil err is answered as an internal error
// rather than with a code the peer would reject.
func (c *Conn) ReplyError(h Header, err error) error {
	if err == nil {
		err = fmt.Errorf("%v failed without an error: %w", h.Op, vocab.ErrInternal)
	}
	e := Encoder{}
	e.U16(uint16(vocab.CodeOf(err)))
	e.String(cutMessage(err.Error()))
	werr := c.WriteFrame(h.Op, FlagReply|FlagError, h.ID, e.B)
	c.observe(h, vocab.CodeOf(err))
	return werr
}

// cutMessage fits msg in MaxString bytes. A message of several lines (every
// mistake of a quota file, one a line) keeps whole lines from its start and
// says how many it dropped, so no line reaches the reader cut in the
// middle; a message whose first lines already fill the limit is cut on a
// UTF-8 boundary.
func cutMessage(msg string) string {
	if len(msg) <= MaxString {
		return msg
	}
	const room = 32 // for "\n(N more lines)"
	if i := strings.LastIndexByte(msg[:MaxString-room], '\n'); i > 0 {
		return fmt.Sprintf("%s\n(%d more lines)", msg[:i], strings.Count(msg[i+1:], "\n")+1)
	}
	cut := MaxString
	for cut > MaxString-utf8.UTFMax && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}

// DecodeError turns an error reply body into a *RemoteError.
func DecodeError(body []byte) error {
	d := NewDecoder(body)
	code := vocab.Code(d.U16())
	msg := d.Str()
	if err := d.Finish(); err != nil {
		return fmt.Errorf("malformed error reply: %w", err)
	}
	if !code.Known() {
		return &vocab.RemoteError{Code: vocab.CodeProtocol, Msg: fmt.Sprintf("error reply with unknown code %d: %s", code, msg)}
	}
	return &vocab.RemoteError{Code: code, Msg: msg}
}

// ReadFirst reads the first frame of a connection, which must be a request
// of operation op with a body of at most maxBody bytes, and returns its
// header and body (the handshake: api.ReadHello).
//
// The whole frame, header and body, must arrive by deadline: unlike
// ReadBody, it never moves the connection's deadline to BodyTimeout, so a
// peer that sends a header and stalls holds the connection for the
// handshake's time and no longer. A header that announces more than
// maxBody is refused before anything is allocated for its body.
//
// The returned header is the zero Header when the frame must not be
// answered: it could not be read, or it is not a request (a reply, an
// error or a push where a request was due ends the connection unanswered,
// as protocol errors on a frame that is not a request do). Otherwise a
// failure may be answered with ReplyError on the returned header.
func (c *Conn) ReadFirst(deadline time.Time, op Op, maxBody uint32) (Header, []byte, error) {
	_ = c.nc.SetDeadline(deadline)
	defer c.nc.SetDeadline(time.Time{})
	h, err := c.ReadHeader()
	if err != nil {
		return Header{}, nil, fmt.Errorf("%v: %w", op, err)
	}
	if h.Flags != 0 {
		return Header{}, nil, fmt.Errorf("first frame (%v, id %d) has flags %#x, want a request: %w", h.Op, h.ID, h.Flags, vocab.ErrProtocol)
	}
	if h.Op != op {
		// Its body is not read: the connection ends here.
		return h, nil, fmt.Errorf("first request is %v, want %v: %w", h.Op, op, vocab.ErrProtocol)
	}
	if h.Len > maxBody {
		return h, nil, fmt.Errorf("%v announces a %d-byte body, limit %d: %w", op, h.Len, maxBody, vocab.ErrProtocol)
	}
	body := make([]byte, h.Len)
	n, err := io.ReadFull(c.r, body)
	c.recv.Add(uint64(n))
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Header{}, nil, fmt.Errorf("%v body: %w", op, err)
	}
	return h, body, nil
}
