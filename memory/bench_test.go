package memory

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkTranslate translates random 4-byte accesses in a 1 GiB
// allocation mapped by 2 MiB leaves (as coalescing leaves it) and by 4 KiB
// leaves only. The ratio is what coalescing buys in TLB reach and walk
// depth; the TLB hit rate is reported alongside.
func BenchmarkTranslate(b *testing.B) {
	for _, bc := range []struct {
		name      string
		basePages bool
	}{{"leaves=multi", false}, {"leaves=4K", true}} {
		b.Run(bc.name, func(b *testing.B) {
			const size = 1 << 30
			basePagesOnly = bc.basePages
			s := NewSpace(newFakeNode(size/FrameSize).lease(0), 0)
			basePagesOnly = false
			va, err := s.Alloc(0, size)
			if err != nil {
				b.Fatal(err)
			}
			offs := make([]uint64, 1<<16)
			r := rand.New(rand.NewPCG(1, 2))
			for i := range offs {
				offs[i] = r.Uint64N(size-4) &^ 3
			}
			before := s.Stats()
			for i := 0; b.Loop(); i++ {
				if _, _, err := s.Translate(va+offs[i%len(offs)], 4); err != nil {
					b.Fatal(err)
				}
			}
			st := s.Stats()
			if n := st.TLBHits + st.TLBMisses - before.TLBHits - before.TLBMisses; n > 0 {
				b.ReportMetric(float64(st.TLBHits-before.TLBHits)/float64(n), "tlb-hit-rate")
			}
		})
	}
}
