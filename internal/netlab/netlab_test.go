package netlab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// echo serves a line echo on port in host and returns its address.
func echo(t *testing.T, l *Lab, host string, port int) string {
	t.Helper()
	addr := l.Addr(host, port)
	ln, err := l.Listen(host, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return addr
}

// pingPong returns the fastest of n one-byte round trips on c.
func pingPong(t *testing.T, c net.Conn, n int) time.Duration {
	t.Helper()
	best := time.Hour
	b := []byte{1}
	for range n {
		start := time.Now()
		c.SetDeadline(start.Add(5 * time.Second))
		if _, err := c.Write(b); err != nil {
			t.Fatalf("ping: %v", err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("pong: %v", err)
		}
		best = min(best, time.Since(start))
	}
	return best
}

func dial(t *testing.T, l *Lab, from, addr string) net.Conn {
	t.Helper()
	c, err := l.Dial(context.Background(), from, "tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestNetemCheck(t *testing.T) {
	for _, tc := range []struct {
		n    Netem
		want string // in the error; "" for none
	}{
		{Netem{}, ""},
		{Netem{Delay: 10 * time.Microsecond}, ""},
		{Netem{Delay: 2 * time.Millisecond, Jitter: time.Millisecond, Loss: 0.5, Rate: 25 * Gbit}, ""},
		{Netem{Loss: 100}, ""},
		{Netem{Delay: -time.Millisecond}, "delay -1ms"},
		{Netem{Delay: time.Minute}, "delay 1m0s"},
		{Netem{Delay: 500 * time.Nanosecond}, "delay 500ns"},
		{Netem{Jitter: time.Millisecond}, "jitter 1ms without a delay"},
		{Netem{Loss: 101}, "loss 101%"},
		{Netem{Loss: -1}, "loss -1%"},
		{Netem{Rate: 4}, "rate 4 bit/s"},
	} {
		err := tc.n.check()
		if tc.want == "" && err != nil {
			t.Errorf("%v: %v", tc.n, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v: error %v, want one that says %q", tc.n, err, tc.want)
		}
	}
}

func TestCheckHosts(t *testing.T) {
	for _, hosts := range [][]string{nil, {"a", "a"}, {"A"}, {"-a"}, {"thirteen_char"}, {"a.b"}, {"a/b"}} {
		if err := checkHosts(hosts); err == nil {
			t.Errorf("hosts %q accepted", hosts)
		}
	}
	if err := checkHosts([]string{"node", "m1", "m-2", "host_twelve1"}); err != nil {
		t.Error(err)
	}
}

// TestHosts checks what a host sees: its own address and route, no
// default route, the others through the switch.
func TestHosts(t *testing.T) {
	l := New(t, "a", "b", "c")
	if got := strings.Join(l.Hosts(), ","); got != "a,b,c" {
		t.Errorf("Hosts() = %s", got)
	}
	for i, h := range l.Hosts() {
		if want := fmt.Sprintf("10.77.0.%d", i+1); l.IP(h) != want {
			t.Errorf("IP(%s) = %s, want %s", h, l.IP(h), want)
		}
	}
	// The host's routing table, read through a command run in it: the
	// /24 on eth0 and nothing else (10.77.0.0 is 00004D0A as the kernel
	// prints it, little-endian).
	out, err := l.Command("b", "cat", "/proc/self/net/route").CombinedOutput()
	if err != nil {
		t.Fatalf("cat /proc/self/net/route in b: %v\n%s", err, out)
	}
	var routes []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 2 && f[0] != "Iface" {
			routes = append(routes, f[0]+" "+f[1])
		}
	}
	if got := strings.Join(routes, "; "); got != "eth0 00004D0A" {
		t.Errorf("routes in b: %s, want only eth0 00004D0A (10.77.0.0/24)\n%s", got, out)
	}
	// Every host reaches every other.
	for _, to := range l.Hosts() {
		addr := echo(t, l, to, 7000)
		for _, from := range l.Hosts() {
			pingPong(t, dial(t, l, from, addr), 1)
		}
	}
	// The root namespace has no lab address.
	if c, err := (&net.Dialer{Timeout: time.Second}).Dial("tcp", "127.0.0.1:1"); err == nil {
		c.Close()
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), "10.77.") {
			t.Errorf("the root namespace has lab address %s", a)
		}
	}
}

// TestShape checks that a shaped link delays both ways, that netem
// holds what was asked, and that Netem{} takes it off.
func TestShape(t *testing.T) {
	l := New(t, "a", "b")
	shaper, why := l.Shaper()
	t.Logf("shaper: %s (%s)", shaper, why)
	addr := echo(t, l, "b", 7000)
	c := dial(t, l, "a", addr)
	base := pingPong(t, c, 20)
	const delay = 3 * time.Millisecond
	l.Shape("b", Netem{Delay: delay, Rate: 25 * Gbit})
	shaped := pingPong(t, c, 10)
	t.Logf("round trip a-b: %v unshaped, %v with %v each way on b's link", base, shaped, delay)
	if shaped < 2*delay {
		t.Errorf("round trip with %v each way = %v, want at least %v", delay, shaped, 2*delay)
	}
	checkDatapath(t, l, "b")
	l.Shape("b", Netem{})
	if rt := pingPong(t, c, 20); rt >= 2*delay {
		t.Errorf("round trip after unshaping = %v, want under %v", rt, 2*delay)
	}
	checkDatapath(t, l, "b")
}

// checkDatapath checks that host's port and relay are as its shape and
// cut say, and that its root qdiscs are.
func checkDatapath(t *testing.T, l *Lab, host string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.host(host)
	port, err := l.sw.nl.LinkByName(h.port)
	if err != nil {
		t.Fatal(err)
	}
	shaped := h.shape != Netem{}
	tbf := l.shaper == shaperRelay && h.shape.rateOnly()
	relayed := l.shaper == shaperRelay && shaped && !h.cut && !tbf
	if on := port.Attrs().MasterIndex == l.brIndex; on != (!h.cut && !relayed) {
		t.Errorf("%s on the bridge: %v; cut %v, shape %v, shaper %s", h.port, on, h.cut, h.shape, l.shaper)
	}
	if (h.relay != nil) != relayed {
		t.Errorf("%s relayed: %v, want %v", host, h.relay != nil, relayed)
	}
	want := ""
	switch {
	case l.shaper == shaperNetem && shaped:
		want = "netem"
	case tbf:
		want = "tbf"
	}
	for _, end := range []struct {
		ns   *ns
		link string
	}{{&h.ns, hostLink}, {&l.sw, h.port}} {
		link, err := end.ns.nl.LinkByName(end.link)
		if err != nil {
			t.Fatal(err)
		}
		qs, err := end.ns.nl.QdiscList(link)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, q := range qs {
			if q.Attrs().Parent != netlink.HANDLE_ROOT || q.Type() == "noqueue" {
				continue
			}
			got = q.Type()
			switch q := q.(type) {
			case *netlink.Netem:
				if q.Rate64 != h.shape.Rate/8 {
					t.Errorf("%s: netem rate %d bytes/s, want %d", end.link, q.Rate64, h.shape.Rate/8)
				}
			case *netlink.Tbf:
				if q.Rate != h.shape.Rate/8 {
					t.Errorf("%s: tbf rate %d bytes/s, want %d", end.link, q.Rate, h.shape.Rate/8)
				}
			}
		}
		if got != want {
			t.Errorf("%s: root qdisc %q, want %q: %v", end.link, got, want, qs)
		}
	}
}

// TestRate checks that a rate limit holds, 1 MiB at 40 Mbit/s taking
// about 0.2 s, with the rate alone (tbf where netem is missing) and with
// a delay too (the relay there), and that the lab moves between the two.
func TestRate(t *testing.T) {
	l := New(t, "a", "b")
	addr := l.Addr("b", 7000)
	ln, err := l.Listen("b", "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size, rate = 1 << 20, 40 * Mbit
	for _, n := range []Netem{{Rate: rate}, {Rate: rate, Delay: 100 * time.Microsecond}, {Rate: rate}} {
		got := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- err
				return
			}
			defer c.Close()
			_, err = io.Copy(io.Discard, c)
			got <- err
		}()
		l.Shape("a", n)
		checkDatapath(t, l, "a")
		c := dial(t, l, "a", addr)
		start := time.Now()
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		c.Close()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(start)
		want := time.Duration(float64(size*8) / float64(rate) * float64(time.Second))
		t.Logf("%v: 1 MiB in %v (%v at the rate)", n, elapsed, want)
		if elapsed < want*8/10 {
			t.Errorf("%v: 1 MiB in %v, faster than %d Mbit/s allows (%v)", n, elapsed, rate/Mbit, want)
		}
	}
	l.Shape("a", Netem{})
	checkDatapath(t, l, "a")
}

