package memory

// TLB sizes per leaf class, powers of two, about those of a GPU's shared L2
// TLB. Each leaf size has its own direct-mapped array, so a large leaf takes
// one entry however much of it is touched: that reach is what coalescing
// buys. 2 MiB leaves reach 1 GiB (512 entries); 4 KiB leaves only 4 MiB.
var tlbEntries = [numClasses]int{class4K: 1024, class64K: 256, class2M: 512}

// tlbEntry caches one leaf. vpn is the leaf's virtual address shifted by
// its size; 0 marks an empty entry, which no real leaf can have because
// every virtual address is at least vaBase.
type tlbEntry struct {
	vpn, pa uint64
}

// tlb caches leaf translations of one page table. It must be invalidated
// for every range that is unmapped; mapping needs no invalidation, because
// promotion never changes a translation.
type tlb struct {
	ways         [numClasses][]tlbEntry
	hits, misses uint64
}

func newTLB() tlb {
	var t tlb
	for c, n := range tlbEntries {
		t.ways[c] = make([]tlbEntry, n)
	}
	return t
}

// lookup probes each array once, largest leaves first.
func (t *tlb) lookup(va uint64) (leaf, bool) {
	for c := class2M; c >= class4K; c-- {
		s := classShift[c]
		vpn := va >> s
		w := t.ways[c]
		if e := w[vpn&uint64(len(w)-1)]; e.vpn == vpn {
			t.hits++
			return leaf{base: vpn << s, pa: e.pa, class: c}, true
		}
	}
	t.misses++
	return leaf{}, false
}

func (t *tlb) fill(l leaf) {
	vpn := l.base >> classShift[l.class]
	w := t.ways[l.class]
	w[vpn&uint64(len(w)-1)] = tlbEntry{vpn: vpn, pa: l.pa}
}

// invalidate drops every entry whose leaf overlaps [va, va+n). Per class,
// it probes the slots of the leaves the range covers, or scans the whole
// array when that is fewer.
func (t *tlb) invalidate(va, n uint64) {
	for c, w := range t.ways {
		s := classShift[c]
		first, last := va>>s, (va+n-1)>>s
		if last-first < uint64(len(w)) {
			for vpn := first; vpn <= last; vpn++ {
				if e := &w[vpn&uint64(len(w)-1)]; e.vpn == vpn {
					*e = tlbEntry{}
				}
			}
			continue
		}
		for i, e := range w {
			if e.vpn != 0 && e.vpn<<s < va+n && (e.vpn+1)<<s > va {
				w[i] = tlbEntry{}
			}
		}
	}
}
