package mediator

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
)

// Limits on what a tenant's connection may hold up.
//
// In flight: a session's reader hands each stream command to the stream's
// queue (streamDepth commands) and the stream keeps at most streamDepth more
// in flight on the nodes, so a session has at most
// MaxStreams × 2 × streamDepth commands accepted and not yet answered. When
// the queue of the stream a command names is full, or the session's queues
// hold maxQueuedCmds decoded commands (a batch counts each of its own), the
// reader stops reading the socket until there is room: a tenant that floods
// requests fills its own socket and slows only itself, and the mediator's
// memory for a session's queued commands stays bounded (a decoded command
// takes some 300 bytes, a batch's commands on the wire as few as 18). A
// batch or graph of more than maxQueuedCmds commands is refused when it is
// decoded, so the reader holds at most that many more: the request it is
// running itself or waiting to queue.
//
// Frames: a header announcing more than api.MaxBody drops the connection,
// and so does a body that stalls past api.BodyTimeout (api.Conn.ReadBody).
//
// Replies: every write of a reply must complete within ReplyTimeout. A
// tenant that stops reading its replies (a slow reader) holds up only its
// own streams; after ReplyTimeout its connection is closed, the session
// ends, and its memory is freed. The same bounds the teardown of a tenant
// that half-closed its connection and reads nothing.

// MaxSessionBuffers bounds the bulk buffers (api.MaxBody bytes each) one
// session holds in the mediator, separately for request bodies that are read
// and not yet sent to a node (copies to the device waiting in stream queues
// or for bandwidth) and for replies of copies from the device that are not
// yet written to the tenant. The reader waits for a buffer before it reads a
// large body, a stream before it issues a copy from the device; either wait
// holds up only that session. Without the bound a tenant could make the
// mediator hold MaxStreams × 2 × streamDepth chunks.
const MaxSessionBuffers = 32

// ReplyTimeout bounds each write to a tenant or operator connection. It is
// a variable only so tests can shorten it; set it before the mediator
// serves, never while it does.
var ReplyTimeout = 30 * time.Second

// hangupPoll is how often a reader blocked on a full stream queue checks
// whether its tenant has gone.
const hangupPoll = 50 * time.Millisecond

// maxQueuedCmds bounds the decoded commands a session's stream queues
// hold, and those of one batch (decodeCommands), which therefore always
// fits in a session with none queued.
const maxQueuedCmds = 1 << 14

// errHungUp ends a session whose tenant closed its connection while the
// reader waited for room in a stream's queue.
var errHungUp = errors.New("tenant closed its connection with a full stream queue")

// replyConn puts a deadline of timeout on every write. api.Conn writes
// frames under its write lock, so writes never overlap.
type replyConn struct {
	net.Conn
	timeout time.Duration
	until   int64 // monoNow of the write deadline last set
}

func withReplyTimeout(nc net.Conn) net.Conn {
	if ReplyTimeout <= 0 {
		return nc
	}
	return &replyConn{Conn: nc, timeout: ReplyTimeout}
}

func (c *replyConn) Write(p []byte) (int, error) {
	// Moving the deadline costs a wall-clock read and a runtime timer
	// update per write; it is moved only once an eighth of the timeout has
	// passed, so each write still gets between 7/8 of the timeout and all
	// of it.
	if now := monoNow(); c.until-now < int64(c.timeout-c.timeout/8) {
		c.until = now + int64(c.timeout)
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.timeout))
	}
	n, err := c.Conn.Write(p)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("peer read no reply for %v: %w", c.timeout, err)
		}
	}
	return n, err
}

// hungUp reports whether the peer of nc has closed its connection for good
// (both directions; a half-close is not a hang-up), even with data it sent
// still unread. It says false where it cannot tell.
func hungUp(nc net.Conn) bool {
	if rc, ok := nc.(*replyConn); ok {
		nc = rc.Conn
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	hung := false
	_ = raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			hung = fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		}
	})
	return hung
}

// enqueue hands cmd to st, waiting while its queue is full or the session's
// queues hold too many decoded commands for it (maxQueuedCmds). If the tenant
// hangs up meanwhile, the session is marked gone (its queued work is then
// skipped and its waits for bandwidth end) and a command is dropped with
// errHungUp; a barrier is still queued, so that what waits on it returns
// only once the stream's earlier work is done.
func (s *session) enqueue(st *stream, cmd command) error {
	n := cmd.weight()
	fits := func() bool { return n == 0 || s.queuedCmds.Load()+n <= maxQueuedCmds }
	if fits() {
		select {
		case st.cmds <- cmd:
			s.queuedCmds.Add(n)
			return nil
		default:
		}
	}
	tick := time.NewTicker(hangupPoll)
	defer tick.Stop()
	for {
		var send chan command // nil, so not chosen, while the session is full
		if fits() {
			send = st.cmds
		}
		select {
		case send <- cmd:
			s.queuedCmds.Add(n)
			return nil
		case <-s.room:
		case <-tick.C:
			if !s.gone.Load() && hungUp(s.c.NetConn()) {
				s.end(true)
				if cmd.barrier == nil {
					return fmt.Errorf("%w: %w", errHungUp, api.ErrUnavailable)
				}
			}
		}
	}
}

// dequeued gives back the room of n decoded commands an executor has run,
// waking a reader waiting for it.
func (s *session) dequeued(n int64) {
	if n == 0 {
		return
	}
	s.queuedCmds.Add(-n)
	select {
	case s.room <- struct{}{}:
	default:
	}
}

// takeBuffer takes one of the session's bulk buffers from sem (inBufs or
// outBufs), waiting until one is free. It fails if the session ends or the
// tenant hangs up meanwhile.
func (s *session) takeBuffer(sem chan struct{}) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	tick := time.NewTicker(hangupPoll)
	defer tick.Stop()
	for {
		select {
		case sem <- struct{}{}:
			return nil
		case <-s.ending:
			return fmt.Errorf("session ending: %w", api.ErrUnavailable)
		case <-tick.C:
			if !s.gone.Load() && hungUp(s.c.NetConn()) {
				s.end(true)
				return fmt.Errorf("%w: %w", errHungUp, api.ErrUnavailable)
			}
		}
	}
}

// putIn returns a request body's buffer.
func (s *session) putIn(pool *[]byte) {
	bodyPool.Put(pool)
	<-s.inBufs
}

// await waits until ch is closed, marking the session gone if the tenant
// hangs up meanwhile, which makes the wait short.
func (s *session) await(ch <-chan struct{}) {
	select {
	case <-ch:
		return
	default:
	}
	tick := time.NewTicker(hangupPoll)
	defer tick.Stop()
	for {
		select {
		case <-ch:
			return
		case <-tick.C:
			if !s.gone.Load() && hungUp(s.c.NetConn()) {
				s.end(true)
			}
		}
	}
}
