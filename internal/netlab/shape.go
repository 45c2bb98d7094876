package netlab

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Rates for Netem.Rate, in bits per second.
const (
	Kbit uint64 = 1000
	Mbit        = 1000 * Kbit
	Gbit        = 1000 * Mbit
)

// Netem shapes a host's link. Each field applies to each direction of the
// link on its own: a Delay of 2ms adds 4ms to a round trip between the
// host and any other, and a Loss of 1% loses about 2% of round trips.
// Its zero value is an unshaped link.
//
// Under the relay (see Shaper) a shaped link differs from netem's: delays
// come out 5-50µs longer (a hop through this process), jitter never
// reorders, Loss and Rate apply to GSO super-packets of up to 64 KiB as
// one frame each, and the relay itself carries about 9 Gbit/s at most on
// the project's 2-core machines (an unshaped link: about 20). A shape of
// Rate alone (with or without Limit) never takes the relay: the kernel's
// token bucket filter (tbf) keeps it on both ends of the veth pair, at any
// speed the veth reaches, with a queue each way of Limit full-size frames
// (1514 bytes), or 10 ms of the rate when Limit is 0, and at least its
// bucket (tbf).
type Netem struct {
	Delay  time.Duration // added to every packet; microsecond resolution, below a minute
	Jitter time.Duration // random variation of Delay, up to ±Jitter; needs Delay
	Loss   float64       // percent of packets dropped, 0 to 100
	Rate   uint64        // bits per second, such as 25*Gbit; 0: as fast as the link goes
	Limit  uint32        // packets (relay: frames) each direction may hold; 0: netem's default, 1000
}

func (n Netem) String() string {
	return fmt.Sprintf("delay %v jitter %v loss %g%% rate %d bit/s limit %d", n.Delay, n.Jitter, n.Loss, n.Rate, n.Limit)
}

// check says what is wrong with n, naming the values.
func (n Netem) check() error {
	switch {
	case n.Delay < 0 || n.Delay >= time.Minute:
		return fmt.Errorf("netem delay %v: want 0 to under a minute", n.Delay)
	case n.Delay > 0 && n.Delay < time.Microsecond:
		return fmt.Errorf("netem delay %v: netem counts microseconds, want 0 or at least 1µs", n.Delay)
	case n.Jitter < 0 || n.Jitter >= time.Minute:
		return fmt.Errorf("netem jitter %v: want 0 to under a minute", n.Jitter)
	case n.Jitter > 0 && n.Delay == 0:
		return fmt.Errorf("netem jitter %v without a delay: netem varies the delay, so set Delay too", n.Jitter)
	case n.Loss < 0 || n.Loss > 100 || n.Loss != n.Loss:
		return fmt.Errorf("netem loss %g%%: want 0 to 100", n.Loss)
	case n.Rate > 0 && n.Rate < 8:
		return fmt.Errorf("netem rate %d bit/s: want 0 (unlimited) or at least 8 (netem counts bytes)", n.Rate)
	}
	return nil
}

// rateOnly says whether n only limits the rate, which tbf can do where
// netem is missing.
func (n Netem) rateOnly() bool {
	return n.Rate > 0 && n.Delay == 0 && n.Jitter == 0 && n.Loss == 0
}

// ShaperEnv picks how links are shaped: "netem" (fail if the kernel lacks
// it), "relay" (the user-space relay even where netem exists), or unset:
// netem where the kernel has it, else the relay.
const ShaperEnv = "VGPU_NETLAB_SHAPER"

// Shapers.
const (
	shaperNetem = "netem"
	shaperRelay = "relay"
)

// pickShaper decides how this lab shapes links: netem on both ends of a
// host's veth pair where the kernel has it, else a relay (see relay).
// It tries netem on the switch's bridge to find out.
func (l *Lab) pickShaper() error {
	want := os.Getenv(ShaperEnv)
	switch want {
	case "", shaperNetem, shaperRelay:
	default:
		return fmt.Errorf("%s=%q: want %q, %q or nothing", ShaperEnv, want, shaperNetem, shaperRelay)
	}
	if want == shaperRelay {
		l.shaper, l.why = shaperRelay, ShaperEnv+"="+want
		return nil
	}
	br, err := l.sw.nl.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", bridge, l.sw.name, err)
	}
	attrs := netlink.QdiscAttrs{LinkIndex: br.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
	q := netlink.NewNetem(attrs, netlink.NetemQdiscAttrs{Latency: 1})
	if err := l.sw.nl.QdiscReplace(q); err != nil {
		if want == shaperNetem {
			return fmt.Errorf("%s=%s, but this kernel has no netem (CONFIG_NET_SCH_NETEM): %w", ShaperEnv, want, err)
		}
		l.shaper, l.why = shaperRelay, fmt.Sprintf("this kernel has no netem (CONFIG_NET_SCH_NETEM): %v", err)
		return nil
	}
	if err := l.sw.nl.QdiscDel(q); err != nil {
		return fmt.Errorf("remove the trial netem of %s in %s: %w", bridge, l.sw.name, err)
	}
	l.shaper, l.why = shaperNetem, "the kernel has netem"
	return nil
}

