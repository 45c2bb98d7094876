package bench

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Baseline peers in their own processes. The system under test is several
// processes (tenant, mediator, node), and waking another process costs
// more than waking a goroutine, so the headline baselines take the same
// process hops: the raw stream's receiver, and the ping-pong's relay and
// echo, are children of this process (this binary again, told its role by
// PeerEnv). The in-process variants are measured and reported too.

// PeerEnv makes a process a baseline peer: "sink SIZE", "echo" or
// "relay SOCKET ADDR".
const PeerEnv = "VGPU_BENCH_PEER"

// ServePeerIfAsked runs the baseline peer role PeerEnv names, if it names
// one, and exits. Binaries and tests that run the suite call it first.
func ServePeerIfAsked() {
	role := os.Getenv(PeerEnv)
	if role == "" {
		return
	}
	if err := servePeer(strings.Fields(role)); err != nil {
		fmt.Fprintf(os.Stderr, "bench peer %q: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func servePeer(args []string) error {
	switch {
	case len(args) == 2 && args[0] == "sink":
		size, err := strconv.Atoi(args[1])
		if err != nil || size <= 0 {
			return fmt.Errorf("sink size %q: %w", args[1], api.ErrInvalidArgument)
		}
		return serveTCP(func(c net.Conn) error { return sink(c, make([]byte, size)) })
	case len(args) == 1 && args[0] == "echo":
		return serveTCP(echo)
	case len(args) == 3 && args[0] == "relay":
		l, err := net.Listen("unix", args[1])
		if err != nil {
			return err
		}
		fmt.Println("ready")
		u, err := l.Accept()
		if err != nil {
			return err
		}
		t, err := net.Dial("tcp", args[2])
		if err != nil {
			return err
		}
		return relay(u, t)
	}
	return fmt.Errorf("unknown role %q: %w", args, api.ErrInvalidArgument)
}

// serveTCP listens on loopback, says where on stdout, and serves one
// connection.
func serveTCP(serve func(net.Conn) error) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(l.Addr())
	c, err := l.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	return serve(c)
}

// sink receives rounds: an 8-byte count n, then n bytes, which it reads
// into dst (wrapping around) in reads of up to wire.MaxChunk, then a one-byte
// acknowledgement.
func sink(c net.Conn, dst []byte) error {
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		for left, off := binary.LittleEndian.Uint64(hdr[:]), 0; left > 0; {
			if off == len(dst) {
				off = 0
			}
			n, err := c.Read(dst[off:min(off+wire.MaxChunk, len(dst), off+int(min(left, uint64(len(dst)))))])
			off += n
			left -= uint64(n)
			if err != nil {
				return err
			}
		}
		if _, err := c.Write(hdr[:1]); err != nil {
			return err
		}
	}
}

// pingMsg is a ping-pong message: a frame header and a 4-byte payload.
const pingMsg = 20

func echo(c net.Conn) error {
	b := make([]byte, pingMsg)
	for {
		if _, err := io.ReadFull(c, b); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if _, err := c.Write(b); err != nil {
			return err
		}
	}
}

func relay(u, t net.Conn) error {
	defer u.Close()
	defer t.Close()
	t.(*net.TCPConn).SetNoDelay(true)
	b := make([]byte, pingMsg)
	for {
		if _, err := io.ReadFull(u, b); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if _, err := t.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(t, b); err != nil {
			return err
		}
		if _, err := u.Write(b); err != nil {
			return err
		}
	}
}

// peer is a running baseline peer process.
type peer struct {
	cmd  *exec.Cmd
	line string // what it printed first: its address, or "ready"
}

func startPeer(role string) (*peer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), PeerEnv+"="+role)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start baseline peer %q: %w", role, err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("baseline peer %q did not start (is ServePeerIfAsked called first in main or TestMain?): %w", role, err)
	}
	return &peer{cmd: cmd, line: strings.TrimSpace(line)}, nil
}

func (p *peer) stop() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// sinkLink is a TCP connection to a sink process.
type sinkLink struct {
	p *peer
	c net.Conn
}

func dialSink(size int) (*sinkLink, error) {
	p, err := startPeer(fmt.Sprintf("sink %d", size))
	if err != nil {
		return nil, err
	}
	c, err := net.Dial("tcp", p.line)
	if err != nil {
		p.stop()
		return nil, err
	}
	return &sinkLink{p: p, c: c}, nil
}

