package cluster

import (
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/etcdtest"
)

// BenchmarkReserve measures an admission that fits in the mediator's chunk
// (no etcd round trip) against one that must reserve in etcd (a Txn on a
// 1-member etcd on loopback), in the same run, and reports the ratio.
func BenchmarkReserve(b *testing.B) {
	etcd := etcdtest.Start(b, 1)
	s, err := Connect(Options{Endpoints: etcd.Endpoints(), TTL: 10 * time.Second, Log: quietLog()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	measure := func(chunk uint64, n int) time.Duration {
		q, err := NewQuotas(s, QuotaOptions{ID: "bench", Chunk: chunk, TrimAfter: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		defer q.Close()
		start := time.Now()
		for range n {
			if err := q.Reserve("t", Limits{Memory: 1 << 50}, 4096, 0); err != nil {
				b.Fatal(err)
			}
		}
		d := time.Since(start) / time.Duration(n)
		q.Release("t", uint64(n)*4096, 0)
		return d
	}
	b.ResetTimer()
	local := measure(1<<40, b.N) // every admission fits the first chunk
	remote := measure(4096, b.N) // every admission is a Txn
	b.ReportMetric(float64(local.Nanoseconds()), "ns/local")
	b.ReportMetric(float64(remote.Nanoseconds()), "ns/etcd")
	b.ReportMetric(float64(remote)/float64(local), "etcd/local")
}
