package wire

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
	"golang.org/x/sys/unix"
)

// Liveness of a TCP peer (a node, as a mediator sees it, and a mediator, as
// a node sees it).
//
// A peer is declared gone once its host has been silent for a bound: it has
// acknowledged nothing, neither data nor probes, while this end waited for
// it. The peer's kernel acknowledges data and answers probes whatever its
// process does, so a busy peer (a long kernel, a full queue that closes its
// receive window) is never cut off; a partition, a crashed host or a pulled
// cable is declared within the bound instead of the minutes TCP takes by
// itself (about 15 for unacknowledged data, over 2 for an idle connection
// under Go's default keepalive). All of it follows from the one bound T:
//
//   - Keepalive: an idle connection is probed after about T/2 of silence
//     and the kernel aborts it (ETIMEDOUT) once T has passed without an
//     answer (peerKeepAlive).
//   - Probe spacing: the retransmission and zero-window probe timers back
//     off to at most T/4 (TCP_RTO_MAX_MS, Linux 6.15 and later), so a live
//     peer whose window is closed still answers a probe well within T.
//   - A watchdog reads the socket's TCP_INFO every T/8 and closes the
//     connection once the last acknowledgement is T old while data or
//     probes are outstanding (gone).
//
// TCP_USER_TIMEOUT is deliberately not set: Linux applies it to a closed
// receive window too (the time since the window closed, however promptly
// the peer answers the probes), so it would cut off a node that applies
// backpressure for longer than T, as one does while a stream's copies queue
// behind a long kernel. Where TCP_RTO_MAX_MS is missing, the watchdog
// counts only unacknowledged data, keepalive still bounds idle connections,
// and a closed window is left to TCP's own, slower, retransmission limit.

// DefaultPeerTimeout is how long a peer's host may stay silent, unless
// configured otherwise.
const DefaultPeerTimeout = 10 * time.Second

// MinPeerTimeout is the least bound a peer's silence may have: keepalive
// counts in whole seconds, and a live idle connection is silent for up to
// its one-second idle time before its probe is answered.
const MinPeerTimeout = 2 * time.Second

// MaxPeerTimeout is the greatest bound: keepalive's idle time (half the
// bound) must stay within the kernel's limit of 32767 s, and a peer silent
// for an hour is gone by any measure.
const MaxPeerTimeout = time.Hour

// CheckPeerTimeout says why d cannot bound a peer's silence, or nil.
func CheckPeerTimeout(d time.Duration) error {
	switch {
	case d < MinPeerTimeout:
		return fmt.Errorf("peer timeout %v is under the minimum %v (keepalive probes go in whole seconds): %w", d, MinPeerTimeout, vocab.ErrInvalidArgument)
	case d > MaxPeerTimeout:
		return fmt.Errorf("peer timeout %v is over the maximum %v: %w", d, MaxPeerTimeout, vocab.ErrInvalidArgument)
	}
	return nil
}

// peerKeepAlive returns the keepalive settings for bound: probes start
// after about half of it, and the kernel aborts the connection after idle +
// count × interval: never less than bound, less than one interval more.
func peerKeepAlive(bound time.Duration) net.KeepAliveConfig {
	idle := max(time.Second, (bound / 2).Truncate(time.Second))
	rest := max(time.Second, bound-idle)
	interval := max(time.Second, (rest / 3).Truncate(time.Second))
	count := int((rest + interval - 1) / interval)
	return net.KeepAliveConfig{Enable: true, Idle: idle, Interval: interval, Count: count}
}

// peerRTOMax is the cap on the retransmission and probe timers for bound,
// within the kernel's range for TCP_RTO_MAX_MS (1 s to 120 s).
func peerRTOMax(bound time.Duration) time.Duration {
	return min(max(bound/4, time.Second), 120*time.Second)
}

// gone decides from a TCP_INFO snapshot whether the peer has been silent
// too long: the last thing it sent is bound old or older while data waits
// for its acknowledgement or, where probes are spaced closer than bound
// (capped), a probe waits for its answer. It returns how long the peer has
// been silent.
func gone(info *unix.TCPInfo, bound time.Duration, capped bool) (time.Duration, bool) {
	silence := time.Duration(min(info.Last_ack_recv, info.Last_data_recv)) * time.Millisecond
	waiting := info.Unacked > 0 || (capped && info.Probes > 0)
	return silence, waiting && silence >= bound
}

