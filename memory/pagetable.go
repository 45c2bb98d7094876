package memory

// Page-table geometry, as in a GPU MMU: a 2 MiB region holds 32 regions of
// 64 KiB, each of which holds 16 pages of 4 KiB.
const (
	shift4K  = 12
	shift64K = 16
	shift2M  = 21

	pagesPer64K  = Page64K / Page4K   // 16
	regionsPer2M = Page2M / Page64K   // 32
	pagesPer2M   = Page2M / Page4K    // 512
	full64K      = 1<<pagesPer64K - 1 // table4K.valid with every page mapped
)

// Leaf size classes, used to index per-size counters and TLB arrays.
const (
	class4K = iota
	class64K
	class2M
	numClasses
)

var classShift = [numClasses]uint{shift4K, shift64K, shift2M}

// leaf is one translation: the size-aligned virtual range [base, base+size)
// maps to [pa, pa+size), where size follows from the class.
type leaf struct {
	base, pa uint64
	class    int
}

func (l leaf) size() uint64 { return 1 << classShift[l.class] }

// pageTable is a three-level radix tree of translations. Its top level is
// sparse (a map keyed by the 2 MiB region number), because a tenant's
// address space is mostly holes.
//
// Invariants, after every mapRange and unmapRange:
//   - A 64 KiB region is a 64 KiB leaf exactly when all 16 of its 4 KiB pages
//     are mapped, physically contiguous, and its physical base is 64 KiB
//     aligned; a 2 MiB region is a 2 MiB leaf exactly when the same holds at
//     2 MiB (unless basePagesOnly, when every leaf is 4 KiB).
//   - No table is empty: a table whose last page is unmapped is dropped.
//   - mapped[c] is the number of bytes mapped by leaves of class c.
//
// Promotion and splintering never change a translation, only the leaf that
// holds it, which is why no data moves and a TLB entry of the smaller size
// stays correct after a promotion.
type pageTable struct {
	top           map[uint64]*pde
	mapped        [numClasses]uint64
	basePagesOnly bool
}

// pde is a top-level entry: a 2 MiB leaf at pa when t is nil, else a table
// of the region's 64 KiB entries.
type pde struct {
	pa uint64
	t  *table64K
}

type table64K struct {
	pages int // 4 KiB pages mapped below, so fullness and emptiness are O(1)
	e     [regionsPer2M]pme
}

// pme is one 64 KiB region: empty, a 64 KiB leaf at pa, or a table of 4 KiB
// leaves.
type pme struct {
	leaf bool
	pa   uint64
	t    *table4K
}

type table4K struct {
	valid uint16 // bit i is set when page i is mapped
	pa    [pagesPer64K]uint64
}

func newPageTable(basePagesOnly bool) pageTable {
	return pageTable{top: make(map[uint64]*pde), basePagesOnly: basePagesOnly}
}

// mapRange maps [va, va+n) to [pa, pa+n). All three are multiples of
// Page4K and the virtual range is unmapped (the Space never maps a page
// twice). Aligned stretches go straight in as large leaves, which is what
// the page-by-page path would promote them to anyway, only faster.
func (pt *pageTable) mapRange(va, pa, n uint64) {
	for n > 0 {
		step := uint64(Page4K)
		switch {
		case pt.basePagesOnly:
			pt.map4K(va, pa)
		case va%Page2M == 0 && pa%Page2M == 0 && n >= Page2M:
			pt.top[va>>shift2M] = &pde{pa: pa}
			pt.mapped[class2M] += Page2M
			step = Page2M
		case va%Page64K == 0 && pa%Page64K == 0 && n >= Page64K:
			d := pt.table(va)
			d.t.e[va>>shift64K%regionsPer2M] = pme{leaf: true, pa: pa}
			d.t.pages += pagesPer64K
			pt.mapped[class64K] += Page64K
			pt.promote2M(va, d)
			step = Page64K
		default:
			pt.map4K(va, pa)
		}
		va, pa, n = va+step, pa+step, n-step
	}
}

// table returns the top-level entry of va's 2 MiB region, creating it as a
// table. The region must not be a 2 MiB leaf.
func (pt *pageTable) table(va uint64) *pde {
	d := pt.top[va>>shift2M]
	if d == nil {
		d = &pde{t: new(table64K)}
		pt.top[va>>shift2M] = d
	}
	return d
}

