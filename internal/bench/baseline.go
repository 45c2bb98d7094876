package bench

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Baselines: what the hardware and the kernel give without vgpu in the way,
// measured in the same run as the system: in this process here, in peer
// processes in peer.go.

// memcpyTime times reps copies of src into dst (len(dst) == len(src)).
func memcpyTime(dst, src []byte, reps int) time.Duration {
	start := time.Now()
	for range reps {
		copy(dst, src)
	}
	return time.Since(start)
}

// tcpLink is a loopback TCP connection kept for the whole run, like a
// mediator's connection to its node: a sender end and a receiver end.
type tcpLink struct {
	send, recv net.Conn
}

func dialTCPLink() (*tcpLink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	acceptErr := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			acceptErr <- err
			return
		}
		accepted <- c
	}()
	send, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return nil, err
	}
	select {
	case recv := <-accepted:
		return &tcpLink{send: send, recv: recv}, nil
	case err := <-acceptErr:
		send.Close()
		return nil, err
	}
}

func (l *tcpLink) Close() error {
	l.send.Close()
	return l.recv.Close()
}

// stream sends src reps times over the link, written in chunks of
// wire.MaxChunk, to a receiver that reads each repetition into dst (the
// same size as src, already touched) with plain Read calls of up to
// wire.MaxChunk, the way a copy lands in its destination. It returns the
// time from the first write until the receiver has every byte.
func (l *tcpLink) stream(dst, src []byte, reps int) (time.Duration, error) {
	if len(dst) != len(src) {
		return 0, fmt.Errorf("raw stream: destination of %d bytes for %d: %w", len(dst), len(src), api.ErrInvalidArgument)
	}
	got := make(chan error, 1)
	go func() {
		for range reps {
			for off := 0; off < len(dst); {
				n, err := l.recv.Read(dst[off:min(off+wire.MaxChunk, len(dst))])
				off += n
				if err != nil {
					got <- fmt.Errorf("raw stream: received %d bytes of %d: %w", off, len(dst), err)
					return
				}
			}
		}
		got <- nil
	}()
	start := time.Now()
	for range reps {
		for off := 0; off < len(src); off += wire.MaxChunk {
			if _, err := l.send.Write(src[off:min(off+wire.MaxChunk, len(src))]); err != nil {
				l.Close() // ends the receiver
				<-got
				return 0, err
			}
		}
	}
	err := <-got
	return time.Since(start), err
}

// teardown is cleanups to run, last first.
type teardown []func()

func (t *teardown) add(f func()) { *t = append(*t, f) }

func (t teardown) run() {
	for _, f := range slices.Backward(t) {
		f()
	}
}

// inProcessPingPong connects to a relay goroutine over a Unix socket,
// which forwards what it gets over TCP to an echo goroutine, and back the
// same way: ProcessPingPong's hops within one process. stop ends them.
func inProcessPingPong() (c net.Conn, stop func(), err error) {
	var td teardown
	defer func() {
		if err != nil {
			td.run()
		}
	}()
	dir, err := os.MkdirTemp("", "vgpu-bench")
	if err != nil {
		return nil, nil, err
	}
	td.add(func() { os.RemoveAll(dir) })
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	td.add(func() { tl.Close() })
	ul, err := net.Listen("unix", filepath.Join(dir, "relay.sock"))
	if err != nil {
		return nil, nil, err
	}
	td.add(func() { ul.Close() })
	go func() {
		if c, err := tl.Accept(); err == nil {
			defer c.Close()
			_ = echo(c)
		}
	}()
	go func() {
		u, err := ul.Accept()
		if err != nil {
			return
		}
		t, err := net.Dial("tcp", tl.Addr().String())
		if err != nil {
			u.Close()
			return
		}
		_ = relay(u, t)
	}()
	if c, err = net.Dial("unix", ul.Addr().String()); err != nil {
		return nil, nil, err
	}
	td.add(func() { c.Close() })
	return c, td.run, nil
}

func medianOf(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func us(d time.Duration, n int) float64 { return d.Seconds() * 1e6 / float64(n) }

// ratio is a/b, or 0 when b is not a measurement.
func ratio(a, b float64) float64 {
	if !(b > 0) {
		return 0
	}
	return a / b
}
