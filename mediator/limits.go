package mediator

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
)

// Limits on what a tenant's connection may hold up.
//
// In flight: every command a session's reader accepts counts against two
// bounds until its reply is written: the session's, maxSessionInflight
// decoded commands, and its tenant's over all its sessions,
// maxTenantInflight (a batch or a graph launch counts each of its commands,
// a drain's barrier none). That holds whether the command waits in a
// stream's queue (streamDepth of them) or was issued by the reader itself
// on an idle stream. When either bound is reached, the reader stops reading
// the socket until answers give room back: a tenant that floods requests
// without reading replies fills its own socket and slows only itself (its
// own other sessions included: they share its bound, as its quota), and
// the mediator holds at most maxTenantInflight commands' worth of node calls
// and decoded commands for a tenant (some 300 to 700 bytes each), however
// many sessions it opens. A batch or graph of more than maxSessionInflight
// commands is refused when it is decoded, so one always fits in a session
// and tenant with nothing in flight. A client must read replies while it
// sends (the Go SDK's calls do), or past the bound its writes and the
// mediator's replies wait on each other until ReplyTimeout ends the session.
//
// Frames: a header announcing more than wire.MaxBody drops the connection,
// and so does a body that stalls past wire.BodyTimeout (wire.Conn.ReadBody).
//
// Replies: every write of a reply must complete within ReplyTimeout. A
// tenant that stops reading its replies (a slow reader) holds up only its
// own streams; after ReplyTimeout its connection is closed, the session
// ends, and its memory is freed. The same bounds the teardown of a tenant
// that half-closed its connection and reads nothing.

// MaxSessionBuffers bounds the bulk buffers (wire.MaxBody bytes each) one
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

// maxSessionInflight bounds the commands one session has in flight, and
// those of one batch (decodeCommands) or graph; maxTenantInflight those of
// all a tenant's sessions, at least one session's worth.
const (
	maxSessionInflight = 1 << 14
	maxTenantInflight  = 1 << 15
)

// errHungUp ends a session whose tenant closed its connection while the
// reader waited for room in a stream's queue.
var errHungUp = errors.New("tenant closed its connection with a full stream queue")

// replyConn puts a deadline of timeout on every write. wire.Conn writes
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

// bound counts commands in flight against a limit, for a session or for
// all of a tenant's sessions. Readers take room with tryTake, waiting on
// awaitRoom while there is none; answers give it back with give, which
// wakes the waiters.
type bound struct {
	limit   int64
	n       atomic.Int64
	waiters atomic.Int32
	mu      sync.Mutex
	room    chan struct{} // closed by the next give while waiters > 0; guarded by mu
}

