package memory

import (
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Benchmarks of the figures the design promises. Each reports ratios of
// quantities measured in the same run, so that the noise of a shared
// machine cancels out; the ns/op of the harness loop itself means little.

// newBenchSpace returns a space with one allocation of size bytes on a
// fake node just large enough, mapped by 4 KiB leaves only if basePages.
func newBenchSpace(b *testing.B, size uint64, basePages bool) (*Space, uint64) {
	b.Helper()
	basePagesOnly = basePages
	s := NewSpace(newFakeNode(int(size/FrameSize)).lease(0), 0)
	basePagesOnly = false
	va, err := s.Alloc(0, size)
	if err != nil {
		b.Fatal(err)
	}
	return s, va
}

// BenchmarkTranslateRatio makes random 4-byte accesses over a 1 GiB buffer
// mapped by multi-size leaves (one 2 MiB leaf per frame, as coalescing
// leaves it) and by 4 KiB leaves only, alternating in the same run. It
// times the per-address lookup (TLB, else walk and fill: Space.lookup, the
// path of every translation) and whole Translate calls (locking, checks,
// extents), and reports:
//
//	multi-lookups/s, 4k-lookups/s  lookups per second of each
//	speedup                        their ratio; the target is ≥ 5
//	multi-translates/s, 4k-translates/s, translate-speedup  the same for Translate
//	multi-tlb-hit, 4k-tlb-hit      TLB hit rates over all of it
func BenchmarkTranslateRatio(b *testing.B) {
	const size = 1 << 30
	multi, mva := newBenchSpace(b, size, false)
	base, bva := newBenchSpace(b, size, true)
	offs := make([]uint64, 1<<16)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range offs {
		offs[i] = r.Uint64N(size-4) &^ 3
	}
	lookups := func(s *Space, va uint64) time.Duration {
		s.mu.Lock()
		defer s.mu.Unlock()
		t0 := time.Now()
		for _, off := range offs {
			if _, ok := s.lookup(va + off); !ok {
				b.Fatalf("%#x not mapped", va+off)
			}
		}
		return time.Since(t0)
	}
	translates := func(s *Space, va uint64) time.Duration {
		t0 := time.Now()
		for _, off := range offs {
			if _, _, err := s.Translate(va+off, 4); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	lookups(multi, mva) // warm the caches of both alike
	lookups(base, bva)
	m0, b0 := multi.Stats(), base.Stats()
	var tml, tbl, tmt, tbt time.Duration
	n := 0
	for b.Loop() {
		tml += lookups(multi, mva)
		tbl += lookups(base, bva)
		tmt += translates(multi, mva)
		tbt += translates(base, bva)
		n += len(offs)
	}
	hitRate := func(s *Space, before Stats) float64 {
		st := s.Stats()
		h, m := st.TLBHits-before.TLBHits, st.TLBMisses-before.TLBMisses
		return float64(h) / float64(h+m)
	}
	b.ReportMetric(float64(n)/tml.Seconds(), "multi-lookups/s")
	b.ReportMetric(float64(n)/tbl.Seconds(), "4k-lookups/s")
	b.ReportMetric(tbl.Seconds()/tml.Seconds(), "speedup")
	b.ReportMetric(float64(n)/tmt.Seconds(), "multi-translates/s")
	b.ReportMetric(float64(n)/tbt.Seconds(), "4k-translates/s")
	b.ReportMetric(tbt.Seconds()/tmt.Seconds(), "translate-speedup")
	b.ReportMetric(hitRate(multi, m0), "multi-tlb-hit")
	b.ReportMetric(hitRate(base, b0), "4k-tlb-hit")
}

// tableCounts returns the leaves of a page table and the bytes of its
// tables (top-level entries, 64 KiB tables and 4 KiB tables).
func tableCounts(pt *pageTable) (leaves int, bytes uint64) {
	const (
		pdeBytes  = 16 + 16 // the entry, its key and pointer in the map
		t64KBytes = 8 + regionsPer2M*24
		t4KBytes  = 8 + pagesPer64K*8
	)
	for _, d := range pt.top {
		bytes += pdeBytes
		if d.t == nil {
			leaves++
			continue
		}
		bytes += t64KBytes
		for _, e := range d.t.e {
			switch {
			case e.leaf:
				leaves++
			case e.t != nil:
				bytes += t4KBytes
				for v := e.t.valid; v != 0; v &= v - 1 {
					leaves++
				}
			}
		}
	}
	return leaves, bytes
}

// BenchmarkPTEs maps 1 GiB with 4 KiB leaves only and with multi-size
// leaves and reports the page-table entries (leaves) each needs, the bytes
// of their tables, and the ratio of entries: 512 expected, since a 2 MiB
// leaf stands for 512 4 KiB ones.
func BenchmarkPTEs(b *testing.B) {
	const size = 1 << 30
	var l4k, lmulti int
	var b4k, bmulti uint64
	for b.Loop() {
		base, _ := newBenchSpace(b, size, true)
		multi, _ := newBenchSpace(b, size, false)
		l4k, b4k = tableCounts(&base.pt)
		lmulti, bmulti = tableCounts(&multi.pt)
	}
	b.ReportMetric(float64(l4k), "ptes-4k")
	b.ReportMetric(float64(lmulti), "ptes-multi")
	b.ReportMetric(float64(l4k)/float64(lmulti), "fewer")
	b.ReportMetric(float64(b4k), "table-bytes-4k")
	b.ReportMetric(float64(bmulti), "table-bytes-multi")
}

// BenchmarkChurn runs 4 spaces on one node through churnSteps random
// allocations and frees each time round (a fresh node and seed each
// round), sizes log-uniform from 4 KiB to 64 MiB, each space holding at
// most 1 GiB. Then it reports, over the live allocations at the end of
// every round:
//
//	2m-share        the share of bytes of live allocations of 2 MiB or
//	                more that 2 MiB leaves map; the target is ≥ 0.9
//	2m-share-ideal  the share their whole chunks make up (the tail of an
//	                allocation is a 2 MiB leaf only once small ones fill it)
//	frames-per-gib  frames held per GiB allocated, 512 being no waste
func BenchmarkChurn(b *testing.B) {
	const (
		spaces     = 4
		perSpace   = 1 << 30
		churnSteps = 4000
		minSize    = 4 << 10
		maxSize    = 64 << 20
	)
	var big, in2M, whole, allocated, frames uint64
	round := uint64(0)
	for b.Loop() {
		round++
		node := newFakeNode(spaces * (perSpace + maxSize) / FrameSize)
		r := rand.New(rand.NewPCG(7, round))
		type live struct{ va, size uint64 }
		sps := make([]*Space, spaces)
		lives := make([][]live, spaces)
		held := make([]uint64, spaces)
		for i := range sps {
			sps[i] = NewSpace(node.lease(i), perSpace)
		}
		for range churnSteps {
			i := r.IntN(spaces)
			size := uint64(math.Exp(math.Log(minSize) + r.Float64()*(math.Log(maxSize)-math.Log(minSize))))
			if len(lives[i]) > 0 && (r.IntN(2) == 0 || held[i]+size > perSpace) {
				k := r.IntN(len(lives[i]))
				l := lives[i][k]
				if err := sps[i].Free(l.va); err != nil {
					b.Fatal(err)
				}
				held[i] -= l.size
				lives[i][k] = lives[i][len(lives[i])-1]
				lives[i] = lives[i][:len(lives[i])-1]
				continue
			}
			if held[i]+size > perSpace {
				continue
			}
			va, err := sps[i].Alloc(0, size)
			if err != nil {
				b.Fatal(err)
			}
			fp, _ := Footprint(size)
			lives[i] = append(lives[i], live{va, fp})
			held[i] += fp
		}
		for i, s := range sps {
			st := s.Stats()
			allocated += st.Allocated
			frames += uint64(st.Frames)
			for _, l := range lives[i] {
				if l.size < Page2M {
					continue
				}
				big += l.size
				whole += l.size &^ (Page2M - 1)
				for va := l.va; va < l.va+l.size; {
					lf, ok := s.pt.walk(va)
					if !ok {
						b.Fatalf("%#x not mapped", va)
					}
					next := min(l.va+l.size, lf.base+lf.size())
					if lf.class == class2M {
						in2M += next - va
					}
					va = next
				}
			}
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(in2M)/float64(big), "2m-share")
	b.ReportMetric(float64(whole)/float64(big), "2m-share-ideal")
	b.ReportMetric(float64(frames)/(float64(allocated)/(1<<30)), "frames-per-gib")
}

// BenchmarkOversubscribe sweeps sequentially over a working set 1.5 times
// the space's resident cap, translating each 1 MiB piece and copying a
// piece's worth of bytes through the fake node's frame memory as a copy to
// the device would; the same sweep over a space whose cap holds it all
// runs alongside, and a plain memcpy of as many bytes in 2 MiB blocks
// between two buffers as large as the working set. A sequential sweep
// larger than the cap is LRU's worst case: every chunk is faulted in, and
// one evicted, on every sweep. Paging happens inside Translate, so the
// benchmark times the Translate calls apart from the copies: the time the
// oversubscribed sweep spends translating beyond what the fitting one does
// is the cost of evicting and faulting in (reading the victim's frame into
// the store, writing the faulting chunk's contents into the frame, and the
// page-table and TLB work). It reports:
//
//	paging-MB/s  bytes evicted plus bytes faulted in per second of that time
//	memcpy-MB/s  the memcpy bandwidth
//	ratio        their ratio; the target is ≥ 0.5
//	fit-MB/s, oversub-MB/s  the sweeps' own bandwidths, copies included
//
// The store is host RAM (store=ram) or only the spill file (store=spill),
// whose speed is the page cache's and the disk's.
func BenchmarkOversubscribe(b *testing.B) {
	const (
		cap   = 128 << 20
		ws    = cap * 3 / 2
		piece = 1 << 20
	)
	// ram and spill are the mediator's host store; file is the store file
	// of a journaled session, with a record of each residency change
	// written as its journal writes it (mediator/residency.go).
	for _, name := range []string{"store=ram", "store=spill", "store=file"} {
		b.Run(name, func(b *testing.B) {
			setup := func(resident uint64) (*Space, *fakeNode, uint64) {
				node := newFakeNode(ws / FrameSize)
				s := NewSpace(node.lease(0), 0)
				if name == "store=file" {
					store, err := CreateFileStore(filepath.Join(b.TempDir(), "s.store"), nil)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { store.Remove() })
					j, err := os.Create(filepath.Join(b.TempDir(), "s.journal"))
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { j.Close() })
					s.Oversubscribe(store, resident)
					s.SetResidency(&journalingResidency{store: store, f: j})
				} else {
					budget, dir := uint64(ws), ""
					if name == "store=spill" {
						budget, dir = 0, b.TempDir()
					}
					store, err := NewHostStore(budget, dir)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { store.Close() })
					s.Oversubscribe(store, resident)
				}
				va, err := s.Alloc(0, ws)
				if err != nil {
					b.Fatal(err)
				}
				return s, node, va
			}
			over, overNode, overVA := setup(cap)
			fit, fitNode, fitVA := setup(ws)
			src := make([]byte, piece)
			for i := range src {
				src[i] = byte(i * 7)
			}
			// sweep returns the time it took and the part of it spent in
			// Translate.
			sweep := func(s *Space, node *fakeNode, va uint64) (all, translating time.Duration) {
				t0 := time.Now()
				for off := uint64(0); off < ws; off += piece {
					t1 := time.Now()
					dev, xs, err := s.Translate(va+off, piece)
					translating += time.Since(t1)
					if err != nil {
						b.Fatal(err)
					}
					copyExtents(node, dev, xs, src, true)
				}
				return time.Since(t0), translating
			}
			from, to := make([]byte, ws), make([]byte, ws)
			for i := 0; i < ws; i += 4096 {
				from[i], to[i] = 1, 1 // commit the pages
			}
			memcpy := func() time.Duration {
				t0 := time.Now()
				for off := 0; off < ws; off += FrameSize {
					copy(to[off:off+FrameSize], from[off:off+FrameSize])
				}
				return time.Since(t0)
			}
			for range 2 {
				sweep(fit, fitNode, fitVA)
				sweep(over, overNode, overVA)
				memcpy()
			}
			var tFit, tOver, trFit, trOver, tCopy time.Duration
			var paged, copied, swept uint64
			for b.Loop() {
				all, tr := sweep(fit, fitNode, fitVA)
				tFit, trFit = tFit+all, trFit+tr
				before := over.Stats()
				all, tr = sweep(over, overNode, overVA)
				tOver, trOver = tOver+all, trOver+tr
				after := over.Stats()
				paged += (after.Faults - before.Faults + after.Evictions - before.Evictions) * FrameSize
				tCopy += memcpy()
				copied += ws
				swept += ws
			}
			if st := fit.Stats(); st.Evictions != 0 {
				b.Fatalf("the fitting sweep evicted: %+v", st)
			}
			extra := (trOver - trFit).Seconds()
			pagingBW := float64(paged) / extra
			copyBW := float64(copied) / tCopy.Seconds()
			b.ReportMetric(pagingBW/1e6, "paging-MB/s")
			b.ReportMetric(copyBW/1e6, "memcpy-MB/s")
			b.ReportMetric(pagingBW/copyBW, "ratio")
			b.ReportMetric(float64(swept)/tFit.Seconds()/1e6, "fit-MB/s")
			b.ReportMetric(float64(swept)/tOver.Seconds()/1e6, "oversub-MB/s")
		})
	}
}

// journalingResidency writes a record of each residency change to f, as a
// mediator's session journal does: a JSON body behind its length and
// CRC-32C, one write each.
type journalingResidency struct {
	store *FileStore
	f     *os.File
	buf   []byte
}

func (j *journalingResidency) write(rec any) {
	body, err := json.Marshal(rec)
	if err != nil {
		panic(err)
	}
	j.buf = binary.LittleEndian.AppendUint32(j.buf[:0], uint32(len(body)))
	j.buf = binary.LittleEndian.AppendUint32(j.buf, crc32.Checksum(body, castagnoli))
	if _, err := j.f.Write(append(j.buf, body...)); err != nil {
		panic(err)
	}
}

func (j *journalingResidency) Evicted(dev uint32, va, key uint64) {
	sum, _ := j.store.Sum(key)
	j.write(struct {
		Op  string `json:"op"`
		Dev uint32 `json:"dev"`
		VA  uint64 `json:"va"`
		Key uint64 `json:"key"`
		Sum uint32 `json:"sum"`
	}{"evict", dev, va, key, sum})
}

func (j *journalingResidency) Resident(dev uint32, va, frame uint64, keep bool) {
	j.write(struct {
		Op    string `json:"op"`
		Dev   uint32 `json:"dev"`
		VA    uint64 `json:"va"`
		Frame uint64 `json:"frame"`
		Keep  bool   `json:"keep"`
	}{"resident", dev, va, frame, keep})
}
