package memory

import (
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
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
// and checks them against the harness's model after every step. In some
// runs some spaces oversubscribe, with random caps, sharing a small host
// store whose spill file is used when its RAM is full.
func TestSpaceModel(t *testing.T) {
	dir := t.TempDir()
	rapid.Check(t, func(rt *rapid.T) {
		node := newFakeNode(rapid.IntRange(1, 12).Draw(rt, "frames per device"))
		node.scatter = rapid.Bool().Draw(rt, "scatter")
		limits := rapid.SliceOfN(rapid.SampledFrom([]uint64{0, 0, 3 << 20, 5<<20 + 12<<10}), 1, 3).Draw(rt, "limits")
		cfgs := limitsOnly(limits)
		var store *checkedStore
		if rapid.Bool().Draw(rt, "oversubscribe") {
			store = drawStore(rt, dir)
			for i := range cfgs {
				cfgs[i].oversub = rapid.IntRange(0, 3).Draw(rt, "space oversubscribes") > 0
				cfgs[i].resident = rapid.IntRange(0, 3).Draw(rt, "resident frames")
			}
		}
		h := newHarness(rt, node, store, cfgs)
		space := rapid.IntRange(0, len(limits)-1)
		dev := rapid.Uint32Range(0, 1)
		pick := rapid.IntRange(0, 1<<10)
		any64 := rapid.Uint64()
		// Every hint, and now and then one that is not.
		hint := rapid.Custom(func(t *rapid.T) vocab.Hint {
			return vocab.Hint(rapid.IntRange(0, 10).Draw(t, "hint") % 6)
		})
		ops := map[string]func(*rapid.T){
			"alloc": func(rt *rapid.T) {
				si := space.Draw(rt, "space")
				a := h.alloc(si, dev.Draw(rt, "dev"), sizeGen.Draw(rt, "size"), hint.Draw(rt, "hint"))
				if a != nil && rapid.Bool().Draw(rt, "seal once written") { // as weights are
					h.sealAlloc(si, a, 0)
				}
			},
			"seal": func(rt *rapid.T) {
				h.seal(space.Draw(rt, "space"), pick.Draw(rt, "pick"), any64.Draw(rt, "off"))
			},
			"sealFrames": func(rt *rapid.T) {
				h.sealFrames(space.Draw(rt, "space"), pick.Draw(rt, "pick"))
			},
			"free": func(rt *rapid.T) {
				h.free(space.Draw(rt, "space"), pick.Draw(rt, "pick"))
			},
			"translate": func(rt *rapid.T) {
				h.translate(space.Draw(rt, "space"), pick.Draw(rt, "pick"), any64.Draw(rt, "off"), any64.Draw(rt, "n"))
			},
			"translateAll": func(rt *rapid.T) {
				picks := rapid.SliceOfN(pick, 1, 3).Draw(rt, "picks")
				offs := rapid.SliceOfN(any64, 2*len(picks), 2*len(picks)).Draw(rt, "offs")
				writes := rapid.SliceOfN(rapid.Bool(), len(picks), len(picks)).Draw(rt, "writes")
				h.translateAll(space.Draw(rt, "space"), picks, offs, writes)
			},
			"write": func(rt *rapid.T) {
				h.write(space.Draw(rt, "space"), pick.Draw(rt, "pick"), any64.Draw(rt, "off"), any64.Draw(rt, "n"))
			},
			"misuse": func(rt *rapid.T) {
				h.misuse(space.Draw(rt, "space"), pick.Draw(rt, "kind"), pick.Draw(rt, "pick"), any64.Draw(rt, "x"))
			},
			"failingGrant": func(rt *rapid.T) {
				h.failingGrant(space.Draw(rt, "space"), dev.Draw(rt, "dev"), sizeGen.Draw(rt, "size"), hint.Draw(rt, "hint"))
			},
			"": func(*rapid.T) { h.check() },
		}
		if store != nil {
			ops["evict"] = func(rt *rapid.T) {
				h.evict(space.Draw(rt, "space"), pick.Draw(rt, "pick"), any64.Draw(rt, "off"), rapid.Bool().Draw(rt, "coldest"))
			}
			ops["failingIO"] = func(rt *rapid.T) {
				h.failingIO(space.Draw(rt, "space"), pick.Draw(rt, "pick"), any64.Draw(rt, "off"), any64.Draw(rt, "n"), rapid.Bool().Draw(rt, "grant"))
			}
		}
		rt.Repeat(ops)
		order := make([]int, len(limits))
		for i := range order {
			order[i] = i
		}
		h.closeAll(rapid.Permutation(order).Draw(rt, "close order"))
	})
}

// drawStore makes a small host store: a RAM budget of 0 to 4 frames, and
// no spill file, an unlimited one, or one of 1 to 4 frames.
func drawStore(rt *rapid.T, dir string) *checkedStore {
	budget := uint64(rapid.IntRange(0, 4).Draw(rt, "store RAM frames")) * FrameSize
	spill := rapid.IntRange(-1, 4).Draw(rt, "spill frames (-1: none, 0: no limit)")
	d := dir
	if spill < 0 {
		d = ""
	}
	hs, err := NewHostStore(budget, d)
	if err != nil {
		rt.Fatalf("host store: %v", err)
	}
	if spill > 0 {
		hs.SetSpillLimit(uint64(spill) * FrameSize)
	}
	return newCheckedStore(hs, rapid.Bool().Draw(rt, "store lends"))
}
