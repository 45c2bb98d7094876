package wire

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"

	"github.com/vgpu/vgpu/api/vocab"
	"golang.org/x/sys/unix"
)

// File descriptors travel with frames on Unix sockets (SCM_RIGHTS), for host
// memory a tenant shares with its mediator. The receiver queues every
// descriptor that arrives, in order, and the request that needs one takes
// the oldest: descriptors arrive with the first byte of their frame, which
// the reader may buffer before the frame is handled.

// MaxQueuedFDs bounds the descriptors received and not yet taken; a peer
// that sends more breaks the protocol.
const MaxQueuedFDs = 8

type fdReader struct {
	uc  *net.UnixConn
	oob []byte

	mu     sync.Mutex
	fds    []int
	closed bool // closeAll ran: later descriptors are closed as they come
}

func (r *fdReader) Read(p []byte) (int, error) {
	n, oobn, _, _, err := r.uc.ReadMsgUnix(p, r.oob)
	n = max(n, 0) // a failed read may report -1
	if oobn > 0 {
		if ferr := r.keep(r.oob[:oobn]); ferr != nil {
			return n, ferr
		}
	}
	return n, err
}

// keep queues the descriptors of control message bytes, closing them all if
// the queue would overflow or the connection is closed: a read may return
// descriptors after closeAll, and nobody would take them.
func (r *fdReader) keep(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("control message: %v: %w", err, vocab.ErrProtocol)
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		err = fmt.Errorf("%d file descriptors arrived after close: %w", len(fds), net.ErrClosed)
	case len(r.fds)+len(fds) > MaxQueuedFDs:
		err = fmt.Errorf("peer sent %d file descriptors not yet used, limit %d: %w", len(r.fds)+len(fds), MaxQueuedFDs, vocab.ErrProtocol)
	default:
		r.fds = append(r.fds, fds...)
		return nil
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return err
}

func (r *fdReader) take() (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.fds) == 0 {
		return -1, false
	}
	fd := r.fds[0]
	r.fds = r.fds[1:]
	return fd, true
}

func (r *fdReader) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, fd := range r.fds {
		unix.Close(fd)
	}
	r.fds = nil
	r.closed = true
}

// NewConnFDs is NewConn for a Unix socket whose peer may send descriptors;
// TakeFD returns them. Close closes those never taken.
func NewConnFDs(nc net.Conn, uc *net.UnixConn) *Conn {
	c := NewConn(nc)
	c.fds = &fdReader{uc: uc, oob: make([]byte, unix.CmsgSpace(4*MaxQueuedFDs))}
	c.src.r = c.fds
	return c
}

// TakeFD returns the oldest descriptor received and not yet taken; the
// caller owns it. It fails with ErrProtocol if there is none.
func (c *Conn) TakeFD() (int, error) {
	if c.fds != nil {
		if fd, ok := c.fds.take(); ok {
			return fd, nil
		}
	}
	return -1, fmt.Errorf("request needs a file descriptor and none came with it: %w", vocab.ErrProtocol)
}

// WriteFrameFD writes one frame with fd attached to its first bytes. The
// connection must be a Unix socket.
func (c *Conn) WriteFrameFD(op Op, id uint64, fd int, parts ...[]byte) error {
	uc, ok := c.nc.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("passing a file descriptor needs a Unix socket, not %T: %w", c.nc, vocab.ErrInvalidArgument)
	}
	b := make([]byte, HeaderSize)
	for _, p := range parts {
		b = append(b, p...)
	}
	if len(b)-HeaderSize > MaxBody {
		return fmt.Errorf("frame %d (%v): %d-byte body exceeds limit %d: %w", id, op, len(b)-HeaderSize, MaxBody, vocab.ErrInvalidArgument)
	}
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)-HeaderSize))
	binary.LittleEndian.PutUint16(b[4:], uint16(op))
	binary.LittleEndian.PutUint64(b[8:], id)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.w.Flush(); err != nil {
		return err
	}
	// sendmsg on a stream socket may take only part of the frame (the
	// descriptor goes with that part); the rest follows as plain bytes.
	n, _, err := uc.WriteMsgUnix(b, unix.UnixRights(fd), nil)
	if err == nil && n < len(b) {
		var more int
		more, err = uc.Write(b[n:])
		n += more
	}
	if err != nil {
		if n > 0 {
			// Part of the frame went out: any frame after it would be
			// read as the rest of this one.
			c.Close()
		}
		return fmt.Errorf("frame %d (%v) with descriptor %d: %d of %d bytes written: %w", id, op, fd, n, len(b), err)
	}
	c.sent.Add(uint64(len(b)))
	return nil
}

// CallFD sends a request with fd attached and waits for its reply body.
func (r *RPC) CallFD(op Op, fd int, parts ...[]byte) ([]byte, error) {
	c, ok := r.register(op, nil)
	if ok {
		if err := r.conn.WriteFrameFD(op, c.id, fd, parts...); err != nil {
			r.sendFailed(c, err)
		}
	}
	err := c.Wait()
	return c.Body, err
}
