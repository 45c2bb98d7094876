// Package netlab builds a small network of "hosts" on one Linux machine for
// root tests: one network namespace per host, each joined by a veth pair to
// a bridge in a namespace of its own (the switch), with one address per host
// in a private /24. Links can be shaped (delay, jitter, loss, rate), cut and
// healed, and programs run inside a host's namespace.
//
// It owns the namespaces it names under /run/netns, and everything in them:
// links, addresses, qdiscs, relays and the processes that run there.
//
// Shaping uses netem, through netlink, on both ends of a host's veth pair
// where the kernel has it. Kernels built without it (CONFIG_NET_SCH_NETEM
// unset, as on the project's machines) get a relay instead: a link
// emulator in this process that forwards the host's frames to the bridge
// through packet sockets (see relay), except for a shape of rate alone,
// which the kernel's tbf keeps at the veth's speed. Unshaped hosts are
// always on the bridge directly, at the veth's full speed. Shaper says
// which is in use.
//
// Invariants:
//   - The root network namespace is never changed: no link, address, route
//     or qdisc is added to it. Veth pairs are created in the switch with
//     their other end placed straight into the host.
//   - A host has lo and eth0 with its /24 and no other route, so nothing it
//     sends can leave the machine. The test process itself must not send to
//     a lab address from the root namespace (its default route leads off the
//     machine); Dial, Listen and Do reach the lab from inside a host.
//   - A host's port in the switch is on the bridge, or else a relay or
//     nothing (a cut) carries its frames; never both, which would loop them.
//   - The test's goroutines keep the root namespace: namespace switches
//     happen on a locked OS thread that is switched back before it is
//     unlocked, or, if switching back fails, stays locked to a goroutine
//     that blocks for good.
//   - No OS thread of the test process exits because of the lab (no
//     goroutine returns while locked to its thread): a child's
//     parent-death signal fires when the thread that forked it exits, so
//     an exiting thread would kill daemons that the test, the lab or
//     another harness started with one.
//   - Every namespace is named <Prefix>-<pid>-<start>-<seq>-<host> (the
//     switch: ….switch), where pid and start (its start time in clock ticks
//     since boot, from /proc/<pid>/stat) identify the process that made it.
//     New removes namespaces whose owner is gone (a run killed before its
//     cleanup) and kills what runs in them; namespaces of live runs are left
//     alone.
//   - Cleanup (registered with tb.Cleanup, and Close) stops the processes
//     started with Start (SIGTERM, then SIGKILL), stops the relays,
//     SIGKILLs every other process in the lab's namespaces, removes the
//     namespace names and closes the handles, so the kernel frees the
//     namespaces and their links. It runs when the test fails too. Should
//     the test process be killed instead, its programs die with it
//     (parent-death signal), the relays with it, and the next New removes
//     the namespaces.
//
// Lab methods that fail the test (New, Shape, Cut, Heal, Start) call
// tb.Fatal and so belong on the test's goroutine. A Lab's methods may be
// called from several goroutines.
package netlab

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/internal/testenv"
)

// Prefix starts the name of every namespace a lab makes.
const Prefix = "vgpulab"

// RequireEnv, when "1", turns a missing prerequisite (not root, no
// nsenter, no permission to make namespaces) into a failure instead of a
// skip. It is the variable of the root end-to-end tests, so CI, which sets
// it, runs the lab's tests too.
const RequireEnv = testenv.RequireEnv

// Subnet is the /24 the hosts' addresses come from, in the order New was
// given them: 10.77.0.1, 10.77.0.2, …. Every lab has its own switch, so
// labs that exist at once do not see each other.
const Subnet = "10.77.0.0/24"

// Names of the links: eth0 in each host, br0 and one port per host
// (sw-<host>) in the switch.
const (
	hostLink = "eth0"
	bridge   = "br0"
)

