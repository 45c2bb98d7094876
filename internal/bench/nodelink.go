package bench

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/sim"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/internal/pki"
)

// NodeLinkReport compares bulk writes to a node over plain TCP and over the
// mediator↔node mutual TLS, measured in the same run against the same
// in-process node.
type NodeLinkReport struct {
	Bytes     int     `json:"node_link_bytes"`
	PlainMBps float64 `json:"node_plain_mb_per_s"`
	TLSMBps   float64 `json:"node_tls_mb_per_s"`
	Ratio     float64 `json:"node_tls_ratio"` // TLS / plain: 1 means TLS costs nothing
	// The range of the rounds' TLS / plain.
	RatioMin float64 `json:"node_tls_ratio_min"`
	RatioMax float64 `json:"node_tls_ratio_max"`
}

// nodeWindow is how many 1 MiB writes the benchmark keeps in flight, as a
// mediator's stream does with the pipeline full.
const nodeWindow = 32

// A Network is where NodeLinkOn runs: the node listens on the node's side
// and the mediator's side dials it. Loopback is the one NodeLink uses.
type Network struct {
	NodeIP string                                  // the address the node listens on, and its certificate names
	Listen func(addr string) (net.Listener, error) // a TCP listener on the node's side
	Dial   func(addr string) (net.Conn, error)     // a TCP connection from the mediator's side
}

// Loopback is a Network on 127.0.0.1 of this process's namespace.
var Loopback = Network{
	NodeIP: "127.0.0.1",
	Listen: func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) },
	Dial: func(addr string) (net.Conn, error) {
		return (&net.Dialer{Timeout: 10 * time.Second}).Dial("tcp", addr)
	},
}

// NodeLink is NodeLinkOn Loopback, each round's writes repeated to last
// window at least.
func NodeLink(bytes, rounds int, window time.Duration) (*NodeLinkReport, error) {
	return nodeLink(Loopback, bytes, rounds, window)
}

// NodeLinkOn starts an in-process sim node that serves plain TCP on one
// listener and mutual TLS (a throw-away CA, as `vgpuctl certs init` makes)
// on another, both on nw's node side, connects to each from the mediator's
// side as a mediator does, and times writing bytes (rounded up to whole
// frames) to frames of the connection in pipelined wire.MaxChunk node-write
// frames. Plain and TLS take turns in interleaved rounds (rounds.go), after
// one warm-up write each; the median of rounds counts.
func NodeLinkOn(nw Network, bytes, rounds int) (*NodeLinkReport, error) {
	return nodeLink(nw, bytes, rounds, 0)
}

// nodeLink is NodeLinkOn, each round's writes of bytes repeated to last
// window at least (0: once).
func nodeLink(nw Network, bytes, rounds int, window time.Duration) (*NodeLinkReport, error) {
	if rounds <= 0 {
		rounds = 3
	}
	frames := max(1, (bytes+accelerator.FrameSize-1)/accelerator.FrameSize)
	bytes = frames * accelerator.FrameSize
	log := logrus.New()
	log.SetOutput(io.Discard)
	devs, err := sim.NewDevices(1, uint64(2*bytes))
	if err != nil {
		return nil, err
	}
	node, err := accelerator.New("sim", []accelerator.Device{devs[0]}, log)
	if err != nil {
		devs[0].Close()
		return nil, err
	}
	defer node.Close()
	nodeCfg, medCfg, err := pki.Ephemeral(nw.NodeIP)
	if err != nil {
		return nil, err
	}
	medCfg.ServerName = nw.NodeIP
	var addrs [2]string
	for i, cfg := range []*tls.Config{nil, nodeCfg} {
		l, err := nw.Listen(net.JoinHostPort(nw.NodeIP, "0"))
		if err != nil {
			return nil, err
		}
		wl, err := accelerator.Watch(l, cfg, accelerator.DefaultMediatorTimeout)
		if err != nil {
			l.Close()
			return nil, err
		}
		addrs[i] = l.Addr().String()
		go node.Serve(wl) // ends when the node closes
	}

	plain, err := dialLink(nw, addrs[0], nil, frames)
	if err != nil {
		return nil, fmt.Errorf("plain TCP: %w", err)
	}
	defer plain.rpc.Close()
	secure, err := dialLink(nw, addrs[1], medCfg, frames)
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	defer secure.rpc.Close()

	buf := make([]byte, wire.MaxChunk)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	// The calibration's first write commits the sim device's memory.
	rates, err := interleave([]*contender{
		{name: "plain TCP", min: 1, run: func(n int) (time.Duration, error) { return plain.write(buf, n) }},
		{name: "TLS", min: 1, run: func(n int) (time.Duration, error) { return secure.write(buf, n) }},
	}, schedule{rounds: rounds, slices: DefaultSlices, window: window})
	if err != nil {
		return nil, err
	}
	mb := float64(bytes) / 1e6
	tr := ratioSpread(rates[1], rates[0])
	return &NodeLinkReport{Bytes: bytes, PlainMBps: spreadOf(rates[0]).Median * mb, TLSMBps: spreadOf(rates[1]).Median * mb,
		Ratio: tr.Median, RatioMin: tr.Min, RatioMax: tr.Max}, nil
}

// link is a mediator-style connection to a node holding frames.
type link struct {
	rpc    *wire.RPC
	frames []uint64
}

func dialLink(nw Network, addr string, cfg *tls.Config, frames int) (*link, error) {
	nc, err := nw.Dial(addr)
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		tc := tls.Client(nc, cfg)
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		tc.SetDeadline(time.Time{})
		nc = tc
	}
	rpc := wire.NewRPC(wire.NewConn(nc), "node "+addr)
	hello := api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator, Tenant: "bench"}
	if _, err := rpc.Call(api.OpHello, nil, api.Encode(&hello)); err != nil {
		rpc.Close()
		return nil, err
	}
	body, err := rpc.Call(api.OpNodeAlloc, nil, api.Encode(&api.NodeAlloc{Device: 0, Count: uint32(frames)}))
	var got api.NodeFrames
	if err == nil {
		err = api.Decode(body, &got)
	}
	if err == nil && len(got.Frames) != frames {
		err = fmt.Errorf("node granted %d frames of %d: %w", len(got.Frames), frames, api.ErrInternal)
	}
	if err != nil {
		rpc.Close()
		return nil, err
	}
	return &link{rpc: rpc, frames: got.Frames}, nil
}

// write fills the link's frames with chunk reps times, nodeWindow writes
// in flight, and returns how long it took until the last one was
// acknowledged.
func (l *link) write(chunk []byte, reps int) (time.Duration, error) {
	per := accelerator.FrameSize / len(chunk)
	calls := make([]*wire.Call, 0, nodeWindow)
	start := time.Now()
	for i := range reps * len(l.frames) {
		f := l.frames[i%len(l.frames)]
		for j := range per {
			if len(calls) == nodeWindow {
				if err := calls[0].Wait(); err != nil {
					return 0, err
				}
				calls = calls[1:]
			}
			hdr := api.Encode(&api.NodeAccess{Extents: []api.Extent{{Addr: f + uint64(j*len(chunk)), Len: uint64(len(chunk))}}})
			calls = append(calls, l.rpc.Go(api.OpNodeWrite, nil, hdr, chunk))
		}
	}
	for _, c := range calls {
		if err := c.Wait(); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}