// Shaper says how the lab shapes links, "netem" or "relay", and why.
func (l *Lab) Shaper() (shaper, why string) { return l.shaper, l.why }

// Shape sets host's link to n, in both directions; Netem{} takes the
// shaping off. While the host is cut, the new shape is kept and applies
// from Heal on.
func (l *Lab) Shape(host string, n Netem) {
	l.tb.Helper()
	if err := n.check(); err != nil {
		l.tb.Fatalf("netlab: shape host %s: %v", host, err)
	}
	h := l.host(host)
	l.mu.Lock()
	defer l.mu.Unlock()
	h.shape = n
	if err := l.sync(h); err != nil {
		l.tb.Fatalf("netlab: shape host %s to %v: %v", host, n, err)
	}
}

// Cut partitions host from the others: its port leaves the switch's
// bridge, so every frame either way is dropped, silently, as a failed
// switch or cable somewhere in a network would drop them. The host keeps
// its carrier, address and route (unlike with its link down), so
// connections hang and time out instead of failing at once.
func (l *Lab) Cut(host string) {
	l.tb.Helper()
	h := l.host(host)
	l.mu.Lock()
	defer l.mu.Unlock()
	h.cut = true
	if err := l.sync(h); err != nil {
		l.tb.Fatalf("netlab: cut host %s: %v", host, err)
	}
}

// Heal ends Cut: the host's link carries frames again, shaped as Shape
// last set it.
func (l *Lab) Heal(host string) {
	l.tb.Helper()
	h := l.host(host)
	l.mu.Lock()
	defer l.mu.Unlock()
	h.cut = false
	if err := l.sync(h); err != nil {
		l.tb.Fatalf("netlab: heal host %s: %v", host, err)
	}
}

// sync makes h's datapath what its shape and cut say:
//
//	cut:                  port off the bridge, no relay
//	unshaped, or netem:   port on the bridge (with netem on both ends)
//	rate only, relay:     port on the bridge, tbf on both ends
//	shaped, relay:        port off the bridge, relay between it and the
//	                      bridge's veth sb-<host>
//
// The port is never on the bridge while a relay forwards, which would
// duplicate frames. The caller holds l.mu.
func (l *Lab) sync(h *host) error {
	if l.closed {
		return errors.New("the lab is closed")
	}
	tbf := l.shaper == shaperRelay && h.shape.rateOnly()
	relayed := !h.cut && h.shape != (Netem{}) && l.shaper == shaperRelay && !tbf
	port, err := l.sw.nl.LinkByName(h.port)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", h.port, l.sw.name, err)
	}
	var root func(netlink.QdiscAttrs) netlink.Qdisc // nil: none
	switch {
	case l.shaper == shaperNetem && h.shape != (Netem{}):
		root = h.shape.netem
	case tbf:
		root = h.shape.tbf
	}
	if err := l.setRoot(h, root); err != nil {
		return fmt.Errorf("shape %v: %w", h.shape, err)
	}
	onBridge := port.Attrs().MasterIndex != 0
	if relayed {
		if h.relay != nil && h.relay.limit == h.shape.Limit {
			h.relay.set(h.shape)
			return nil
		}
		if h.relay != nil { // its queues have the old size
			h.relay.close()
			h.relay = nil
		}
		peer, err := l.relayPair(h)
		if err != nil {
			return err
		}
		r, err := l.startRelay(port.Attrs().Index, peer, h.shape)
		if err != nil {
			return fmt.Errorf("relay for %s: %w", h.name, err)
		}
		if onBridge {
			if err := l.sw.nl.LinkSetNoMaster(port); err != nil {
				r.close()
				return fmt.Errorf("take %s off %s: %w", h.port, bridge, err)
			}
		}
		r.activate()
		h.relay = r
		return nil
	}
	r := h.relay
	h.relay = nil
	if r != nil && h.cut {
		r.close() // what it holds is lost in the cut
	}
	if r != nil && !h.cut {
		// Stop taking frames; those it holds still go, while new
		// ones take the bridge.
		r.state.Store(relayDraining)
	}
	switch {
	case h.cut && onBridge:
		if err := l.sw.nl.LinkSetNoMaster(port); err != nil {
			return fmt.Errorf("take %s off %s: %w", h.port, bridge, err)
		}
	case !h.cut && !onBridge:
		if err := l.sw.nl.LinkSetMasterByIndex(port, l.brIndex); err != nil {
			if r != nil {
				r.close()
			}
			return fmt.Errorf("put %s on %s: %w", h.port, bridge, err)
		}
	}
	if r == nil {
		return nil
	}
	if !h.cut {
		r.drain(h.shape.Delay + h.shape.Jitter + time.Second)
		r.close()
	}
	return l.forget(h.relayPort())
}