// TestCutHeal checks that a cut host is silent both ways, with no error
// at once, and that Heal brings back the connections it had.
func TestCutHeal(t *testing.T) {
	l := New(t, "a", "b")
	addr := echo(t, l, "b", 7000)
	c := dial(t, l, "a", addr)
	pingPong(t, c, 1)
	l.Shape("b", Netem{Delay: time.Millisecond})
	l.Cut("b")
	checkDatapath(t, l, "b")
	_, err := l.Dial(context.Background(), "a", "tcp", addr, 300*time.Millisecond)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("dial %s during the cut: %v, want a timeout", addr, err)
	}
	if _, err := l.Dial(context.Background(), "b", "tcp", l.Addr("a", 7001), 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("dial from the cut host: %v, want a timeout", err)
	}
	c.SetDeadline(time.Now().Add(300 * time.Millisecond))
	c.Write([]byte{1})
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("read on a connection across the cut: %v, want a timeout", err)
	}
	l.Heal("b")
	checkDatapath(t, l, "b")
	// The byte written during the cut is retransmitted and echoed.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatalf("the connection after Heal: %v", err)
	}
	if rt := pingPong(t, c, 5); rt < 2*time.Millisecond {
		t.Errorf("round trip after Heal = %v; the shape (1ms each way) should be back", rt)
	}
	pingPong(t, dial(t, l, "a", addr), 1)
}

