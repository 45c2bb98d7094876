package mediator_test

import (
	"testing"
	"time"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// BenchmarkJournalCost: what journaling a session (a state directory, a
// resumable client) costs on the allocation path (malloc and free of 4 KiB
// and of 4 MiB) and on the small-op path (a 64-byte copy to the device and
// back, then synchronize), as the ratio of journaled to unjournaled time,
// two mediators on one node measured alternately in one run; the ratio of
// two unjournaled runs is the noise band.
//
//	go test -run xxx -bench JournalCost -benchtime 1x ./mediator/
func BenchmarkJournalCost(b *testing.B) {
	const rounds = 15
	sys := startWith(b, 1<<30, func(c *mediator.Config) { c.StateDir = "" })
	plain := sys.dial(b, "plain", 1)
	plain2 := sys.another(b, "plain2", func(c *mediator.Config) { c.StateDir = "" }).dial(b, "plain2", 1)
	journaled := sys.another(b, "journaled").dial(b, "journaled", 1)
	cases := []struct {
		name string // a metric unit: no spaces
		op   func(c *client.Client) error
		n    int
	}{
		{"malloc+free-4KiB", func(c *client.Client) error { return mallocFree(c, 4<<10) }, 200},
		{"malloc+free-4MiB", func(c *client.Client) error { return mallocFree(c, 4<<20) }, 100},
		{"copy-64B-and-back", smallOps, 400},
	}
	for range b.N {
		for _, tc := range cases {
			var ratio, noise []float64
			for range rounds {
				tp, tj, tp2 := timeOf(b, plain, tc.op, tc.n), timeOf(b, journaled, tc.op, tc.n), timeOf(b, plain2, tc.op, tc.n)
				ratio = append(ratio, float64(tj)/float64(tp))
				noise = append(noise, float64(tp2)/float64(tp))
			}
			r, nz := median(ratio), median(noise)
			b.ReportMetric(r, "journaled/plain("+tc.name+")")
			b.ReportMetric(nz, "plain/plain("+tc.name+")")
			b.Logf("%s: journaled/plain median %.3f, plain/plain %.3f over %d rounds of %d", tc.name, r, nz, rounds, tc.n)
		}
	}
}

func mallocFree(c *client.Client, n uint64) error {
	p, err := c.Malloc(0, n)
	if err != nil {
		return err
	}
	return c.Free(p)
}

var smallBuf = map[*client.Client]client.Ptr{}

func smallOps(c *client.Client) error {
	p, ok := smallBuf[c]
	if !ok {
		var err error
		if p, err = c.Malloc(0, 64); err != nil {
			return err
		}
		smallBuf[c] = p
	}
	var in, out [64]byte
	s := c.Stream()
	s.CopyToDevice(p, in[:])
	s.CopyFromDevice(out[:], p)
	return s.Synchronize()
}

func timeOf(b *testing.B, c *client.Client, op func(*client.Client) error, n int) time.Duration {
	start := time.Now()
	for range n {
		if err := op(c); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// BenchmarkJournalLiveChurn: what journaling costs a session that
// allocates and frees while it holds many live allocations (2 000 of
// 4 KiB), whose journal is compacted to a snapshot of them over and over
// (mediator/journalcompact.go): the ratio of journaled to unjournaled time
// of a malloc and free, as BenchmarkJournalCost measures it.
//
//	go test -run xxx -bench JournalLiveChurn -benchtime 1x ./mediator/
func BenchmarkJournalLiveChurn(b *testing.B) {
	const rounds, live = 15, 2000
	sys := startWith(b, 1<<30, func(c *mediator.Config) { c.StateDir = "" })
	open := func(s *system, name string) *client.Client {
		c := s.dial(b, name, 1)
		for range live {
			if _, err := c.Malloc(0, 4<<10); err != nil {
				b.Fatal(err)
			}
		}
		return c
	}
	plain := open(sys, "plain")
	plain2 := open(sys.another(b, "plain2", func(c *mediator.Config) { c.StateDir = "" }), "plain2")
	journaled := open(sys.another(b, "journaled"), "journaled")
	op := func(c *client.Client) error { return mallocFree(c, 4<<10) }
	for range b.N {
		var ratio, noise []float64
		for range rounds {
			tp, tj, tp2 := timeOf(b, plain, op, 400), timeOf(b, journaled, op, 400), timeOf(b, plain2, op, 400)
			ratio = append(ratio, float64(tj)/float64(tp))
			noise = append(noise, float64(tp2)/float64(tp))
		}
		r, nz := median(ratio), median(noise)
		b.ReportMetric(r, "journaled/plain")
		b.ReportMetric(nz, "plain/plain")
		b.Logf("malloc+free-4KiB with %d live: journaled/plain median %.3f, plain/plain %.3f over %d rounds of 400", live, r, nz, rounds)
	}
}