// WatchPeer sets keepalive and probe spacing on tc for bound (at least
// MinPeerTimeout) and returns tc watched by a watchdog: once the peer's host
// has been silent for bound, the connection is closed, and its reads and
// writes, those blocked at that moment included, fail with an error that
// wraps ErrUnavailable and names peer and how long it was silent. So does a
// connection the kernel aborted on its keepalive. The watchdog ends when the
// returned connection is closed. Put TLS on top of the returned connection,
// not under it.
func WatchPeer(tc *net.TCPConn, peer string, bound time.Duration) (net.Conn, error) {
	if err := CheckPeerTimeout(bound); err != nil {
		return nil, err
	}
	if err := tc.SetKeepAliveConfig(peerKeepAlive(bound)); err != nil {
		return nil, fmt.Errorf("%s: keepalive: %w", peer, err)
	}
	w := &watchedConn{Conn: tc, tc: tc, peer: peer, bound: bound, done: make(chan struct{})}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", peer, err)
	}
	if err := raw.Control(func(fd uintptr) {
		// Older kernels refuse the option (ENOPROTOOPT): watch without it.
		w.capped = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_RTO_MAX_MS, int(peerRTOMax(bound).Milliseconds())) == nil
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", peer, err)
	}
	go w.watch(max(bound/8, 100*time.Millisecond))
	return w, nil
}

// watchedConn is a TCP connection whose peer's silence is bounded
// (WatchPeer). Only net.Conn's methods are promoted, so no other way of
// reading or writing (ReadFrom, WriteTo) bypasses explain; SyscallConn is
// kept for callers that look at the socket (Conn.Arrived).
type watchedConn struct {
	net.Conn // tc
	tc       *net.TCPConn
	peer     string
	bound    time.Duration
	capped   bool // probes are spaced at most peerRTOMax(bound) apart

	lost      atomic.Pointer[error] // why the watchdog closed the connection
	done      chan struct{}         // closed by Close
	closeOnce sync.Once
}

func (w *watchedConn) Read(p []byte) (int, error) {
	n, err := w.tc.Read(p)
	if err != nil {
		err = w.explain(err)
	}
	return n, err
}

func (w *watchedConn) Write(p []byte) (int, error) {
	n, err := w.tc.Write(p)
	if err != nil {
		err = w.explain(err)
	}
	return n, err
}

// writeBuffers writes b to the socket in one vectored write (a Conn's bulk
// frames), its error explained as Write's are.
func (w *watchedConn) writeBuffers(b *net.Buffers) (int64, error) {
	n, err := b.WriteTo(w.tc)
	if err != nil {
		err = w.explain(err)
	}
	return n, err
}

// SyscallConn is the TCP socket's.
func (w *watchedConn) SyscallConn() (syscall.RawConn, error) { return w.tc.SyscallConn() }

// Close closes the connection and ends its watchdog.
func (w *watchedConn) Close() error {
	w.closeOnce.Do(func() { close(w.done) })
	return w.tc.Close()
}

// explain replaces the error of a connection that was given up on, by the
// watchdog or by the kernel's keepalive, with one that says so.
func (w *watchedConn) explain(err error) error {
	if lost := w.lost.Load(); lost != nil {
		return *lost
	}
	if errors.Is(err, syscall.ETIMEDOUT) {
		silence := w.bound
		if info, ierr := w.info(); ierr == nil {
			silence, _ = gone(info, w.bound, w.capped)
		}
		return w.silent(silence, "its keepalive probes went unanswered: "+err.Error())
	}
	return err
}

// silent is the error of a peer given up on after silence; how says how
// that showed.
func (w *watchedConn) silent(silence time.Duration, how string) error {
	return fmt.Errorf("%s silent for %v, past the %v limit (%s; partitioned or down): %w",
		w.peer, silence.Round(10*time.Millisecond), w.bound, how, vocab.ErrUnavailable)
}

func (w *watchedConn) info() (*unix.TCPInfo, error) {
	raw, err := w.tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return nil, err
	}
	return info, ierr
}

// watch checks the peer's silence every poll until the connection is
// closed, and closes it once the peer is gone.
func (w *watchedConn) watch(poll time.Duration) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-t.C:
		}
		info, err := w.info()
		if err != nil {
			return // closed
		}
		if silence, ok := gone(info, w.bound, w.capped); ok {
			err := w.silent(silence, "its host acknowledged nothing sent to it")
			w.lost.Store(&err)
			w.tc.Close() // blocked reads and writes return, with err
			return
		}
	}
}
