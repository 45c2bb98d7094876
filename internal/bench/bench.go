// Package bench measures the vgpu data path against raw baselines taken in
// the same run, since a figure alone on a noisy machine means little: every
// result is reported as a ratio to its baseline.
//
// Baselines run inside the benchmarking process: a loopback TCP stream of
// the same size and chunking as the bulk copies, and a ping-pong that takes
// the same two hops as a tenant's request (Unix socket, then TCP) through a
// relay goroutine to an echo goroutine.
//
// The cost of TLS on the mediator↔node link is measured apart from the
// mediator under test (NodeLink): the same in-process node is written to
// over plain TCP and over mutual TLS, alternately, in the same run.
package bench

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Report holds one run's measurements.
type Report struct {
	BulkBytes      int     `json:"bulk_bytes"`
	RawTCPMBps     float64 `json:"raw_tcp_mb_per_s"`
	H2DMBps        float64 `json:"h2d_mb_per_s"`
	D2HMBps        float64 `json:"d2h_mb_per_s"`
	H2DRatio       float64 `json:"h2d_ratio"`
	D2HRatio       float64 `json:"d2h_ratio"`
	RawPingPongUs  float64 `json:"raw_ping_pong_us"`
	SmallOpUs      float64 `json:"small_op_us"`
	SmallOpRatio   float64 `json:"small_op_ratio"`
	SmallOpSamples int     `json:"small_op_samples"`
	// Asynchronous launches of a tiny kernel (fill_f32 of one float) queued
	// on one stream and synchronized once, per second of the whole batch.
	LaunchesPerS float64 `json:"launches_per_s"`
	Launches     int     `json:"launches"`
	// NodeLink compares plain TCP and mutual TLS to a node (in process,
	// not the mediator's nodes); nil when skipped.
	*NodeLinkReport
}

// Options size a run.
type Options struct {
	Socket    string
	BulkBytes int // default 256 MiB
	Rounds    int // bulk repetitions, the median counts; default 3
	SmallOps  int // small operations timed; default 2000
	Launches  int // asynchronous tiny launches timed; default 20000
	// NodeLinkBytes sizes the TLS-against-plain comparison to an in-process
	// node; default min(BulkBytes, 64 MiB); negative: skip it.
	NodeLinkBytes int
}

// Run measures baselines and the system side by side.
func Run(opt Options) (*Report, error) {
	if opt.BulkBytes <= 0 {
		opt.BulkBytes = 256 << 20
	}
	if opt.Rounds <= 0 {
		opt.Rounds = 3
	}
	if opt.SmallOps <= 0 {
		opt.SmallOps = 2000
	}
	if opt.Launches <= 0 {
		opt.Launches = 20000
	}
	r := &Report{BulkBytes: opt.BulkBytes, SmallOpSamples: opt.SmallOps}
	buf := make([]byte, opt.BulkBytes)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	raw, err := median(opt.Rounds, func() (time.Duration, error) { return rawStream(buf) })
	if err != nil {
		return nil, fmt.Errorf("raw TCP stream: %w", err)
	}
	r.RawTCPMBps = mbps(len(buf), raw)

	c, err := client.Dial(client.Options{Socket: opt.Socket, Tenant: "bench"})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	p, err := c.Malloc(0, uint64(len(buf)))
	if err != nil {
		return nil, err
	}
	s := c.Stream()
	h2d, err := median(opt.Rounds, func() (time.Duration, error) {
		start := time.Now()
		s.CopyToDevice(p, buf)
		err := s.Synchronize()
		return time.Since(start), err
	})
	if err != nil {
		return nil, fmt.Errorf("host to device: %w", err)
	}
	back := make([]byte, len(buf))
	d2h, err := median(opt.Rounds, func() (time.Duration, error) {
		start := time.Now()
		s.CopyFromDevice(back, p)
		err := s.Synchronize()
		return time.Since(start), err
	})
	if err != nil {
		return nil, fmt.Errorf("device to host: %w", err)
	}
	if !slices.Equal(back, buf) {
		return nil, fmt.Errorf("device to host returned different bytes than were copied in: %w", api.ErrInternal)
	}
	r.H2DMBps, r.D2HMBps = mbps(len(buf), h2d), mbps(len(buf), d2h)
	r.H2DRatio, r.D2HRatio = r.H2DMBps/r.RawTCPMBps, r.D2HMBps/r.RawTCPMBps

	ping, err := rawPingPong(opt.SmallOps)
	if err != nil {
		return nil, fmt.Errorf("raw ping-pong: %w", err)
	}
	small := make([]byte, 4)
	start := time.Now()
	for range opt.SmallOps {
		s.CopyFromDevice(small, p)
		if err := s.Synchronize(); err != nil {
			return nil, fmt.Errorf("small operation: %w", err)
		}
	}
	op := time.Since(start)
	r.RawPingPongUs = us(ping, opt.SmallOps)
	r.SmallOpUs = us(op, opt.SmallOps)
	r.SmallOpRatio = r.SmallOpUs / r.RawPingPongUs
	if r.LaunchesPerS, err = launchRate(s, p, opt.Launches); err != nil {
		return nil, err
	}
	r.Launches = opt.Launches
	if err := c.Free(p); err != nil {
		return nil, err
	}
	if opt.NodeLinkBytes == 0 {
		opt.NodeLinkBytes = min(opt.BulkBytes, 64<<20)
	}
	if opt.NodeLinkBytes > 0 {
		if r.NodeLinkReport, err = NodeLink(opt.NodeLinkBytes, opt.Rounds); err != nil {
			return nil, fmt.Errorf("node link, TLS against plain TCP: %w", err)
		}
	}
	return r, nil
}

