package memory

import (
	"slices"
	"testing"
)

func TestVAFreeMerges(t *testing.T) {
	v := newVAFree()
	a, _ := v.take(Page2M)
	b, _ := v.take(2 * Page2M)
	c, _ := v.take(Page2M)
	if a != vaBase || b != a+Page2M || c != b+2*Page2M {
		t.Fatalf("first fit from the base: %#x %#x %#x", a, b, c)
	}
	v.put(b, 2*Page2M)
	if got, _ := v.take(Page2M); got != b {
		t.Errorf("hole not reused first: %#x, want %#x", got, b)
	}
	v.put(b, Page2M)
	v.put(a, Page2M)
	v.put(c, Page2M)
	if want := []vaRun{{vaBase, vaTop}}; !slices.Equal(v.runs, want) {
		t.Errorf("after returning everything: %v, want %v", v.runs, want)
	}
	if _, ok := v.take(vaTop); ok {
		t.Error("took more than the address space")
	}
}

func TestChunkFindFree(t *testing.T) {
	var c chunk
	c.mark(0, 1, true)
	c.mark(20, 100, true)
	tests := []struct {
		pages, align, want int
		ok                 bool
	}{
		{1, 1, 1, true},
		{19, 1, 1, true},
		{20, 1, 120, true},
		{16, 16, 128, true},
		{4, 16, 16, true},
		{384, 16, 128, true},
		{385, 16, 0, false},
		{392, 1, 120, true},
		{393, 1, 0, false},
	}
	for _, tt := range tests {
		got, ok := c.findFree(tt.pages, tt.align)
		if got != tt.want || ok != tt.ok {
			t.Errorf("findFree(%d, %d) = %d, %v; want %d, %v", tt.pages, tt.align, got, ok, tt.want, tt.ok)
		}
	}
	c.mark(20, 100, false)
	if c.n != 1 || c.firstUsed(1, pagesPer2M) != -1 {
		t.Errorf("after freeing: %d pages used, first used after 0 is %d", c.n, c.firstUsed(1, pagesPer2M))
	}
}
