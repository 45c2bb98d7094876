package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/etcdtest"
	"github.com/vgpu/vgpu/isolation"
)

// testTTL is the lease TTL of the tests' sessions: short, so that expiry
// is seen within a test, and above etcd's minimum with etcdtest's timings.
const testTTL = 2 * time.Second

func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func connect(t *testing.T, endpoints []string, prefix string) *Session {
	t.Helper()
	s, err := Connect(Options{Endpoints: endpoints, TTL: testTTL, OpTimeout: time.Second, Prefix: prefix, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// abandon ends s as a crash would: no revoke, no more keepalives.
func abandon(s *Session) {
	s.stopKeepAlive()
	s.cli.Close()
}

func node(addr string, free uint64) NodeInfo {
	return NodeInfo{Addr: addr, Backend: "sim", Devices: []DeviceInfo{{Index: 0, Name: "sim0", Memory: 1 << 30, Free: free}}}
}

// waitFor polls cond until it holds, failing after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func TestParseEndpoints(t *testing.T) {
	got, err := ParseEndpoints("10.0.0.1:2379, https://e:2379,")
	if err != nil || strings.Join(got, " ") != "http://10.0.0.1:2379 https://e:2379" {
		t.Fatalf("got %q, %v", got, err)
	}
	for _, bad := range []string{"", " , ", "unix:///x"} {
		if _, err := ParseEndpoints(bad); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("%q: %v, want invalid argument", bad, err)
		}
	}
}

// An etcd that nobody serves fails Connect as unavailable within the
// operation timeout.
func TestConnectUnreachable(t *testing.T) {
	start := time.Now()
	_, err := Connect(Options{Endpoints: []string{"http://127.0.0.1:1"}, TTL: testTTL, OpTimeout: 500 * time.Millisecond, Log: quietLog()})
	if !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("Connect: %v, want unavailable", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Connect failed after %v, want within about the 500ms op timeout", d)
	}
}

// A node registers under its lease; a watcher sees it appear, change, and
// go when the node dies without a word (its lease expires). A second
// process cannot claim the same address, and a malformed entry is logged
// and skipped.
func TestNodesRegisterWatchExpire(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	watcher := connect(t, etcd.Endpoints(), "")
	logger, hook := test.NewNullLogger()
	watcher.log = logger
	var mu sync.Mutex
	var seen []NodeInfo
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watcher.WatchNodes(ctx, func(ns []NodeInfo) {
		mu.Lock()
		seen = ns
		mu.Unlock()
	})
	get := func() []NodeInfo {
		mu.Lock()
		defer mu.Unlock()
		return seen
	}

	n1 := connect(t, etcd.Endpoints(), "")
	reg, err := n1.RegisterNode(node("10.0.0.1:7070", 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "node registered", func() bool { ns := get(); return len(ns) == 1 && ns[0].Addr == "10.0.0.1:7070" })
	if err := reg.Update(node("10.0.0.1:7070", 1<<20)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "free memory updated", func() bool { ns := get(); return len(ns) == 1 && ns[0].Devices[0].Free == 1<<20 })

	other := connect(t, etcd.Endpoints(), "")
	if _, err := other.RegisterNode(node("10.0.0.1:7070", 1<<30)); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "another live process") {
		t.Fatalf("second node at one address: %v, want invalid argument naming the claim", err)
	}
	if _, err := other.RegisterNode(NodeInfo{Addr: "x:1"}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("node without devices: %v, want invalid argument", err)
	}
	if _, err := other.Client().Put(ctx, DefaultPrefix+"nodes/bad:1", "{not json"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "malformed entry logged", func() bool {
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, "malformed registry entry") {
				return true
			}
		}
		return false
	})
	if ns := get(); len(ns) != 1 {
		t.Fatalf("nodes %+v: the malformed entry is listed", ns)
	}

	// A node restarted at once at n1's address (n1 killed, say) waits for
	// n1's lease to expire, then registers.
	abandon(n1)
	died := time.Now()
	restarted := connect(t, etcd.Endpoints(), "")
	if _, err := restarted.RegisterNode(node("10.0.0.1:7070", 1<<30)); err != nil {
		t.Fatalf("a node restarted at a dead node's address: %v", err)
	}
	t.Logf("a node restarted at once registered %v after its predecessor died (TTL %v)", time.Since(died), testTTL)
	abandon(restarted)
	died = time.Now()
	waitFor(t, testTTL+3*time.Second, "dead node's entry expired", func() bool { return len(get()) == 0 })
	t.Logf("a dead node left the registry %v after its last keepalive could have been sent", time.Since(died))
	// Its address is free again.
	if _, err := other.RegisterNode(node("10.0.0.1:7070", 1<<30)); err != nil {
		t.Fatalf("address of an expired node: %v", err)
	}
}