// TestCommandAndStart checks that programs run in their host, that Start
// logs, and that cleanup kills what is left and removes the namespaces.
func TestCommandAndStart(t *testing.T) {
	if prerequisites() != "" {
		New(t, "a") // skips, saying why
	}
	var (
		names  []string
		left   *os.Process
		daemon *Proc
		wait   func() error
	)
	t.Run("lab", func(t *testing.T) {
		l := New(t, "a", "b")
		for _, h := range l.Hosts() {
			names = append(names, l.Namespace(h))
		}
		names = append(names, l.sw.name)
		// A daemon listens in b; a command in a reaches it.
		daemon = l.Start("b", "sh", "-c", "echo started; exec sleep 600")
		if err := daemon.WaitUp(5*time.Second, func() bool { return strings.Contains(daemon.Tail(1), "started") }); err != nil {
			t.Fatal(err)
		}
		addr := echo(t, l, "b", 7000)
		out, err := l.Command("a", "sh", "-c", "cat /proc/self/net/dev").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "eth0") {
			t.Fatalf("sh in a: %v\n%s", err, out)
		}
		pingPong(t, dial(t, l, "a", addr), 1)
		// The program's pid is the program's, not nsenter's.
		cmd := l.Command("a", "sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		left, wait = cmd.Process, cmd.Wait
		waitFor(t, "sleep to be exec'd", func() bool {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", left.Pid))
			return strings.TrimSpace(string(b)) == "sleep"
		})
		if err := l.Command("a", "no-such-program-here").Start(); err == nil {
			t.Error("a missing program started")
		}
	})
	// The subtest's cleanup has run.
	if !daemon.Exited() {
		t.Error("the daemon still runs after cleanup")
	}
	err := wait()
	var ee interface{ Sys() any }
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("a command left running ended with %v, want killed by SIGKILL", err)
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s is still there after cleanup (%v)", n, err)
		}
	}
}

