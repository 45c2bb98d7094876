package memory

import (
	"reflect"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

// TranslateInto gives what TranslateAll gives; each range's extents are
// capped at their length, so none can grow into the next range's; with
// spare room enough it allocates nothing, and with too little it goes on
// on the heap.
func TestTranslateIntoMatchesTranslateAll(t *testing.T) {
	node := newFakeNode(8)
	s := NewSpace(node.lease(0), 0)
	a := mustAlloc(t, s, 0, 3*Page2M)
	mustAlloc(t, s, 0, Page2M) // other frames between a's and b's
	b := mustAlloc(t, s, 0, 2*Page2M)
	rs := []Range{{VA: a + 5, Len: 3*Page2M - 9}, {VA: b, Len: 2 * Page2M, Write: true}, {VA: a, Len: 1}}
	want, err := s.TranslateAll(rs)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tr := range want {
		n += len(tr.Extents)
	}
	for _, room := range []int{0, 1, n} {
		ts := make([]Translation, len(rs))
		spare := make([]vocab.Extent, 0, room)
		if err := s.TranslateInto(rs, ts, spare); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ts, want) {
			t.Fatalf("spare of %d: TranslateInto gave %+v, TranslateAll %+v", room, ts, want)
		}
		for i, tr := range ts {
			if cap(tr.Extents) != len(tr.Extents) {
				t.Fatalf("spare of %d: range %d's extents have room %d past their %d", room, i, cap(tr.Extents), len(tr.Extents))
			}
		}
		if room == n && &ts[0].Extents[0] != &spare[:1][0] {
			t.Fatalf("spare of %d for %d extents: not used", room, n)
		}
	}
	ts := make([]Translation, len(rs))
	spare := make([]vocab.Extent, 0, n)
	if allocs := testing.AllocsPerRun(10, func() {
		if err := s.TranslateInto(rs, ts, spare); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("TranslateInto with room for every extent allocated %v times", allocs)
	}
}