func (pt *pageTable) map4K(va, pa uint64) {
	d := pt.table(va)
	e := &d.t.e[va>>shift64K%regionsPer2M]
	if e.t == nil {
		e.t = new(table4K)
	}
	i := va >> shift4K % pagesPer64K
	e.t.valid |= 1 << i
	e.t.pa[i] = pa
	d.t.pages++
	pt.mapped[class4K] += Page4K
	if pt.basePagesOnly {
		return
	}
	if promote64K(e) {
		pt.mapped[class4K] -= Page64K
		pt.mapped[class64K] += Page64K
		pt.promote2M(va, d)
	}
}

// promote64K turns e into a 64 KiB leaf if its 16 pages qualify.
func promote64K(e *pme) bool {
	t := e.t
	if t.valid != full64K || t.pa[0]%Page64K != 0 {
		return false
	}
	for i, pa := range t.pa {
		if pa != t.pa[0]+uint64(i)*Page4K {
			return false
		}
	}
	*e = pme{leaf: true, pa: t.pa[0]}
	return true
}

// promote2M turns va's region d into a 2 MiB leaf if its 32 entries
// qualify. Entries that are full and contiguous are already 64 KiB leaves
// (first invariant), so checking the leaves is checking every page.
func (pt *pageTable) promote2M(va uint64, d *pde) {
	t := d.t
	if t.pages != pagesPer2M || !t.e[0].leaf || t.e[0].pa%Page2M != 0 {
		return
	}
	for i, e := range t.e {
		if !e.leaf || e.pa != t.e[0].pa+uint64(i)*Page64K {
			return
		}
	}
	*d = pde{pa: t.e[0].pa}
	pt.mapped[class64K] -= Page2M
	pt.mapped[class2M] += Page2M
}

// unmapRange removes the translations of [va, va+n), multiples of Page4K
// that are all mapped. A large leaf that is only partly covered splinters
// into the next smaller leaves, which keep their translations.
func (pt *pageTable) unmapRange(va, n uint64) {
	end := va + n
	for va < end {
		key := va >> shift2M
		regionEnd := min(end, (key+1)<<shift2M)
		d := pt.top[key]
		if d.t == nil {
			if va%Page2M == 0 && regionEnd-va == Page2M {
				delete(pt.top, key)
				pt.mapped[class2M] -= Page2M
				va = regionEnd
				continue
			}
			t := &table64K{pages: pagesPer2M}
			for i := range t.e {
				t.e[i] = pme{leaf: true, pa: d.pa + uint64(i)*Page64K}
			}
			d.t = t
			pt.mapped[class2M] -= Page2M
			pt.mapped[class64K] += Page2M
		}
		for va < regionEnd {
			e := &d.t.e[va>>shift64K%regionsPer2M]
			subEnd := min(regionEnd, (va|(Page64K-1))+1)
			if e.leaf {
				if va%Page64K == 0 && subEnd-va == Page64K {
					*e = pme{}
					d.t.pages -= pagesPer64K
					pt.mapped[class64K] -= Page64K
					va = subEnd
					continue
				}
				t := &table4K{valid: full64K}
				for i := range t.pa {
					t.pa[i] = e.pa + uint64(i)*Page4K
				}
				*e = pme{t: t}
				pt.mapped[class64K] -= Page64K
				pt.mapped[class4K] += Page64K
			}
			for ; va < subEnd; va += Page4K {
				e.t.valid &^= 1 << (va >> shift4K % pagesPer64K)
				d.t.pages--
				pt.mapped[class4K] -= Page4K
			}
			if e.t.valid == 0 {
				e.t = nil
			}
		}
		if d.t.pages == 0 {
			delete(pt.top, key)
		}
	}
}

// walk returns the leaf that maps va, if any.
func (pt *pageTable) walk(va uint64) (leaf, bool) {
	d := pt.top[va>>shift2M]
	if d == nil {
		return leaf{}, false
	}
	if d.t == nil {
		return leaf{base: va &^ (Page2M - 1), pa: d.pa, class: class2M}, true
	}
	e := &d.t.e[va>>shift64K%regionsPer2M]
	if e.leaf {
		return leaf{base: va &^ (Page64K - 1), pa: e.pa, class: class64K}, true
	}
	i := va >> shift4K % pagesPer64K
	if e.t == nil || e.t.valid&(1<<i) == 0 {
		return leaf{}, false
	}
	return leaf{base: va &^ (Page4K - 1), pa: e.t.pa[i], class: class4K}, true
}
