package metrics

import (
	"net"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// BenchmarkObservedSmallCall is api's small call (BenchmarkRPCSmallCall's
// by-hand exchange: one small request at a time over loopback TCP to an
// echo server) to three servers in turn: two whose connections are plain,
// as a daemon without --metrics serves, and one observed by a Requests, as
// with it. Each iteration calls each once, in a rotating order, so a slow
// moment of the host weighs on all three. It reports observed/plain, and
// plain/plain of the two plain servers: the noise that ratio has to beat.
//
//	go test -run xxx -bench ObservedSmallCall -count 10 ./metrics/
func BenchmarkObservedSmallCall(b *testing.B) {
	conns := []*wire.Conn{echoConn(b, nil), echoConn(b, nil), echoConn(b, NewRequests(true))}
	body := []byte("small request")
	reply := make([]byte, len(body))
	var took [3]time.Duration
	for i := uint64(0); b.Loop(); i++ {
		for k := range conns {
			j := (int(i) + k) % len(conns)
			start := time.Now()
			if err := conns[j].WriteFrame(api.OpFree, 0, i, body); err != nil {
				b.Fatal(err)
			}
			h, err := conns[j].ReadHeader()
			if err != nil || int(h.Len) != len(body) {
				b.Fatal(h, err)
			}
			if err := conns[j].ReadBody(reply); err != nil {
				b.Fatal(err)
			}
			took[j] += time.Since(start)
		}
	}
	b.ReportMetric(float64(took[0].Nanoseconds())/float64(b.N), "plain-ns/call")
	b.ReportMetric(float64(took[2].Nanoseconds())/float64(b.N), "observed-ns/call")
	b.ReportMetric(float64(took[2])/float64(took[0]), "observed/plain")
	b.ReportMetric(float64(took[1])/float64(took[0]), "plain2/plain")
}

// BenchmarkReplied is what an observed reply adds to a daemon's request
// path beyond the two clock reads: the Requests' histogram observation.
func BenchmarkReplied(b *testing.B) {
	r := NewRequests(true)
	for b.Loop() {
		r.Replied(api.OpLaunch, 20*time.Microsecond, api.CodeOK)
	}
}

// BenchmarkClock is one of the two clock reads an observed request adds
// (api's monotonic: time.Since of a fixed start).
func BenchmarkClock(b *testing.B) {
	start := time.Now()
	var d time.Duration
	for b.Loop() {
		d += time.Since(start)
	}
	_ = d
}

// echoConn starts an echo server on loopback whose connection reports to
// obs (nil: none) and returns a connection to it.
func echoConn(b *testing.B, obs wire.ReplyObserver) *wire.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		c := wire.NewConn(nc)
		defer c.Close()
		if obs != nil {
			c.Observe(obs)
		}
		buf := make([]byte, 64)
		for {
			h, err := c.ReadHeader()
			if err != nil || int(h.Len) > len(buf) {
				return
			}
			if err := c.ReadBody(buf[:h.Len]); err != nil {
				return
			}
			if err := c.Reply(h, buf[:h.Len]); err != nil {
				return
			}
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	c := wire.NewConn(nc)
	b.Cleanup(func() { c.Close() })
	return c
}