// TestSweepStale checks that New removes what a killed run left, and
// leaves the namespaces of a live one.
func TestSweepStale(t *testing.T) {
	if prerequisites() != "" {
		New(t, "a") // skips, saying why
	}
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	// A run killed and not yet reaped: a zombie.
	z := exec.Command("true")
	if err := z.Start(); err != nil {
		t.Fatal(err)
	}
	defer z.Wait()
	var zstart uint64
	waitFor(t, "true to exit", func() bool {
		var state string
		state, zstart, err = procStat(z.Process.Pid)
		return err == nil && state == "Z"
	})
	dead := fmt.Sprintf("%s-%d-%d-1-x", Prefix, 1<<30, start) // above any pid_max
	reused := fmt.Sprintf("%s-%d-%d-1-x", Prefix, pid, start+1)
	zombie := fmt.Sprintf("%s-%d-%d-1-x", Prefix, z.Process.Pid, zstart)
	live := fmt.Sprintf("%s-%d-%d-999999-x", Prefix, pid, start)
	for _, name := range []string{dead, reused, zombie, live} {
		n, err := newNS(name)
		if err != nil {
			t.Fatal(err)
		}
		n.nl.Close()
		n.handle.Close()
	}
	t.Cleanup(func() { deleteNamed(live) })
	New(t, "a")
	for _, name := range []string{dead, reused, zombie} {
		if _, err := os.Stat(filepath.Join("/run/netns", name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale namespace %s was not removed (%v)", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join("/run/netns", live)); err != nil {
		t.Errorf("namespace %s of a live run: %v", live, err)
	}
}

// TestDoKeepsRootNamespace checks that Do leaves this process's threads
// where they were.
func TestDoKeepsRootNamespace(t *testing.T) {
	l := New(t, "a")
	root, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for range 50 {
		if err := l.Do("a", func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	// Goroutines land on threads Do used; none may be in the host.
	done := make(chan error, 8)
	for range 8 {
		go func() {
			cur, err := netns.Get()
			if err == nil {
				if !cur.Equal(root) {
					err = fmt.Errorf("a goroutine runs in %v, not the root namespace %v", cur, root)
				}
				cur.Close()
			}
			done <- err
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLossAndJitter checks that Loss drops about that share of datagrams
// one way, and that Jitter keeps round trips within Delay±Jitter each way.
func TestLossAndJitter(t *testing.T) {
	l := New(t, "a", "b")
	const loss, sent = 30.0, 2000
	addr := l.Addr("b", 7000)
	var pc net.PacketConn
	if err := l.Do("b", func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	// Room for every datagram sent, so that only the shaping drops any,
	// however late the reader runs.
	if err := pc.(*net.UDPConn).SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	c, err := l.Dial(context.Background(), "a", "udp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One datagram before the loss, so that a's neighbour entry for b
	// is there: a lost ARP exchange would hold every datagram for a
	// second.
	c.Write([]byte{0})
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := pc.ReadFrom(make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	l.Shape("b", Netem{Loss: loss})
	got := make(chan int)
	go func() {
		n, b := 0, make([]byte, 16)
		for {
			pc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, _, err := pc.ReadFrom(b); err != nil {
				got <- n
				return
			}
			n++
		}
	}()
	for i := range sent {
		c.Write([]byte{byte(i)})
		if i%10 == 9 {
			time.Sleep(time.Millisecond) // stay well inside the relay's queue
		}
	}
	n := <-got
	lost := 100 * float64(sent-n) / sent
	t.Logf("%d of %d datagrams arrived: %.1f%% lost at %g%% loss", n, sent, lost, loss)
	if lost < loss-8 || lost > loss+8 {
		t.Errorf("%.1f%% of datagrams lost, want about %g%%", lost, loss)
	}

	const delay, jitter = 2 * time.Millisecond, time.Millisecond
	l.Shape("b", Netem{Delay: delay, Jitter: jitter})
	tc := dial(t, l, "a", echo(t, l, "b", 7001))
	rts := make([]time.Duration, 31)
	for i := range rts {
		rts[i] = pingPong(t, tc, 1)
	}
	slices.Sort(rts)
	lo, median, hi := rts[0], rts[len(rts)/2], rts[len(rts)-1]
	t.Logf("round trips with %v±%v each way: %v to %v, median %v", delay, jitter, lo, hi, median)
	// No round trip beats the shortest delay; a pause of the relay or of
	// this process may stretch a few, not the middle one.
	if lo < 2*(delay-jitter) || median > 2*(delay+jitter)+5*time.Millisecond {
		t.Errorf("round trips %v to %v, median %v: want none under %v and the median under %v (and some slack)",
			lo, hi, median, 2*(delay-jitter), 2*(delay+jitter))
	}
}

// TestNoThreadExits checks that the lab ends no OS thread of this process
// (relays stopping, Do): a daemon's parent-death signal fires when the
// thread that forked it exits, so it would kill daemons.
func TestNoThreadExits(t *testing.T) {
	l := New(t, "a", "b")
	daemon := l.Start("a", "sleep", "600")
	tids := func() map[string]bool {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, e := range ents {
			m[e.Name()] = true
		}
		return m
	}
	before := tids()
	for range 10 {
		l.Shape("b", Netem{Delay: 100 * time.Microsecond})
		l.Cut("b")
		l.Heal("b")
		l.Shape("b", Netem{})
		if err := l.Do("a", func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	after := tids()
	for tid := range before {
		if !after[tid] {
			t.Errorf("thread %s of this process exited", tid)
		}
	}
	if daemon.Exited() {
		t.Errorf("the daemon exited: %v", daemon.Err())
	}
}