func (l *sinkLink) Close() error {
	err := l.c.Close()
	l.p.stop()
	return err
}

// stream sends src reps times in chunks of wire.MaxChunk and returns the
// time until the sink has acknowledged every byte.
func (l *sinkLink) stream(src []byte, reps int) (time.Duration, error) {
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(len(src)*reps))
	start := time.Now()
	if _, err := l.c.Write(hdr[:]); err != nil {
		return 0, err
	}
	for range reps {
		for off := 0; off < len(src); off += wire.MaxChunk {
			if _, err := l.c.Write(src[off:min(off+wire.MaxChunk, len(src))]); err != nil {
				return 0, err
			}
		}
	}
	if _, err := io.ReadFull(l.c, hdr[:1]); err != nil {
		return 0, fmt.Errorf("raw stream to a sink process: %w", err)
	}
	return time.Since(start), nil
}

// PingPong is the raw three-process ping-pong: a connection to a relay
// process that forwards what it gets to an echo process, Unix socket then
// TCP, like a tenant's request to its mediator and the mediator's to its
// node.
type PingPong struct {
	Conn              net.Conn // to the relay
	RelayPid, EchoPid int
	td                teardown
}

// ProcessPingPong starts the relay and echo processes, this binary again
// (ServePeerIfAsked), and connects to the relay. Close ends them.
func ProcessPingPong() (p *PingPong, err error) {
	p = &PingPong{}
	defer func() {
		if err != nil {
			p.td.run()
		}
	}()
	dir, err := os.MkdirTemp("", "vgpu-bench")
	if err != nil {
		return nil, err
	}
	p.td.add(func() { os.RemoveAll(dir) })
	e, err := startPeer("echo")
	if err != nil {
		return nil, err
	}
	p.td.add(e.stop)
	sock := filepath.Join(dir, "relay.sock")
	r, err := startPeer("relay " + sock + " " + e.line)
	if err != nil {
		return nil, err
	}
	p.td.add(r.stop)
	if p.Conn, err = net.Dial("unix", sock); err != nil {
		return nil, err
	}
	p.td.add(func() { p.Conn.Close() })
	p.RelayPid, p.EchoPid = r.cmd.Process.Pid, e.cmd.Process.Pid
	return p, nil
}

// RoundTrips times n round trips of a pingMsg-byte message.
func (p *PingPong) RoundTrips(n int) (time.Duration, error) { return pingPong(p.Conn, n) }

// Close ends the connection and the peer processes.
func (p *PingPong) Close() { p.td.run() }

// pingPong times n round trips of a pingMsg-byte message on c.
func pingPong(c net.Conn, n int) (time.Duration, error) {
	b := make([]byte, pingMsg)
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

// parallelStreams is how many raw streams the parallel baseline splits
// the bytes over: one per core, two at least and four at most. The data
// path itself uses one connection per session and node, so this is a
// baseline at the limit of what the host's loopback gives, not a twin of
// the system.
func parallelStreams() int { return min(4, max(2, runtime.NumCPU())) }

// parallelLink is TCP connections to sink processes, one each, written to
// at once.
type parallelLink []*sinkLink

// dialParallel starts n sinks that receive up to size bytes between them.
func dialParallel(n, size int) (parallelLink, error) {
	var p parallelLink
	for range n {
		l, err := dialSink((size + n - 1) / n)
		if err != nil {
			p.Close()
			return nil, err
		}
		p = append(p, l)
	}
	return p, nil
}

func (p parallelLink) Close() error {
	var errs []error
	for _, l := range p {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// stream sends src reps times, split into len(p) parts of (nearly) equal
// size, each part over its own connection from its own goroutine, and
// returns the time until every sink has acknowledged every byte.
func (p parallelLink) stream(src []byte, reps int) (time.Duration, error) {
	part := (len(src) + len(p) - 1) / len(p)
	errs := make([]error, len(p))
	var wg sync.WaitGroup
	start := time.Now()
	for i, l := range p {
		lo := min(i*part, len(src))
		wg.Go(func() { _, errs[i] = l.stream(src[lo:min(lo+part, len(src))], reps) })
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}