// forget deletes what the bridge learnt on its port name (the host's
// address, while a relay ran), so frames for the host take its own port
// at once instead of waiting for it to send and be learnt there.
func (l *Lab) forget(name string) error {
	link, err := l.sw.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", name, l.sw.name, err)
	}
	fdb, err := l.sw.nl.NeighList(link.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("bridge addresses of %s in %s: %w", name, l.sw.name, err)
	}
	for _, e := range fdb {
		if e.State&netlink.NUD_PERMANENT != 0 || e.State&netlink.NUD_NOARP != 0 {
			continue // the port's own address, or one set by hand
		}
		e.Flags |= netlink.NTF_MASTER
		if err := l.sw.nl.NeighDel(&e); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("forget %s on %s in %s: %w", e.HardwareAddr, name, l.sw.name, err)
		}
	}
	return nil
}

// relayPort and relayEnd name the ends of the veth pair between the
// bridge and h's relay.
func (h *host) relayPort() string { return "sb-" + h.name }
func (h *host) relayEnd() string  { return "rl-" + h.name }

// relayPair returns the index of the relay's end of h's relay pair, made
// by wire.
func (l *Lab) relayPair(h *host) (int, error) {
	link, err := l.sw.nl.LinkByName(h.relayEnd())
	if err != nil {
		return 0, fmt.Errorf("find %s in %s: %w", h.relayEnd(), l.sw.name, err)
	}
	return link.Attrs().Index, nil
}

// setUp sets the switch's link name up or down.
func (l *Lab) setUp(name string, up bool) error {
	link, err := l.sw.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", name, l.sw.name, err)
	}
	set, what := l.sw.nl.LinkSetDown, "down"
	if up {
		set, what = l.sw.nl.LinkSetUp, "up"
	}
	if err := set(link); err != nil {
		return fmt.Errorf("set %s %s in %s: %w", name, what, l.sw.name, err)
	}
	return nil
}

// setRoot makes root's qdisc (nil: none) the root qdisc of both ends of
// h's veth pair.
func (l *Lab) setRoot(h *host, root func(netlink.QdiscAttrs) netlink.Qdisc) error {
	for _, end := range []struct {
		ns   *ns
		link string
	}{{&h.ns, hostLink}, {&l.sw, h.port}} {
		link, err := end.ns.nl.LinkByName(end.link)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", end.link, end.ns.name, err)
		}
		attrs := netlink.QdiscAttrs{
			LinkIndex: link.Attrs().Index,
			Handle:    netlink.MakeHandle(1, 0),
			Parent:    netlink.HANDLE_ROOT,
		}
		if root != nil {
			if err := end.ns.nl.QdiscReplace(root(attrs)); err != nil {
				return fmt.Errorf("root qdisc of %s in %s: %w", end.link, end.ns.name, err)
			}
			continue
		}
		// A veth starts with no qdisc (noqueue). The kernel deletes
		// only a qdisc of the kind named, so find what is there.
		qs, err := end.ns.nl.QdiscList(link)
		if err != nil {
			return fmt.Errorf("qdiscs of %s in %s: %w", end.link, end.ns.name, err)
		}
		for _, q := range qs {
			if q.Attrs().Parent != netlink.HANDLE_ROOT || q.Attrs().Handle != attrs.Handle {
				continue
			}
			if err := end.ns.nl.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove the %s qdisc of %s in %s: %w", q.Type(), end.link, end.ns.name, err)
			}
		}
	}
	return nil
}

// netem is n as a netem qdisc.
func (n Netem) netem(attrs netlink.QdiscAttrs) netlink.Qdisc {
	return netlink.NewNetem(attrs, netlink.NetemQdiscAttrs{
		Latency: uint32(n.Delay / time.Microsecond),
		Jitter:  uint32(n.Jitter / time.Microsecond),
		Loss:    float32(n.Loss),
		Rate64:  n.Rate / 8, // netem counts bytes per second
		Limit:   n.Limit,
	})
}

// Frames of a link, for tbf's sizes.
const (
	fullFrame = 1514    // an Ethernet frame of a 1500-byte MTU
	gsoFrame  = 1 << 16 // a GSO super-packet, which tbf would otherwise cut up
)

// tbf is n's Rate as a token bucket filter: a bucket of 1 ms of the rate,
// at least a GSO packet, and a queue of Limit full frames, or 10 ms of the
// rate.
func (n Netem) tbf(attrs netlink.QdiscAttrs) netlink.Qdisc {
	rate := n.Rate / 8 // bytes per second
	burst := max(rate/1000, gsoFrame)
	limit := max(rate/100, 4*gsoFrame)
	if n.Limit > 0 {
		limit = max(uint64(n.Limit)*fullFrame, burst)
	}
	return &netlink.Tbf{
		QdiscAttrs: attrs,
		Rate:       rate,
		// The bucket in the kernel's scheduler ticks of 64 ns: the time
		// burst takes at the rate.
		Buffer: uint32(min(burst*uint64(time.Second/64)/rate, 1<<32-1)),
		Limit:  uint32(min(limit, 1<<32-1)),
	}
}
