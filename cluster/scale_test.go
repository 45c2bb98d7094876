package cluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vgpu/vgpu/internal/etcdtest"
)

// Scale of BenchmarkScale: docs/scale.md projects from its figures.
const (
	scaleNodes     = 1000
	scaleMediators = 100
	scaleTTL       = 10 * time.Second // DefaultTTL: a keepalive per node every 3.3s
	scalePutRate   = 50               // node entry updates per second, all nodes together
	scalePhase     = 10 * time.Second
)

// BenchmarkScale registers scaleNodes simulated nodes, each with a lease of
// its own kept alive as a node does, and scaleMediators watchers of the
// node registry, each on a client of its own as a mediator's, against one
// etcd member, and measures: etcd's CPU per node while the nodes only keep
// their leases; the fan-out latency from a node's update to each watcher;
// etcd's CPU per update delivered; and the latency of a cluster-wide
// admission (a Txn) under that load against one from a mediator's chunk.
// Run: go test ./cluster -run '^$' -bench Scale -benchtime 1x.
func BenchmarkScale(b *testing.B) {
	etcd := etcdtest.Start(b, 1)
	newClient := func() *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Nodes: 10 clients of 100 nodes each, every node with its own lease.
	var keepalives atomic.Int64
	var nodesWG sync.WaitGroup
	for c := range 10 {
		cli := newClient()
		for i := range scaleNodes / 10 {
			lease, err := cli.Grant(ctx, int64(scaleTTL/time.Second))
			if err != nil {
				b.Fatal(err)
			}
			key := fmt.Sprintf("/scale/nodes/10.%d.%d.1:7070", c, i)
			if _, err := cli.Put(ctx, key, "0", clientv3.WithLease(lease.ID)); err != nil {
				b.Fatal(err)
			}
			nodesWG.Go(func() {
				// First keepalives spread over the interval, as nodes
				// started at different times.
				t := time.NewTimer(time.Duration(i*10+c) * scaleTTL / 3 / scaleNodes)
				for {
					select {
					case <-ctx.Done():
						t.Stop()
						return
					case <-t.C:
					}
					if _, err := cli.KeepAliveOnce(ctx, lease.ID); err == nil {
						keepalives.Add(1)
					}
					t.Reset(scaleTTL / 3)
				}
			})
		}
	}
	b.Cleanup(func() { cancel(); nodesWG.Wait() })
	b.ResetTimer()

	// Phase 1: only keepalives.
	cpu0, _ := etcd.CPU(0)
	ka0, t0 := keepalives.Load(), time.Now()
	time.Sleep(scalePhase)
	cpu1, _ := etcd.CPU(0)
	idle := time.Since(t0)
	kaRate := float64(keepalives.Load()-ka0) / idle.Seconds()
	perNode := (cpu1 - cpu0).Seconds() / idle.Seconds() / scaleNodes // CPU seconds per second per node
	b.Logf("idle: %d nodes, %.0f keepalives/s, etcd CPU %.3f cores = %.1f µs per node per second",
		scaleNodes, kaRate, float64(cpu1-cpu0)/float64(idle), perNode*1e6)

	// Phase 2: watchers, and updates stamped with their send time.
	var mu sync.Mutex
	var lat []time.Duration
	var watchWG sync.WaitGroup
	ready := make(chan struct{}, scaleMediators)
	for range scaleMediators {
		cli := newClient()
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), "/scale/nodes/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		watchWG.Go(func() {
			var mine []time.Duration
			for resp := range wch {
				if resp.Created {
					ready <- struct{}{}
				}
				now := time.Now()
				for _, ev := range resp.Events {
					if ns, err := strconv.ParseInt(string(ev.Kv.Value), 10, 64); err == nil && ns > 0 {
						mine = append(mine, now.Sub(time.Unix(0, ns)))
					}
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	for range scaleMediators {
		<-ready
	}
	writer := newClient()
	cpu2, _ := etcd.CPU(0)
	t2 := time.Now()
	puts := 0
	tick := time.NewTicker(time.Second / scalePutRate)
	for time.Since(t2) < scalePhase {
		<-tick.C
		key := fmt.Sprintf("/scale/nodes/10.%d.%d.1:7070", puts%10, puts%(scaleNodes/10))
		// The lease stays the node's: IgnoreLease keeps it, as a
		// node's refresh under its own lease does.
		if _, err := writer.Put(ctx, key, strconv.FormatInt(time.Now().UnixNano(), 10), clientv3.WithIgnoreLease()); err != nil {
			b.Fatal(err)
		}
		puts++
	}
	tick.Stop()
	time.Sleep(time.Second) // the last events reach every watcher
	cpu3, _ := etcd.CPU(0)
	busy := time.Since(t2)

	// Admissions under that load: from a chunk, and through etcd.
	s, err := Connect(Options{Endpoints: etcd.Endpoints(), Log: quietLog()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	admit := func(chunk uint64, n int) []time.Duration {
		q, err := NewQuotas(s, QuotaOptions{ID: fmt.Sprintf("scale-%d", chunk), Chunk: chunk, TrimAfter: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		defer q.Close()
		out := make([]time.Duration, n)
		for i := range out {
			start := time.Now()
			if err := q.Reserve("t", Limits{Memory: 1 << 50}, 4096, 0); err != nil {
				b.Fatal(err)
			}
			out[i] = time.Since(start)
		}
		return out
	}
	local, remote := admit(1<<40, 2000), admit(4096, 200)
	cancel()
	watchWG.Wait()

	slices.Sort(lat)
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		return d[min(len(d)-1, int(p*float64(len(d))))]
	}
	slices.Sort(local)
	slices.Sort(remote)
	delivered := len(lat)
	// CPU seconds per event delivered, less what the keepalives took meanwhile.
	updCPU := ((cpu3 - cpu2).Seconds() - perNode*scaleNodes*busy.Seconds()) / float64(max(delivered, 1))
	b.Logf("fan-out: %d updates to %d watchers, %d of %d events delivered; latency p50 %v, p99 %v, max %v; etcd CPU %.3f cores, %.1f µs per event delivered beyond the keepalives",
		puts, scaleMediators, delivered, puts*scaleMediators, pct(lat, .5), pct(lat, .99), pct(lat, 1), float64(cpu3-cpu2)/float64(busy), updCPU*1e6)
	b.Logf("admission under load: from a chunk p50 %v p99 %v; through etcd p50 %v p99 %v; ratio of medians %.0f",
		pct(local, .5), pct(local, .99), pct(remote, .5), pct(remote, .99), float64(pct(remote, .5))/float64(pct(local, .5)))
	b.ReportMetric(perNode*1e6, "etcd-µs-cpu/node/s")
	b.ReportMetric(float64(pct(lat, .5).Microseconds()), "fanout-p50-µs")
	b.ReportMetric(float64(pct(lat, .99).Microseconds()), "fanout-p99-µs")
	b.ReportMetric(updCPU*1e6, "etcd-µs-cpu/event")
	b.ReportMetric(float64(pct(remote, .5))/float64(pct(local, .5)), "etcd/local-admission")
}