// A stored quota file reaches the watchers; an invalid one is refused,
// with its mistakes, and changes nothing.
func TestTenantsPutWatch(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	s := connect(t, etcd.Endpoints(), "")
	type seen struct {
		memory  uint64
		present bool
		err     error
	}
	ch := make(chan seen, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.WatchTenants(ctx, func(cfg *isolation.Config, present bool, err error) {
		v := seen{present: present, err: err}
		if cfg != nil && cfg.Tenants["a"] != nil {
			v.memory = cfg.Tenants["a"].Memory
		}
		ch <- v
	})
	if v := <-ch; v.present {
		t.Fatalf("before any file: %+v", v)
	}
	if _, err := s.PutTenants(ctx, []byte("[tenants.a]\nmemory = \"1GiB\"\n")); err != nil {
		t.Fatal(err)
	}
	if v := <-ch; !v.present || v.err != nil || v.memory != 1<<30 {
		t.Fatalf("after put: %+v", v)
	}
	_, err := s.PutTenants(ctx, []byte("[tenants.a]\nmemory = \"12X\"\nbogus = 1\n"))
	if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "12X") || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("invalid file: %v, want invalid argument naming both mistakes", err)
	}
	// A file stored by hand that does not validate reaches the watcher as an error.
	if _, err := s.Client().Put(ctx, DefaultPrefix+"tenants", "memory = ["); err != nil {
		t.Fatal(err)
	}
	if v := <-ch; !v.present || !errors.Is(v.err, api.ErrInvalidArgument) {
		t.Fatalf("hand-stored bad file: %+v", v)
	}
	select {
	case v := <-ch:
		t.Fatalf("the refused file reached the watcher: %+v", v)
	default:
	}
}

// Members keep working while one of three etcd members is dead.
func TestOneOfThreeEtcdMembersKilled(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	s := connect(t, etcd.Endpoints(), "")
	q, err := NewQuotas(s, QuotaOptions{ID: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := s.RegisterNode(node("10.0.0.9:7070", 1<<30)); err != nil {
		t.Fatal(err)
	}
	lease := s.Lease()
	for i := range 3 {
		etcd.Kill(i)
		lim := Limits{Memory: 1 << 30, MaxContainers: 100}
		// A new reservation each round: a round trip to what is left.
		for j := range 3 {
			if err := retryUnavailable(5*time.Second, func() error { return q.Reserve("t", lim, 128<<20, 1) }); err != nil {
				t.Fatalf("member %d dead, reserve %d: %v", i, j, err)
			}
		}
		q.Release("t", 3*128<<20, 3)
		ns, err := s.Nodes(context.Background())
		if err != nil || len(ns) != 1 {
			t.Fatalf("member %d dead: nodes %v, %v", i, ns, err)
		}
		// Renewals may stall while a new leader is elected, so Valid may
		// be false for a moment; the lease itself must survive: the same
		// lease, certain again within a TTL.
		waitFor(t, testTTL, fmt.Sprintf("member %d dead: lease valid again", i), s.Valid)
		if got := s.Lease(); got != lease {
			t.Fatalf("member %d dead: lease %x replaced by %x: it was lost", i, lease, got)
		}
		etcd.Restart(i)
		etcd.WaitHealthy(20 * time.Second)
	}
}

// retryUnavailable retries f while it fails unavailable, for at most d: the
// client may first try the member just killed.
func retryUnavailable(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// An etcd that serves TLS and requires client certificates: a session with
// TLSFiles works; one without TLS, or without the client certificate, is
// unavailable; half the flags are bad input.
func TestTLS(t *testing.T) {
	etcd := etcdtest.StartTLS(t, 1)
	cert, key, ca := etcd.TLSFiles()
	cfg, err := TLSFiles(cert, key, ca)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Connect(Options{Endpoints: etcd.Endpoints(), TTL: testTTL, OpTimeout: time.Second, TLS: cfg, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.RegisterNode(node("10.0.0.1:7070", 1<<30)); err != nil {
		t.Fatal(err)
	}
	if ns, err := s.Nodes(context.Background()); err != nil || len(ns) != 1 {
		t.Fatalf("nodes over TLS: %v, %v", ns, err)
	}
	noCert, err := TLSFiles("", "", ca)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*tls.Config{"no TLS": nil, "no client certificate": noCert} {
		if _, err := Connect(Options{Endpoints: etcd.Endpoints(), TTL: testTTL, OpTimeout: time.Second, TLS: c, Log: quietLog()}); !errors.Is(err, api.ErrUnavailable) {
			t.Errorf("%s: %v, want unavailable", name, err)
		}
	}
	for _, bad := range [][3]string{{cert, "", ca}, {cert, key, ""}, {"", "", "/nonexistent"}, {cert, key, cert + ".nope"}} {
		if _, err := TLSFiles(bad[0], bad[1], bad[2]); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("TLSFiles%q: %v, want invalid argument", bad, err)
		}
	}
}

// KeepNode writes a node's changed entry at each interval until stopped,
// and not after: the watcher sees the first change, and a change made
// after stop stays unseen past several intervals.
func TestKeepNodeRefreshesUntilStopped(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	s := connect(t, etcd.Endpoints(), "")
	var mu sync.Mutex
	free := uint64(1 << 30)
	info := func() NodeInfo {
		mu.Lock()
		defer mu.Unlock()
		return node("10.0.0.3:7070", free)
	}
	setFree := func(n uint64) {
		mu.Lock()
		free = n
		mu.Unlock()
	}
	registered := func() uint64 {
		ns, err := s.Nodes(context.Background())
		if err != nil || len(ns) != 1 {
			t.Fatalf("Nodes: %v, %v: want the one node", ns, err)
		}
		return ns[0].Devices[0].Free
	}
	const interval = 50 * time.Millisecond
	stop, err := s.KeepNode(info, interval)
	if err != nil {
		t.Fatal(err)
	}
	if got := registered(); got != 1<<30 {
		t.Fatalf("registered free %d, want %d", got, 1<<30)
	}
	setFree(1 << 20)
	waitFor(t, 5*time.Second, "refreshed free memory", func() bool { return registered() == 1<<20 })
	stop()
	setFree(1 << 10)
	time.Sleep(6 * interval)
	if got := registered(); got != 1<<20 {
		t.Fatalf("free %d written after stop, want %d kept", got, 1<<20)
	}
}
