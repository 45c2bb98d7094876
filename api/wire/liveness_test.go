package wire

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
	"golang.org/x/sys/unix"
)

// Keepalive never gives up on a live idle peer before the bound (its probe
// goes out after at most half of it) and gives up on a silent one at the
// bound, or less than one probe interval after it.
func TestPeerKeepAlive(t *testing.T) {
	for _, bound := range []time.Duration{2 * time.Second, 2500 * time.Millisecond, 3 * time.Second,
		10 * time.Second, 61 * time.Second, 10 * time.Minute} {
		ka := peerKeepAlive(bound)
		abort := ka.Idle + time.Duration(ka.Count)*ka.Interval
		switch {
		case !ka.Enable || ka.Count < 1:
			t.Errorf("bound %v: %+v: want keepalive on with a positive count", bound, ka)
		case ka.Idle%time.Second != 0 || ka.Interval%time.Second != 0:
			t.Errorf("bound %v: %+v: want whole seconds", bound, ka)
		case ka.Idle < time.Second || ka.Idle > bound/2:
			t.Errorf("bound %v: idle %v: want 1s to half the bound", bound, ka.Idle)
		case abort < bound || abort >= bound+ka.Interval:
			t.Errorf("bound %v: %+v aborts after %v: want the bound, to within one interval", bound, ka, abort)
		}
		if rto := peerRTOMax(bound); rto < time.Second || rto > 120*time.Second || (bound >= 4*time.Second && rto > bound/4) {
			t.Errorf("bound %v: probe spacing %v: want 1s to 120s and at most a quarter of the bound", bound, rto)
		}
	}
}

func TestGone(t *testing.T) {
	const bound = 2 * time.Second
	for _, tc := range []struct {
		name         string
		info         unix.TCPInfo
		capped, gone bool
	}{
		{"idle and quiet", unix.TCPInfo{Last_ack_recv: 5000, Last_data_recv: 5000}, true, false},
		{"data unacknowledged, recent ack", unix.TCPInfo{Unacked: 3, Last_ack_recv: 1999, Last_data_recv: 9000}, true, false},
		{"data unacknowledged for the bound", unix.TCPInfo{Unacked: 3, Last_ack_recv: 2000, Last_data_recv: 9000}, false, true},
		{"recent data counts as a sign of life", unix.TCPInfo{Unacked: 3, Last_ack_recv: 9000, Last_data_recv: 100}, true, false},
		{"probes unanswered, capped", unix.TCPInfo{Probes: 2, Last_ack_recv: 2500, Last_data_recv: 2500}, true, true},
		{"probes unanswered, uncapped: left to keepalive", unix.TCPInfo{Probes: 2, Last_ack_recv: 2500, Last_data_recv: 2500}, false, false},
		{"probe just sent to a quiet peer", unix.TCPInfo{Probes: 1, Last_ack_recv: 1000, Last_data_recv: 1000}, true, false},
	} {
		silence, gone := gone(&tc.info, bound, tc.capped)
		if gone != tc.gone {
			t.Errorf("%s: gone = %v (silent %v), want %v", tc.name, gone, silence, tc.gone)
		}
	}
}

func TestCheckPeerTimeout(t *testing.T) {
	for _, d := range []time.Duration{MinPeerTimeout, MaxPeerTimeout} {
		if err := CheckPeerTimeout(d); err != nil {
			t.Errorf("CheckPeerTimeout(%v) = %v", d, err)
		}
	}
	for _, d := range []time.Duration{0, -time.Second, 1500 * time.Millisecond, MaxPeerTimeout + time.Second, 20 * time.Hour} {
		err := CheckPeerTimeout(d)
		if !errors.Is(err, vocab.ErrInvalidArgument) || !strings.Contains(err.Error(), d.String()) {
			t.Errorf("CheckPeerTimeout(%v) = %v: want ErrInvalidArgument naming %v", d, err, d)
		}
	}
}

// A watched connection carries data both ways, keeps the socket visible
// (Conn.Arrived), and closing it ends its watchdog.
func TestWatchPeerConn(t *testing.T) {
	c := loopback(t, func(c net.Conn) {
		b := make([]byte, 5)
		if _, err := c.Read(b); err == nil {
			c.Write(b)
		}
	})
	if _, err := WatchPeer(c, "peer", time.Second); !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Fatalf("WatchPeer with a 1s bound: %v, want ErrInvalidArgument", err)
	}
	w, err := WatchPeer(c, "peer", MinPeerTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	conn := NewConn(w)
	deadline := time.Now().Add(5 * time.Second)
	for conn.Arrived() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("Arrived() = %d, want the 5 bytes echoed", conn.Arrived())
		}
		time.Sleep(time.Millisecond)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.(*watchedConn).done:
	default:
		t.Fatal("Close did not end the watchdog")
	}
	if _, err := w.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v, want net.ErrClosed", err)
	}
}

// A request sent on a connection the watchdog gave up on fails with the
// watchdog's error, which says why, and names its class once: not
// "…: unavailable: unavailable".
func TestSendToASilentPeerSaysUnavailableOnce(t *testing.T) {
	c := loopback(t, func(c net.Conn) { c.Read(make([]byte, 1)) })
	w, err := WatchPeer(c, "node n1", MinPeerTimeout)
	if err != nil {
		t.Fatal(err)
	}
	// What the watchdog does once the peer has been silent past the bound.
	wc := w.(*watchedConn)
	lost := wc.silent(3*time.Second, "its host acknowledged nothing sent to it")
	wc.lost.Store(&lost)
	wc.tc.Close()
	defer w.Close()
	rpc := NewRPCCallerReads(NewConn(w), "node n1")
	err = rpc.Go(opNodeStatus, nil).Wait()
	if !errors.Is(err, vocab.ErrUnavailable) || !strings.Contains(err.Error(), "silent for 3s") {
		t.Fatalf("send on the given-up connection: %v, want the watchdog's error", err)
	}
	if n := strings.Count(err.Error(), vocab.ErrUnavailable.Error()); n != 1 {
		t.Fatalf("%q says %q %d times", err, vocab.ErrUnavailable, n)
	}
}

// loopback returns a TCP connection to a peer on loopback that runs serve
// on its end, which is closed when serve returns.
func loopback(t *testing.T, serve func(net.Conn)) *net.TCPConn {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}
