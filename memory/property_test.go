package memory

import (
	"testing"

	"pgregory.net/rapid"
)

// sizeGen draws allocation sizes, weighted towards the shapes that matter:
// sub-page sizes, page and 64 KiB multiples, fractions of a frame that fill
// one when combined, and multi-frame sizes with and without a tail.
var sizeGen = rapid.Custom(func(t *rapid.T) uint64 {
	switch rapid.IntRange(0, 6).Draw(t, "shape") {
	case 0:
		return rapid.Uint64Range(1, 3*Page4K).Draw(t, "bytes")
	case 1:
		return Page4K * rapid.Uint64Range(1, 40).Draw(t, "pages")
	case 2:
		return Page64K * rapid.Uint64Range(1, 31).Draw(t, "regions")
	case 3:
		return rapid.SampledFrom([]uint64{Page2M / 2, Page2M / 4, Page2M / 8}).Draw(t, "fraction")
	case 4:
		return rapid.Uint64Range(1, Page2M).Draw(t, "bytes")
	case 5:
		return Page2M * rapid.Uint64Range(1, 4).Draw(t, "frames")
	default:
		return rapid.Uint64Range(Page2M, 5*Page2M).Draw(t, "bytes")
	}
})

// TestSpaceModel runs random operations on several spaces sharing one node
// and checks them against the harness's model after every step.
func TestSpaceModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		node := newFakeNode(rapid.IntRange(1, 12).Draw(rt, "frames per device"))
		node.scatter = rapid.Bool().Draw(rt, "scatter")
		limits := rapid.SliceOfN(rapid.SampledFrom([]uint64{0, 0, 3 << 20, 5<<20 + 12<<10}), 1, 3).Draw(rt, "limits")
		h := newHarness(rt, node, limits)
		space := rapid.IntRange(0, len(limits)-1)
		dev := rapid.Uint32Range(0, 1)
		pick := rapid.IntRange(0, 1<<10)
		any64 := rapid.Uint64()
		rt.Repeat(map[string]func(*rapid.T){
			"alloc": func(rt *rapid.T) {
				h.alloc(space.Draw(rt, "space"), dev.Draw(rt, "dev"), sizeGen.Draw(rt, "size"))
			},
			"free": func(rt *rapid.T) {
				h.free(space.Draw(rt, "space"), pick.Draw(rt, "pick"))
			},
			"translate": func(rt *rapid.T) {
				h.translate(space.Draw(rt, "space"), pick.Draw(rt, "pick"), any64.Draw(rt, "off"), any64.Draw(rt, "n"))
			},
			"misuse": func(rt *rapid.T) {
				h.misuse(space.Draw(rt, "space"), pick.Draw(rt, "kind"), pick.Draw(rt, "pick"), any64.Draw(rt, "x"))
			},
			"failingGrant": func(rt *rapid.T) {
				h.failingGrant(space.Draw(rt, "space"), dev.Draw(rt, "dev"), sizeGen.Draw(rt, "size"))
			},
			"": func(*rapid.T) { h.check() },
		})
		order := make([]int, len(limits))
		for i := range order {
			order[i] = i
		}
		for _, i := range rapid.Permutation(order).Draw(rt, "close order") {
			h.closeSpace(i)
		}
		if n := len(node.owner); n != 0 {
			rt.Fatalf("%d frames still leased after every space closed", n)
		}
	})
}