// launchRate queues n launches of a one-float fill on s, waits for them
// all, and checks that the last one took effect.
func launchRate(s *client.Stream, p client.Ptr, n int) (float64, error) {
	start := time.Now()
	for i := range n {
		s.Launch("fill_f32", client.Buf(p), client.I64(1), client.F32(float32(i)))
	}
	if err := s.Synchronize(); err != nil {
		return 0, fmt.Errorf("launches: %w", err)
	}
	rate := float64(n) / time.Since(start).Seconds()
	got := make([]byte, 4)
	s.CopyFromDevice(got, p)
	if err := s.Synchronize(); err != nil {
		return 0, err
	}
	if v := client.BytesFloat32(got)[0]; v != float32(n-1) {
		return 0, fmt.Errorf("after %d launches the buffer holds %g, want %d: %w", n, v, n-1, api.ErrInternal)
	}
	return rate, nil
}

func median(n int, f func() (time.Duration, error)) (time.Duration, error) {
	ds := make([]time.Duration, n)
	for i := range ds {
		d, err := f()
		if err != nil {
			return 0, err
		}
		ds[i] = d
	}
	slices.Sort(ds)
	return ds[n/2], nil
}

func mbps(n int, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }
func us(d time.Duration, n int) float64   { return float64(d.Microseconds()) / float64(n) }

// rawStream sends buf over loopback TCP in chunks of api.MaxChunk to a
// reader that discards it, and times it until the reader has everything.
func rawStream(buf []byte) (time.Duration, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	got := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		n, err := io.CopyBuffer(io.Discard, c, make([]byte, api.MaxChunk))
		if err == nil && n != int64(len(buf)) {
			err = fmt.Errorf("received %d bytes of %d", n, len(buf))
		}
		got <- err
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for off := 0; off < len(buf); off += api.MaxChunk {
		if _, err := c.Write(buf[off:min(off+api.MaxChunk, len(buf))]); err != nil {
			c.Close()
			return 0, err
		}
	}
	c.Close()
	err = <-got
	return time.Since(start), err
}

// rawPingPong times n round trips of a 20-byte message (a frame header and a
// 4-byte payload) over a Unix socket to a relay, which forwards it over TCP
// to an echo, and back the same way.
func rawPingPong(n int) (time.Duration, error) {
	dir, err := os.MkdirTemp("", "vgpu-bench")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer tl.Close()
	ul, err := net.Listen("unix", filepath.Join(dir, "relay.sock"))
	if err != nil {
		return 0, err
	}
	defer ul.Close()
	const msg = 20
	go func() { // echo
		c, err := tl.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, msg)
		for {
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	go func() { // relay
		u, err := ul.Accept()
		if err != nil {
			return
		}
		defer u.Close()
		t, err := net.Dial("tcp", tl.Addr().String())
		if err != nil {
			return
		}
		defer t.Close()
		t.(*net.TCPConn).SetNoDelay(true)
		b := make([]byte, msg)
		for {
			if _, err := io.ReadFull(u, b); err != nil {
				return
			}
			if _, err := t.Write(b); err != nil {
				return
			}
			if _, err := io.ReadFull(t, b); err != nil {
				return
			}
			if _, err := u.Write(b); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("unix", ul.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	b := make([]byte, msg)
	start := time.Now()
	for range n {
		if _, err := c.Write(b); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}
