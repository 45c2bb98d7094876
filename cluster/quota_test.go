package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/capcheck"
	"github.com/vgpu/vgpu/internal/etcdtest"
)

func newQuotas(t *testing.T, s *Session, id string, trim time.Duration) *Quotas {
	t.Helper()
	q, err := NewQuotas(s, QuotaOptions{ID: id, TrimAfter: trim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	return q
}

func revision(t *testing.T, s *Session) int64 {
	t.Helper()
	resp, err := s.cli.Get(context.Background(), "rev")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// Admissions that fit in a mediator's chunk cost no etcd write; one that
// does not fit reserves a new chunk; the cap is exact at the boundary; and
// unused memory goes back after TrimAfter.
func TestReserveChunks(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	s := connect(t, etcd.Endpoints(), "")
	q := newQuotas(t, s, "m1", 300*time.Millisecond)
	lim := Limits{Memory: 200 << 20, MaxContainers: 0}
	before := revision(t, s)
	for range 64 {
		if err := q.Reserve("t", lim, 1<<20, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d := revision(t, s) - before; d != 1 {
		t.Fatalf("64 admissions of 1MiB wrote etcd %d times, want once (one 64MiB chunk)", d)
	}
	if err := q.Reserve("t", lim, 1<<20, 0); err != nil { // the 65th: a second chunk
		t.Fatal(err)
	}
	if d := revision(t, s) - before; d != 2 {
		t.Fatalf("65 admissions wrote etcd %d times, want twice", d)
	}
	// 65MiB used, a chunk would make 192MiB: then 200MiB is one byte short
	// of 135MiB+1B, and exactly enough for 135MiB.
	if err := q.Reserve("t", lim, 135<<20+1, 0); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("one byte over the cap: %v, want quota exceeded", err)
	}
	if err := q.Reserve("t", lim, 135<<20, 0); err != nil {
		t.Fatalf("exactly the cap: %v", err)
	}
	u, err := s.Usage(context.Background())
	if err != nil || u["t"].Memory != 200<<20 {
		t.Fatalf("usage %+v, %v: want 200MiB", u, err)
	}
	q.Release("t", 200<<20-1<<20, 0)
	waitFor(t, 3*time.Second, "unused memory given back", func() bool {
		u, err := s.Usage(context.Background())
		return err == nil && u["t"].Memory == 1<<20
	})
}

// Containers are reserved exactly and go back at once.
func TestReserveContainers(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := newQuotas(t, connect(t, etcd.Endpoints(), ""), "a", time.Minute)
	b := newQuotas(t, connect(t, etcd.Endpoints(), ""), "b", time.Minute)
	lim := Limits{MaxContainers: 3}
	for _, q := range []*Quotas{a, a, b} {
		if err := q.Reserve("t", lim, 1, 1); err != nil {
			t.Fatal(err)
		}
	}
	err := b.Reserve("t", lim, 1, 1)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "max_containers is 3") {
		t.Fatalf("fourth container: %v, want quota exceeded naming max_containers", err)
	}
	a.Release("t", 1, 1)
	start := time.Now()
	for {
		err := b.Reserve("t", lim, 1, 1)
		if err == nil {
			break
		}
		if !errors.Is(err, api.ErrQuotaExceeded) || time.Since(start) > 2*time.Second {
			t.Fatalf("after a release: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("a released container slot was another mediator's after %v", time.Since(start))
}

// Three mediators admit one tenant at once, each from many goroutines; the
// recorded history shows the tenant never over its cap, while the cap was
// contended (admissions refused, the peak near the cap). With the
// mediators' reservations not shared (each under its own prefix, as a
// mediator whose check were broken would be), the same check finds the
// over-admission.
func TestConcurrentAdmissionHistory(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	const limit = 512 << 20
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("planted=%v", planted), func(t *testing.T) {
			var qs []*Quotas
			for i := range 3 {
				prefix := "/concurrent/"
				if planted {
					prefix = fmt.Sprintf("/planted%d/", i)
				}
				// A generous op timeout: an unavailable answer would be
				// load on this machine, not the protocol under test.
				s, err := Connect(Options{Endpoints: etcd.Endpoints(), TTL: testTTL, OpTimeout: 10 * time.Second, Prefix: prefix, Log: quietLog()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				qs = append(qs, newQuotas(t, s, fmt.Sprintf("m%d", i), 100*time.Millisecond))
			}
			var mu sync.Mutex
			var history []capcheck.Event
			var refused, unavailable int
			var wg sync.WaitGroup
			stop := time.Now().Add(3 * time.Second)
			for i := range 16 {
				q := qs[i%3]
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(i), 1))
					for time.Now().Before(stop) {
						mem := uint64(16+r.IntN(80)) << 20
						err := q.Reserve("t", Limits{Memory: limit}, mem, 0)
						got := time.Now()
						mu.Lock()
						switch {
						case errors.Is(err, api.ErrQuotaExceeded):
							refused++
						case err != nil:
							unavailable++
						}
						mu.Unlock()
						if err != nil {
							time.Sleep(time.Millisecond)
							continue
						}
						time.Sleep(time.Duration(5+r.IntN(20)) * time.Millisecond)
						put := time.Now()
						q.Release("t", mem, 0)
						mu.Lock()
						history = append(history, capcheck.Event{Tenant: "t", Memory: mem, Got: got, Put: put})
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if unavailable > 0 {
				t.Errorf("%d admissions unavailable with etcd healthy", unavailable)
			}
			capcheck.Require(t, history, limit, refused, planted)
		})
	}
}

// With etcd gone, a mediator admits from its reservation only while its
// lease is certainly alive; everything else fails unavailable within the
// operation timeout. Once etcd is back, admissions work again.
func TestEtcdUnreachable(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	s := connect(t, etcd.Endpoints(), "")
	q := newQuotas(t, s, "m1", time.Minute)
	lim := Limits{Memory: 1 << 30}
	if err := q.Reserve("t", lim, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	etcd.Kill(0)
	if err := q.Reserve("t", lim, 1<<20, 0); err != nil {
		t.Fatalf("within the held chunk, lease alive: %v", err)
	}
	start := time.Now()
	err := q.Reserve("t", lim, 128<<20, 0)
	if !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("beyond the chunk with etcd dead: %v, want unavailable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refused after %v, want within the 1s op timeout", d)
	}
	waited := waitFor(t, testTTL+time.Second, "lease no longer certain", func() bool { return !s.Valid() })
	t.Logf("lease uncertain %v after etcd died", waited)
	if err := q.Reserve("t", lim, 1<<20, 0); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("within the chunk, lease uncertain: %v, want unavailable", err)
	}
	if u := q.Used("t"); u.Memory != 2<<20 {
		t.Fatalf("used %d after failures, want 2MiB", u.Memory)
	}
	etcd.Restart(0)
	etcd.WaitHealthy(20 * time.Second)
	if err := retryUnavailable(10*time.Second, func() error { return q.Reserve("t", lim, 1<<20, 0) }); err != nil {
		t.Fatalf("etcd back: %v", err)
	}
	u, err := s.Usage(context.Background())
	if err != nil || u["t"].Memory < 3<<20 {
		t.Fatalf("usage after recovery %+v, %v: want at least the 3MiB in use", u, err)
	}
}

// TestHelperHolder is the mediator process of TestKilledMediatorReleases:
// it reserves, says so, and waits to be killed.
func TestHelperHolder(t *testing.T) {
	ep := os.Getenv("CLUSTER_HELPER_ETCD")
	if ep == "" {
		t.Skip("run by TestKilledMediatorReleases")
	}
	s, err := Connect(Options{Endpoints: []string{ep}, TTL: testTTL, OpTimeout: time.Second, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewQuotas(s, QuotaOptions{ID: "victim"})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Reserve("t", Limits{Memory: 512 << 20, MaxContainers: 2}, 256<<20, 1); err != nil {
		t.Fatal(err)
	}
	fmt.Println("RESERVED")
	time.Sleep(time.Minute)
}

// A mediator SIGKILLed while holding reservations: they are back within
// the lease TTL, and another mediator can have them.
func TestKilledMediatorReleases(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHolder$")
	cmd.Env = append(os.Environ(), "CLUSTER_HELPER_ETCD="+etcd.Endpoint(0))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "RESERVED" {
	}
	s := connect(t, etcd.Endpoints(), "")
	q := newQuotas(t, s, "survivor", time.Minute)
	lim := Limits{Memory: 512 << 20, MaxContainers: 2}
	if err := q.Reserve("t", lim, 512<<20, 0); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("while the victim holds half: %v, want quota exceeded", err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed := time.Now()
	waitFor(t, testTTL+2*time.Second, "the killed mediator's reservation released", func() bool {
		u, err := s.Usage(context.Background())
		return err == nil && u["t"] == Reservation{}
	})
	t.Logf("released %v after SIGKILL (TTL %v)", time.Since(killed), testTTL)
	if err := q.Reserve("t", lim, 512<<20, 2); err != nil {
		t.Fatalf("the whole cap after the release: %v", err)
	}
}

// A cap lowered below what a mediator holds binds its next admission at
// once, though the memory is in its chunk.
func TestLoweredCapBindsTheChunk(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	q := newQuotas(t, connect(t, etcd.Endpoints(), ""), "m1", time.Minute)
	if err := q.Reserve("t", Limits{Memory: 1 << 30}, 1<<20, 0); err != nil { // holds a 64MiB chunk
		t.Fatal(err)
	}
	if err := q.Reserve("t", Limits{Memory: 1 << 30}, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Reserve("t", Limits{Memory: 2 << 20}, 1<<20, 0); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("3MiB under a cap lowered to 2MiB: %v, want quota exceeded", err)
	}
}