// tryTake counts n more in flight if they fit.
func (b *bound) tryTake(n int64) bool {
	for {
		cur := b.n.Load()
		if cur+n > b.limit {
			return false
		}
		if b.n.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// give returns n, waking whoever waits for room.
func (b *bound) give(n int64) {
	if n == 0 {
		return
	}
	b.n.Add(-n)
	// A waiter counts itself before it last tries to take and then waits
	// on the channel it got then, so either its try sees this room or
	// this sees it waiting and closes that channel (or a later one, which
	// a closed earlier one implies).
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		if b.room != nil {
			close(b.room)
			b.room = nil
		}
		b.mu.Unlock()
	}
}

// awaitRoom counts the caller as waiting and returns a channel closed by
// the next give; the caller then tries again, and calls doneWaiting.
func (b *bound) awaitRoom() <-chan struct{} {
	b.waiters.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.room == nil {
		b.room = make(chan struct{})
	}
	return b.room
}

func (b *bound) doneWaiting() { b.waiters.Add(-1) }

// admit counts a command of n decoded commands in flight for the session
// and its tenant, waiting while either has too many (the reader then reads
// no more of the socket). If the tenant hangs up meanwhile, the session is
// marked gone (its queued work is then skipped and its waits for bandwidth
// end) and admit fails with errHungUp. Only the session's reader admits.
func (s *session) admit(n int64) error {
	take := func() bool {
		if !s.inflight.tryTake(n) {
			return false
		}
		if !s.bw.inflight.tryTake(n) {
			s.inflight.n.Add(-n) // nobody waits on the session's bound but this reader
			return false
		}
		return true
	}
	if n == 0 || take() {
		return nil
	}
	tick := time.NewTicker(hangupPoll)
	defer tick.Stop()
	for {
		own, tenant := s.inflight.awaitRoom(), s.bw.inflight.awaitRoom()
		ok, ticked, ending := take(), false, false
		if !ok {
			select {
			case <-own:
			case <-tenant:
			case <-s.ending: // a reply could not be written: the tenant is gone
				ending = true
			case <-tick.C:
				ticked = true
			}
		}
		s.inflight.doneWaiting()
		s.bw.inflight.doneWaiting()
		if ok {
			return nil
		}
		if ticked && !s.gone.Load() && hungUp(s.c.NetConn()) {
			s.end(true)
		}
		if ending || s.gone.Load() {
			return fmt.Errorf("%w: %w", errHungUp, api.ErrUnavailable)
		}
	}
}

// answered gives back the room of n decoded commands whose reply has been
// written (or that were dropped unanswered).
func (s *session) answered(n int64) {
	s.inflight.give(n)
	s.bw.inflight.give(n)
}

// enqueue hands cmd, admitted, to st, waiting while its queue is full. If
// the tenant hangs up meanwhile, the session is marked gone and a command
// is dropped with errHungUp; a barrier is still queued, so that what waits
// on it returns only once the stream's earlier work is done.
func (s *session) enqueue(st *stream, cmd command) error {
	select {
	case st.cmds <- cmd:
		return nil
	default:
	}
	tick := time.NewTicker(hangupPoll)
	defer tick.Stop()
	for {
		select {
		case st.cmds <- cmd:
			return nil
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

// Connections that have not said hello: each holds the mediator's buffers
// (some 128 KiB) and a goroutine for up to HandshakeTimeout, before the
// mediator knows who it serves, so the host socket (mode 0666 by default:
// any local user reaches it) bounds them: MaxHandshakesPerUID from any one
// peer uid and MaxHandshakes in all. It also bounds each uid's connections
// whatever they do after their hello, MaxHostConnsPerUID (an operator
// connection reading status, or a session where access is open), so that
// no user can spend the mediator's descriptors. A connection past any bound
// is closed at once, unanswered. Privileged peers (root, the mediator's
// user: the hooks that register containers) are never counted nor refused,
// so a flood cannot keep containers from starting. A container's socket
// needs no such bound: MaxContainerConns bounds every connection of it,
// greeted or not.
const (
	MaxHandshakesPerUID = 32
	MaxHandshakes       = 128
	MaxHostConnsPerUID  = 256
)

// unknownUID stands for the peers of connections that carry no
// credentials (not Unix sockets), which share one uid's bounds.
const unknownUID = math.MaxUint32

// handshakes counts a socket's connections, those whose hello is awaited
// and all, by peer uid.
type handshakes struct {
	log logrus.FieldLogger
	mu  sync.Mutex
	// awaiting and total are the connections awaiting their hello, by
	// peer uid and in all; live every connection by peer uid; refused
	// counts those closed since the last warning, logged at most once a
	// second (lastWarn). Guarded by mu.
	awaiting map[uint32]int
	total    int
	live     map[uint32]int
	refused  int
	lastWarn time.Time
}

func newHandshakes(log logrus.FieldLogger) *handshakes {
	return &handshakes{log: log, awaiting: map[uint32]int{}, live: map[uint32]int{}}
}

// admit counts nc, or reports false if nc is over a bound and must be
// closed. greeted uncounts it as awaiting its hello, closed as live; each
// may be called more than once.
func (h *handshakes) admit(nc net.Conn) (greeted, closed func(), ok bool) {
	uid := uint32(unknownUID)
	if cred, err := peerCred(nc); err == nil {
		if cred.Uid == 0 || int(cred.Uid) == os.Getuid() {
			return func() {}, func() {}, true
		}
		uid = cred.Uid
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.awaiting[uid] >= MaxHandshakesPerUID || h.total >= MaxHandshakes || h.live[uid] >= MaxHostConnsPerUID {
		h.refused++
		if now := time.Now(); now.Sub(h.lastWarn) >= time.Second {
			h.log.WithFields(logrus.Fields{"uid": uid, "uid_awaiting": h.awaiting[uid], "awaiting": h.total, "uid_connections": h.live[uid], "refused": h.refused}).
				Warnf("refusing connections that have not said hello: at most %d per uid and %d in all may wait, and a uid may hold %d", MaxHandshakesPerUID, MaxHandshakes, MaxHostConnsPerUID)
			h.lastWarn, h.refused = now, 0
		}
		return nil, nil, false
	}
	h.awaiting[uid]++
	h.total++
	h.live[uid]++
	var helloOnce, closeOnce sync.Once
	greeted = func() {
		helloOnce.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.total--
			decr(h.awaiting, uid)
		})
	}
	closed = func() {
		greeted()
		closeOnce.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			decr(h.live, uid)
		})
	}
	return greeted, closed, true
}

// decr counts one less of k, forgetting k at zero.
func decr(m map[uint32]int, k uint32) {
	if m[k]--; m[k] == 0 {
		delete(m, k)
	}
}
