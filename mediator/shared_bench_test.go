package mediator_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// BenchmarkSharedTable: a 256 MiB read-mostly table (an embedding table),
// exported sealed (immutable), read by one tenant on each of three
// mediators: random 4 KiB rows, 256 per synchronize. The same reads run
// through three mediators whose caches hold their pages and through three
// that cache nothing, alternately, in the same run; the ratio is cached
// over uncached throughput. It also counts the node's reads after the
// cache is warm (zero messages per read of a sealed table), and the
// coherence messages a write of a coherent page costs with three sharers.
//
//	go test -run xxx -bench SharedTable -benchtime 1x ./mediator/
func BenchmarkSharedTable(b *testing.B) {
	const (
		tableBytes = 256 << 20
		row        = 4 << 10
		batch      = 256
		rounds     = 40 // batches per reader per measurement
	)
	sys := startWith(b, 1<<30, nil)
	owner := sys.dial(b, "owner", 1)
	table, err := owner.Malloc(0, tableBytes)
	if err != nil {
		b.Fatal(err)
	}
	host, err := owner.HostAlloc(tableBytes)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < tableBytes; i += 8 {
		host[i] = byte(i >> 12) // each row starts with its number
	}
	s := owner.Stream()
	s.CopyToDevice(table, host)
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	grants := []api.Grant{{Tenant: "r0"}, {Tenant: "r1"}, {Tenant: "r2"}}
	sh, err := owner.Export(table, api.ModeImmutable, grants...)
	if err != nil {
		b.Fatal(err)
	}
	readers := func(edit func(*mediator.Config)) []*reader {
		var rs []*reader
		for i := range 3 {
			m := sys.another(b, fmt.Sprintf("m%d-%p", i, edit), edit)
			c := m.dial(b, fmt.Sprintf("r%d", i), 1)
			p, _, err := c.Import(sh)
			if err != nil {
				b.Fatal(err)
			}
			dst, err := c.HostAlloc(batch * row)
			if err != nil {
				b.Fatal(err)
			}
			rs = append(rs, &reader{c: c, table: p, dst: dst, rng: rand.New(rand.NewPCG(uint64(i), 7))})
		}
		return rs
	}
	cached := readers(func(*mediator.Config) {})
	uncached := readers(func(c *mediator.Config) { c.CacheMemory = 1 })
	for _, r := range cached { // warm: every page once
		all, err := r.c.HostAlloc(tableBytes)
		if err != nil {
			b.Fatal(err)
		}
		rs := r.c.Stream()
		rs.CopyFromDevice(all, r.table)
		if err := rs.Synchronize(); err != nil {
			b.Fatal(err)
		}
		if !bytes.Equal(all, host) {
			b.Fatal("the table read through the cache differs")
		}
		r.c.HostFree(all)
	}
	// The private baseline: a copy of the table in a reader's own memory,
	// read through the ordinary path, exact bytes, pipelined.
	r0 := cached[0]
	priv, err := r0.c.Malloc(0, tableBytes)
	if err != nil {
		b.Fatal(err)
	}
	ps := r0.c.Stream()
	ps.CopyToDevice(priv, host)
	if err := ps.Synchronize(); err != nil {
		b.Fatal(err)
	}
	private := []*reader{{c: r0.c, table: priv, dst: r0.dst, rng: rand.New(rand.NewPCG(99, 7))}}
	nodeReads := func() uint64 { return sys.nodes[0].Status().Coherence.Reads }
	var cachedMBps, uncachedMBps, privateMBps []float64
	var readsBefore uint64
	for i := 0; i < b.N; i++ {
		readsBefore = nodeReads()
		cachedMBps = append(cachedMBps, readAll(b, cached, rounds, batch, row))
		if after := nodeReads(); after != readsBefore {
			b.Fatalf("%d reads went to the node after the cache was warm", after-readsBefore)
		}
		uncachedMBps = append(uncachedMBps, readAll(b, uncached, rounds, batch, row))
		privateMBps = append(privateMBps, readAll(b, private, rounds, batch, row))
	}
	c, u, p := median(cachedMBps), median(uncachedMBps), median(privateMBps)
	b.ReportMetric(c, "cached-MB/s")
	b.ReportMetric(u, "uncached-MB/s")
	b.ReportMetric(c/u, "cached/uncached")
	b.ReportMetric(p, "private-1-reader-MB/s")
	b.ReportMetric(0, "node-msgs/cached-read") // checked above: any would fail the benchmark

	// Coherent: three sharers of a page, then a write of it.
	buf, err := owner.Malloc(0, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	coh, err := owner.Export(buf, api.ModeCoherent, grants...)
	if err != nil {
		b.Fatal(err)
	}
	var sharers []*reader
	for i, r := range cached {
		p, _, err := r.c.Import(coh)
		if err != nil {
			b.Fatal(err)
		}
		sharers = append(sharers, &reader{c: r.c, table: p, dst: r.dst[:8], rng: rand.New(rand.NewPCG(uint64(i), 9))})
	}
	const writes = 50
	before := sys.nodes[0].Status().Coherence
	for w := range writes {
		for _, r := range sharers {
			rs := r.c.Stream()
			rs.CopyFromDevice(r.dst, r.table)
			if err := rs.Synchronize(); err != nil {
				b.Fatal(err)
			}
		}
		s.CopyToDevice(buf, []byte{byte(w), 1, 2, 3, 4, 5, 6, 7})
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	after := sys.nodes[0].Status().Coherence
	msgs := float64(after.Invals-before.Invals+after.InvalAcks-before.InvalAcks) / float64(after.Writes-before.Writes)
	b.ReportMetric(msgs, "inval-msgs/write")
	b.ReportMetric(float64(after.Expired-before.Expired), "leases-waited-out")
}

type reader struct {
	c     *client.Client
	table client.Ptr
	dst   []byte
	rng   *rand.Rand
}

// readAll has every reader read rounds batches of random rows at once,
// and returns their total throughput; rows are checked.
func readAll(b *testing.B, rs []*reader, rounds, batch, row int) float64 {
	var wg sync.WaitGroup
	errs := make(chan error, len(rs))
	start := time.Now()
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := r.c.Stream()
			rows := make([]int, batch)
			for range rounds {
				for i := range rows {
					rows[i] = r.rng.IntN(256 << 20 / row)
					s.CopyFromDevice(r.dst[i*row:(i+1)*row], r.table.Add(uint64(rows[i]*row)))
				}
				if err := s.Synchronize(); err != nil {
					errs <- err
					return
				}
				for i, n := range rows {
					if r.dst[i*row] != byte(n) {
						errs <- fmt.Errorf("row %d reads as row %d", n, r.dst[i*row])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(len(rs)*rounds*batch*row) / d.Seconds() / 1e6
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
