package memory

import (
	"fmt"
	"testing"
)

// leafClasses walks every page of [va, va+n) and counts bytes per leaf
// class, failing on an unmapped page or a wrong translation.
func leafClasses(t *testing.T, pt *pageTable, va, pa, n uint64) [numClasses]uint64 {
	t.Helper()
	var got [numClasses]uint64
	for off := uint64(0); off < n; off += Page4K {
		l, ok := pt.walk(va + off)
		if !ok {
			t.Fatalf("%#x is not mapped", va+off)
		}
		if l.pa+(va+off-l.base) != pa+off {
			t.Fatalf("%#x maps to %#x, want %#x", va+off, l.pa+(va+off-l.base), pa+off)
		}
		got[l.class] += Page4K
	}
	return got
}

func TestPageTablePromotion(t *testing.T) {
	const va = vaBase
	tests := []struct {
		name   string
		pa     uint64 // physical base of a contiguous mapping of 2 MiB at va
		order  func(i int) int
		want   [numClasses]uint64
		noProm bool
	}{
		{name: "aligned 2 MiB", pa: 6 * Page2M, want: [numClasses]uint64{class2M: Page2M}},
		{name: "64 KiB aligned only", pa: 6*Page2M + Page64K, want: [numClasses]uint64{class64K: Page2M}},
		{name: "4 KiB aligned only", pa: 6*Page2M + Page4K, want: [numClasses]uint64{class4K: Page2M}},
		{name: "pages mapped backwards", pa: 6 * Page2M, order: func(i int) int { return pagesPer2M - 1 - i },
			want: [numClasses]uint64{class2M: Page2M}},
		{name: "base pages only", pa: 6 * Page2M, noProm: true, want: [numClasses]uint64{class4K: Page2M}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pt := newPageTable(tt.noProm)
			if tt.order == nil {
				pt.mapRange(va, tt.pa, Page2M)
			} else {
				for i := range pagesPer2M {
					off := uint64(tt.order(i)) * Page4K
					pt.mapRange(va+off, tt.pa+off, Page4K)
				}
			}
			if got := leafClasses(t, &pt, va, tt.pa, Page2M); got != tt.want || pt.mapped != tt.want {
				t.Errorf("leaf bytes %v, counters %v, want %v", got, pt.mapped, tt.want)
			}
		})
	}
}

// TestPageTableNoPromotionWhenScattered maps a full 64 KiB and 2 MiB region
// whose pages are all mapped but not physically contiguous.
func TestPageTableNoPromotionWhenScattered(t *testing.T) {
	pt := newPageTable(false)
	for i := range uint64(pagesPer2M) {
		// Swap the two halves of every 64 KiB region.
		j := i ^ pagesPer64K/2
		pt.mapRange(vaBase+i*Page4K, 8*Page2M+j*Page4K, Page4K)
	}
	if pt.mapped != [numClasses]uint64{class4K: Page2M} {
		t.Errorf("scattered pages promoted: %v", pt.mapped)
	}
	// 64 KiB regions in swapped pairs: 64 KiB leaves, but no 2 MiB one.
	pt = newPageTable(false)
	for i := range uint64(regionsPer2M) {
		j := i ^ 1
		pt.mapRange(vaBase+i*Page64K, 8*Page2M+j*Page64K, Page64K)
	}
	if pt.mapped != [numClasses]uint64{class64K: Page2M} {
		t.Errorf("scattered 64 KiB regions: %v", pt.mapped)
	}
}

func TestPageTableSplinter(t *testing.T) {
	const va, pa = vaBase, 4 * Page2M
	tests := []struct {
		off, n uint64
		want   [numClasses]uint64
	}{
		{0, Page2M, [numClasses]uint64{}},
		{0, Page4K, [numClasses]uint64{class64K: Page2M - Page64K, class4K: Page64K - Page4K}},
		{Page2M - Page4K, Page4K, [numClasses]uint64{class64K: Page2M - Page64K, class4K: Page64K - Page4K}},
		{Page64K, Page64K, [numClasses]uint64{class64K: Page2M - Page64K}},
		{Page64K - Page4K, 2 * Page4K, [numClasses]uint64{class64K: Page2M - 2*Page64K, class4K: 2*Page64K - 2*Page4K}},
		{Page4K, Page2M - 2*Page4K, [numClasses]uint64{class4K: 2 * Page4K}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%#x+%#x", tt.off, tt.n), func(t *testing.T) {
			pt := newPageTable(false)
			pt.mapRange(va, pa, Page2M)
			pt.unmapRange(va+tt.off, tt.n)
			if pt.mapped != tt.want {
				t.Errorf("after unmap: %v, want %v", pt.mapped, tt.want)
			}
			for off := uint64(0); off < Page2M; off += Page4K {
				l, ok := pt.walk(va + off)
				inHole := off >= tt.off && off < tt.off+tt.n
				switch {
				case ok == inHole:
					t.Fatalf("%#x: mapped %v, in the hole %v", va+off, ok, inHole)
				case ok && l.pa+(va+off-l.base) != pa+off:
					t.Fatalf("%#x moved to %#x", va+off, l.pa+(va+off-l.base))
				}
			}
			// Mapping the hole again coalesces back to one leaf.
			pt.mapRange(va+tt.off, pa+tt.off, tt.n)
			if pt.mapped != [numClasses]uint64{class2M: Page2M} {
				t.Errorf("after remap: %v", pt.mapped)
			}
			pt.unmapRange(va, Page2M)
			if len(pt.top) != 0 || pt.mapped != [numClasses]uint64{} {
				t.Errorf("empty table keeps %d regions, %v", len(pt.top), pt.mapped)
			}
		})
	}
}
