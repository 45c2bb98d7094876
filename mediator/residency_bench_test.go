package mediator_test

import (
	"testing"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// BenchmarkJournaledPaging: what keeping an oversubscribing session's
// evicted memory for a restart (its store file and residency records,
// mediator/residency.go) costs on the paging path, as a tenant sees it:
// 2 MiB copies to the device that each fault a chunk in and evict
// another, through a sim node. The ratio of journaled to unjournaled
// (the host store in RAM) time, median over alternating rounds of three
// mediators on one node in one run; two unjournaled ones give the noise.
//
//	go test -run xxx -bench JournaledPaging -benchtime 1x ./mediator/
func BenchmarkJournaledPaging(b *testing.B) {
	const rounds, piece, chunks = 15, 2 << 20, 8
	over := func(c *mediator.Config) { c.TenantMemory, c.Oversubscribe, c.HostMemory = chunks/2*piece, 4, 1<<30 }
	plainOnly := func(c *mediator.Config) { over(c); c.StateDir = "" }
	sys := startWith(b, 1<<30, plainOnly)
	type tenant struct {
		sys  *system
		c    *client.Client
		p    client.Ptr
		next int
	}
	open := func(s *system, name string) *tenant {
		c := s.dial(b, name, 1)
		p, err := c.Malloc(0, chunks*piece)
		if err != nil {
			b.Fatal(err)
		}
		return &tenant{sys: s, c: c, p: p}
	}
	plain := open(sys, "plain")
	plain2 := open(sys.another(b, "plain2", plainOnly), "plain2")
	journaled := open(sys.another(b, "journaled", over), "journaled")
	data := make([]byte, piece)
	for i := range data {
		data[i] = byte(i * 7)
	}
	// page writes n pieces, each to the chunk after the last: with half
	// the chunks resident, each faults one in and evicts the coldest.
	page := func(t *tenant, n int) error {
		s := t.c.Stream()
		for range n {
			s.CopyToDevice(t.p.Add(uint64(t.next*piece)), data)
			if err := s.Synchronize(); err != nil {
				return err
			}
			t.next = (t.next + 1) % chunks
		}
		return nil
	}
	for _, t := range []*tenant{plain, plain2, journaled} { // every chunk written once
		if err := page(t, chunks); err != nil {
			b.Fatal(err)
		}
		if st := t.sys.med.Status(); st.Tenants[0].Evicted == 0 {
			b.Fatalf("nothing evicted: %+v", st.Tenants[0])
		}
	}
	if journaled.sys.med.Status().HostRAM != 0 || plain.sys.med.Status().HostRAM == 0 {
		b.Fatal("the journaled session's evicted memory is not in its store file, or the plain one's not in RAM")
	}
	for range b.N {
		var ratio, noise []float64
		for range rounds {
			op := func(t *tenant) func(*client.Client) error {
				return func(*client.Client) error { return page(t, 1) }
			}
			tp, tj, tp2 := timeOf(b, plain.c, op(plain), 16), timeOf(b, journaled.c, op(journaled), 16), timeOf(b, plain2.c, op(plain2), 16)
			ratio = append(ratio, float64(tj)/float64(tp))
			noise = append(noise, float64(tp2)/float64(tp))
		}
		r, nz := median(ratio), median(noise)
		b.ReportMetric(r, "journaled/plain")
		b.ReportMetric(nz, "plain/plain")
		b.Logf("2 MiB paging copies: journaled/plain median %.3f, plain/plain %.3f over %d rounds of 16", r, nz, rounds)
	}
}
