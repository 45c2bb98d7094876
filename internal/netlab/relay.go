package netlab

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A relay is a link emulator in user space, for kernels built without
// netem (CONFIG_NET_SCH_NETEM): it forwards Ethernet frames between a
// host's port in the switch and a veth pair whose other end is on the
// bridge, delaying, dropping and pacing them as a Netem says.
//
// It reads and writes through packet sockets with virtio-net headers
// (PACKET_VNET_HDR), so GSO super-packets (up to 64 KiB of TCP) and
// unfinished checksums cross it as the kernel made them. Consequences:
// Loss drops whole super-packets, and Rate counts their bytes.
//
// Each direction has a reader, which decides a frame's fate and departure
// time as it arrives, and a sender on a locked OS thread with a timer
// slack of 1ns, which sleeps with nanosleep until each departure: Go's
// timers wake about a millisecond late when the process is idle, which
// would swamp delays of a millisecond. Frames leave in the order they
// came (jitter never reorders), at least Delay (±Jitter) after arrival,
// typically 5-50µs more, and, with Rate, no faster than it. A direction
// holds at most Limit frames (1000 by default); more are dropped, as netem
// does.
type relay struct {
	shape    atomic.Pointer[Netem]
	limit    uint32       // Netem.Limit it started with: its queues' size
	state    atomic.Int32 // relayIdle, relayOn or relayDraining
	inflight atomic.Int64 // frames queued and not yet written
	a, b     *os.File     // packet sockets on the host's port and on the bridge's veth
	stop     chan struct{}
	wg       sync.WaitGroup
}

// Relay states. A relay starts idle, so that its sockets are there before
// the host's port leaves the bridge, and drains before it closes, so that
// frames it holds still arrive after the port has gone back: a shape
// change loses at most what arrives in the microseconds between the port
// leaving the bridge and activate (and may reorder a few frames).
const (
	relayIdle     = iota // reads and discards
	relayOn              // forwards
	relayDraining        // discards what it reads, sends what it holds
)

// frame is a frame on its way, with its virtio-net header.
type frame struct {
	data []byte
	at   time.Time // when it leaves
}

// maxFrame bounds what one read returns: a virtio-net header and a GSO
// packet of 64 KiB with its headers. Longer ones (BIG TCP, which the lab
// never turns on) would be truncated.
const maxFrame = 1 << 17

// startRelay opens a relay between the links with indexes portA and portB
// of the switch, shaped by n. It is idle until activate.
func (l *Lab) startRelay(portA, portB int, n Netem) (*relay, error) {
	r := &relay{stop: make(chan struct{}), limit: n.Limit}
	r.shape.Store(&n)
	var err error
	if r.a, err = l.packetSocket(portA); err != nil {
		return nil, err
	}
	if r.b, err = l.packetSocket(portB); err != nil {
		r.a.Close()
		return nil, err
	}
	limit := int(n.Limit)
	if limit == 0 {
		limit = 1000
	}
	for _, d := range [][2]*os.File{{r.a, r.b}, {r.b, r.a}} {
		q := make(chan frame, limit)
		r.wg.Add(2)
		go r.read(d[0], q)
		go r.send(d[1], q)
	}
	return r, nil
}

// packetSocket opens a packet socket on the switch's link ifindex: all
// frames that arrive there, none that leave (so a relay never reads what
// it wrote), with virtio-net headers.
func (l *Lab) packetSocket(ifindex int) (*os.File, error) {
	var f *os.File
	err := l.doIn(&l.sw, func() error {
		// Protocol 0 receives nothing until bind picks the link, so
		// no frame of another link slips in first.
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		for _, o := range []struct {
			level, opt, v int
			name          string
		}{
			{unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1, "PACKET_VNET_HDR"},
			{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING"},
			// Bursts of super-packets outrun the default buffer.
			{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16 << 20, "SO_RCVBUFFORCE"},
			{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 16 << 20, "SO_SNDBUFFORCE"},
		} {
			if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
				unix.Close(fd)
				return fmt.Errorf("packet socket on link %d: %s=%d: %w", ifindex, o.name, o.v, err)
			}
		}
		sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to link %d: %w", ifindex, err)
		}
		// Non-blocking, so os.File puts it in the poller and Close
		// wakes a blocked Read.
		f = os.NewFile(uintptr(fd), fmt.Sprintf("packet socket on link %d", ifindex))
		return nil
	})
	return f, err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// read reads frames from src into q, each with its departure time, until
// src is closed.
func (r *relay) read(src *os.File, q chan<- frame) {
	defer r.wg.Done()
	defer close(q)
	buf := make([]byte, maxFrame)
	var last, lastTx time.Time // departure, and end of transmission, of the previous frame
	for {
		m, err := src.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			// A frame the kernel could not describe in a virtio-net
			// header, or the link went away: skip it, and stop
			// only when closed, without spinning meanwhile.
			select {
			case <-r.stop:
				return
			case <-time.After(time.Millisecond):
			}
			continue
		}
		if r.state.Load() != relayOn {
			continue
		}
		n := r.shape.Load()
		if n.Loss > 0 && rand.Float64()*100 < n.Loss {
			continue
		}
		now := time.Now()
		at := now
		if n.Rate > 0 {
			// A link of this rate transmits one frame after the
			// other; the delay runs from the end of transmission.
			bits := uint64(max(m-virtioNetHdrLen, 0)) * 8
			lastTx = later(now, lastTx).Add(time.Duration(bits * uint64(time.Second) / n.Rate))
			at = lastTx
		}
		d := n.Delay
		if n.Jitter > 0 {
			d += time.Duration((rand.Float64()*2 - 1) * float64(n.Jitter))
		}
		at = later(at.Add(max(d, 0)), last)
		last = at
		r.inflight.Add(1)
		select {
		case q <- frame{data: bytes.Clone(buf[:m]), at: at}:
		default: // full: tail drop
			r.inflight.Add(-1)
		}
	}
}

// virtioNetHdrLen is the size of struct virtio_net_hdr before each frame.
const virtioNetHdrLen = 10

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// send writes the frames of q to dst as each one's time comes, until q is
// closed or the relay stops. It holds its OS thread, with a timer slack of
// 1ns, while it runs, and gives it back with the default slack: it must
// not return while locked, which would end the thread (see onThread).
func (r *relay) send(dst *os.File, q <-chan frame) {
	defer r.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, 0, 0, 0, 0) // 0: the thread's default
	for f := range q {
		for {
			d := time.Until(f.at)
			if d <= 0 {
				break
			}
			select {
			case <-r.stop:
				return
			default:
			}
			// Wake at least every 10ms to see a stop.
			ts := unix.NsecToTimespec(int64(min(d, 10*time.Millisecond)))
			unix.Nanosleep(&ts, nil)
		}
		// A full queue (ENOBUFS) or a link going down loses the frame,
		// as a wire would; closing dst ends the relay.
		_, err := dst.Write(f.data)
		r.inflight.Add(-1)
		if errors.Is(err, os.ErrClosed) {
			return
		}
	}
}

// set changes the shape from the next frame on.
func (r *relay) set(n Netem) { r.shape.Store(&n) }

// activate starts forwarding.
func (r *relay) activate() { r.state.Store(relayOn) }

// drain stops taking frames and waits, up to within, until the frames it
// holds are out.
func (r *relay) drain(within time.Duration) {
	r.state.Store(relayDraining)
	deadline := time.Now().Add(within)
	for r.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// close stops the relay; frames on their way are lost.
func (r *relay) close() {
	close(r.stop)
	r.a.Close()
	r.b.Close()
	r.wg.Wait()
}