// hostName is what New accepts as a host name: short enough that
// "sw-"+name (and the relay's "sb-" and "rl-") fits an interface name (15
// bytes), and a plain file name.
var hostName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,11}$`)

// seq tells apart the labs of one process.
var seq atomic.Uint64

// Lab is a network of hosts. Its zero value is not usable; see New.
type Lab struct {
	tb   testing.TB
	base string // <Prefix>-<pid>-<start>-<seq>
	dir  string // logs of the processes started with Start

	sw      ns      // the switch
	brIndex int     // the bridge's index in the switch
	hosts   []*host // in the order New was given them
	shaper  string  // shaperNetem or shaperRelay
	why     string  // why that one

	// mu guards the fields below and the hosts' shape, cut and relay,
	// and serialises changes of links. Lock order: mu, then nsMu.
	mu     sync.Mutex
	procs  []*Proc
	nprocs map[string]int // log names used, by host and program
	closed bool

	// nsMu keeps the namespace handles open while a thread enters one
	// (write-locked by Close to close them): a closed descriptor's number
	// may be reused by then for anything.
	nsMu sync.RWMutex
	gone bool // the handles are closed
}

// ns is a named network namespace and an open handle to it.
type ns struct {
	name   string          // under /run/netns
	handle netns.NsHandle  // keeps it open for netlink and Do
	nl     *netlink.Handle // netlink socket inside it
	ino    uint64          // inode of the namespace, to find its processes
	dev    uint64
}

// host is one host of a lab.
type host struct {
	name   string
	nsName string // ns.name, which close clears; this stays
	ns     ns
	ip     net.IP
	port   string // its link's name in the switch
	shape  Netem  // what Shape last set
	cut    bool
	relay  *relay // shaping it, when the lab's shaper is the relay and it is shaped and not cut
}

// New makes a lab with the named hosts (1 to 12 of a-z, 0-9, '_' and '-',
// distinct; at most 253) and registers its cleanup with tb. It skips the
// test when the machine cannot make namespaces (not root, no nsenter), or
// fails it under VGPU_E2E_REQUIRE_ROOT=1.
func New(tb testing.TB, hosts ...string) *Lab {
	tb.Helper()
	if why := prerequisites(); why != "" {
		skip(tb, why)
	}
	if err := checkHosts(hosts); err != nil {
		tb.Fatalf("netlab: %v", err)
	}
	sweepStale(tb)
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		tb.Fatalf("netlab: %v", err)
	}
	l := &Lab{
		tb:     tb,
		base:   fmt.Sprintf("%s-%d-%d-%d", Prefix, pid, start, seq.Add(1)),
		dir:    tb.TempDir(),
		sw:     ns{handle: -1}, // not fd 0, which Close would close
		nprocs: map[string]int{},
	}
	// Registered before anything exists, so that a failure half way
	// through still removes what was made.
	tb.Cleanup(func() {
		if tb.Failed() {
			l.logTails(20)
		}
		if err := l.Close(); err != nil {
			tb.Errorf("netlab cleanup: %v", err)
		}
	})
	if err := l.build(hosts); err != nil {
		if errors.Is(err, unix.EPERM) {
			skip(tb, fmt.Sprintf("netlab: cannot make network namespaces here (%v)", err))
		}
		tb.Fatalf("netlab: %v", err)
	}
	return l
}

// skip skips the test for why, or fails it under RequireEnv=1.
func skip(tb testing.TB, why string) {
	tb.Helper()
	testenv.Missing(tb, why)
}

// prerequisites says what the machine lacks for a lab, or "".
func prerequisites() string {
	if runtime.GOOS != "linux" {
		return "netlab needs Linux network namespaces"
	}
	if os.Geteuid() != 0 {
		return "netlab needs root to make network namespaces (CI runs as root)"
	}
	if _, err := nsenter(); err != nil {
		return fmt.Sprintf("netlab runs commands in a host through nsenter: %v (Debian: util-linux)", err)
	}
	return ""
}

func checkHosts(hosts []string) error {
	if len(hosts) == 0 || len(hosts) > 253 {
		return fmt.Errorf("%d hosts asked, want 1 to 253 (one /24)", len(hosts))
	}
	seen := map[string]bool{}
	for _, h := range hosts {
		if !hostName.MatchString(h) {
			return fmt.Errorf("host name %q: want 1 to 12 of a-z, 0-9, '_' and '-', starting with a letter or digit", h)
		}
		if seen[h] {
			return fmt.Errorf("host %q named twice", h)
		}
		seen[h] = true
	}
	return nil
}

// build makes the switch and the hosts.
func (l *Lab) build(names []string) (err error) {
	if l.sw, err = newNS(l.base + ".switch"); err != nil {
		return err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge}}
	if err := l.sw.nl.LinkAdd(br); err != nil {
		return fmt.Errorf("switch %s: add bridge %s: %w", l.sw.name, bridge, err)
	}
	if err := l.sw.nl.LinkSetUp(br); err != nil {
		return fmt.Errorf("switch %s: set %s up: %w", l.sw.name, bridge, err)
	}
	l.brIndex = br.Attrs().Index
	if err := l.pickShaper(); err != nil {
		return err
	}
	_, subnet, _ := net.ParseCIDR(Subnet)
	for i, name := range names {
		h := &host{name: name, nsName: l.base + "-" + name, port: "sw-" + name}
		h.ip = make(net.IP, 4)
		copy(h.ip, subnet.IP.To4())
		h.ip[3] = byte(i + 1)
		if h.ns, err = newNS(h.nsName); err != nil {
			return err
		}
		l.hosts = append(l.hosts, h)
		if err := l.wire(h, subnet.Mask); err != nil {
			return fmt.Errorf("host %s: %w", name, err)
		}
	}
	return nil
}

// wire joins h to the bridge: a veth pair made in the switch, its other
// end moved straight into h as eth0, so it never exists in the root
// namespace (where its name could clash with another lab's).
func (l *Lab) wire(h *host, mask net.IPMask) error {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: h.port, MasterIndex: l.brIndex},
		PeerName:      hostLink,
		PeerNamespace: netlink.NsFd(int(h.ns.handle)),
	}
	if err := l.sw.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s (switch) - %s (host): %w", h.port, hostLink, err)
	}
	if err := l.setUp(h.port, true); err != nil {
		return err
	}
	for _, name := range []string{"lo", hostLink} {
		link, err := h.ns.nl.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		if name == hostLink {
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: h.ip, Mask: mask}}
			if err := h.ns.nl.AddrAdd(link, addr); err != nil {
				return fmt.Errorf("add address %s to %s: %w", addr.IPNet, name, err)
			}
		}
		if err := h.ns.nl.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
	}
	nss := []*ns{&l.sw, &l.sw, &h.ns}
	links := []string{h.port, bridge, hostLink}
	if l.shaper == shaperRelay {
		// The relay's veth pair is made and set up now, not when
		// Shape first needs it, for the same reason as the wait below.
		pair := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: h.relayPort(), MasterIndex: l.brIndex},
			PeerName:  h.relayEnd(),
		}
		if err := l.sw.nl.LinkAdd(pair); err != nil {
			return fmt.Errorf("add veth %s - %s in the switch: %w", h.relayPort(), h.relayEnd(), err)
		}
		for _, name := range []string{h.relayPort(), h.relayEnd()} {
			if err := l.setUp(name, true); err != nil {
				return err
			}
		}
		nss, links = append(nss, &l.sw), append(links, h.relayPort())
	}
	return waitOperUp(nss, links)
}

// waitOperUp waits, up to 5 seconds, until each link links[i] in nss[i]
// is operationally up: the kernel notes a veth's carrier asynchronously,
// and a bridge does not forward to a port before.
func waitOperUp(nss []*ns, links []string) error {
	deadline := time.Now().Add(5 * time.Second)
	for i, name := range links {
		for {
			link, err := nss[i].nl.LinkByName(name)
			if err != nil {
				return fmt.Errorf("find %s in %s: %w", name, nss[i].name, err)
			}
			if link.Attrs().OperState == netlink.OperUp {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s in %s is %v, not up, after 5s", name, nss[i].name, link.Attrs().OperState)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// newNS makes the named namespace and opens a netlink socket in it. The
// calling goroutine's thread is never left in it.
func newNS(name string) (n ns, err error) {
	n = ns{name: name, handle: -1}
	err = onThread(func(orig netns.NsHandle) error {
		h, err := netns.NewNamed(name) // switches this thread into it
		if err != nil {
			return err
		}
		n.handle = h
		return netns.Set(orig)
	})
	if err != nil {
		if n.handle.IsOpen() {
			n.handle.Close()
		}
		// NewNamed leaves the file behind when the bind mount fails. The
		// name is ours (pid, start time, sequence number), unless it
		// existed already.
		if !errors.Is(err, os.ErrExist) {
			deleteNamed(name)
		}
		return ns{handle: -1}, fmt.Errorf("make network namespace %s: %w", name, err)
	}
	if n.nl, err = netlink.NewHandleAt(n.handle); err != nil {
		n.close()
		return n, fmt.Errorf("netlink socket in %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(n.handle), &st); err != nil {
		n.close()
		return n, fmt.Errorf("stat namespace %s: %w", name, err)
	}
	n.ino, n.dev = st.Ino, st.Dev
	return n, nil
}

// close removes the namespace's name and closes the handles; the kernel
// frees it once nothing else holds it (a process, a socket).
func (n *ns) close() error {
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
	if n.handle.IsOpen() {
		n.handle.Close()
	}
	if n.name == "" {
		return nil
	}
	err := deleteNamed(n.name)
	n.name = ""
	return err
}

// deleteNamed unmounts and removes /run/netns/name; a name already gone is
// not an error.
func deleteNamed(name string) error {
	path := filepath.Join("/run/netns", name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// onThread runs f on a locked OS thread and passes it a handle to the
// thread's namespace at the start. If f returns with the thread in another
// namespace (it failed to switch back), its goroutine blocks for good,
// keeping the thread locked, so that no other goroutine ever runs there.
//
// It must not let the thread exit instead, as a locked goroutine that
// returns would: a child started with a parent-death signal (Start,
// Command, the root harness's daemons) gets it when the thread that forked
// it exits, not the process, and any thread may have forked one.
func onThread(f func(orig netns.NsHandle) error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current network namespace: %w", err)
			return
		}
		err = f(orig)
		back := false
		if cur, gerr := netns.Get(); gerr == nil {
			back = cur.Equal(orig)
			cur.Close()
		}
		orig.Close()
		errc <- err
		if !back {
			select {} // the thread is lost to the lab's namespace; see above
		}
		runtime.UnlockOSThread()
	}()
	return <-errc
}

// Hosts returns the lab's host names, in the order New was given them.
func (l *Lab) Hosts() []string {
	out := make([]string, len(l.hosts))
	for i, h := range l.hosts {
		out[i] = h.name
	}
	return out
}

// IP returns host's address, such as "10.77.0.1".
func (l *Lab) IP(host string) string {
	return l.host(host).ip.String()
}

// Addr returns host's address with port, for listening and dialling.
func (l *Lab) Addr(host string, port int) string {
	return net.JoinHostPort(l.IP(host), strconv.Itoa(port))
}

// Namespace returns the name of host's namespace under /run/netns, for
// `ip netns exec NAME …` while debugging a test.
func (l *Lab) Namespace(host string) string {
	return l.host(host).nsName
}

// Dir returns the directory of the logs of the processes started with
// Start; it is removed with the test's temporary directories.
func (l *Lab) Dir() string { return l.dir }

// host returns the named host; an unknown name is a bug in the test, so it
// panics, naming the hosts there are.
func (l *Lab) host(name string) *host {
	for _, h := range l.hosts {
		if h.name == name {
			return h
		}
	}
	panic(fmt.Sprintf("netlab: no host %q in the lab (hosts: %s)", name, strings.Join(l.Hosts(), ", ")))
}

// Close stops the lab's processes and removes its namespaces. It is
// registered with the test's cleanup; calling it earlier (to check what
// happens when a lab goes away) is fine, and later calls do nothing.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	procs := l.procs
	l.mu.Unlock()
	// Programs stop with the network as it was: a graceful stop may
	// still talk to the other hosts.
	for _, p := range procs {
		p.Stop(5 * time.Second)
	}
	l.mu.Lock()
	for _, h := range l.hosts {
		if h.relay != nil {
			h.relay.close()
			h.relay = nil
		}
	}
	l.mu.Unlock()
	var errs []error
	nss := []*ns{&l.sw}
	for _, h := range l.hosts {
		nss = append(nss, &h.ns)
	}
	// Processes the test started with Command and left running, and
	// whatever they started, would keep a namespace alive.
	killIn(nss)
	l.nsMu.Lock()
	defer l.nsMu.Unlock()
	l.gone = true
	for _, n := range nss {
		if err := n.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killIn SIGKILLs every process, other than this one, whose network
// namespace is one of nss.
func killIn(nss []*ns) {
	type key struct{ dev, ino uint64 }
	want := map[key]bool{}
	for _, n := range nss {
		if n.ino != 0 {
			want[key{n.dev, n.ino}] = true
		}
	}
	if len(want) == 0 {
		return
	}
	self := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		// /proc/<pid>/ns/net is the namespace of the process's main
		// thread, which is where exec puts a program.
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st); err != nil {
			continue
		}
		if want[key{st.Dev, st.Ino}] {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// sweepStale removes the namespaces of labs whose process is gone.
func sweepStale(tb testing.TB) {
	ents, _ := os.ReadDir("/run/netns")
	var stale []*ns
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, Prefix+"-") || ownerAlive(name) {
			continue
		}
		n := &ns{name: name, handle: -1}
		if h, err := netns.GetFromName(name); err == nil {
			var st unix.Stat_t
			if unix.Fstat(int(h), &st) == nil {
				n.ino, n.dev = st.Ino, st.Dev
			}
			n.handle = h
		}
		stale = append(stale, n)
	}
	if len(stale) == 0 {
		return
	}
	killIn(stale)
	for _, n := range stale {
		tb.Logf("netlab: removing namespace %s, left by a run that is gone", n.name)
		if err := n.close(); err != nil {
			tb.Logf("netlab: %v", err)
		}
	}
}

// ownerAlive reports whether the process that made the namespace name is
// still running. A name that does not parse is not ours to remove.
func ownerAlive(name string) bool {
	f := strings.SplitN(name, "-", 4) // Prefix, pid, start, rest
	if len(f) < 4 {
		return true
	}
	pid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return true
	}
	// A pid is reused; its start time tells our run from a newer process.
	// A killed run that nobody has reaped yet is a zombie: gone too.
	state, got, err := procStat(pid)
	return err == nil && got == start && state != "Z" && state != "X"
}

// startTime returns when process pid started, in clock ticks since boot.
func startTime(pid int) (uint64, error) {
	_, start, err := procStat(pid)
	return start, err
}

// procStat returns the state and the start time of process pid (fields 3
// and 22 of /proc/<pid>/stat).
func procStat(pid int) (state string, start uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, fmt.Errorf("process %d: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, fmt.Errorf("process %d: /proc/%d/stat %q has no ')'", pid, pid, s)
	}
	f := strings.Fields(s[i+1:]) // from field 3 on
	if len(f) < 20 {
		return "", 0, fmt.Errorf("process %d: /proc/%d/stat has %d fields after the name, want 20 or more", pid, pid, len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("process %d: start time, field 22 of /proc/%d/stat: %w", pid, pid, err)
	}
	return f[0], start, nil
}

// nsenter finds the program that puts a command into a host.
func nsenter() (string, error) {
	return exec.LookPath("nsenter")
}
