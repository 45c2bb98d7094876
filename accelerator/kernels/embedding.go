package kernels

import (
	"fmt"

	"github.com/vgpu/vgpu/api"
)

var embeddingBagSum = &Kernel{
	Info: api.KernelInfo{
		Name: "embedding_bag_sum",
		Doc: "PyTorch EmbeddingBag(mode=sum), as in DLRM inference. table is rows x dim float32; indices " +
			"(nidx int32) and offsets (nbags int32) split the indices into bags: bag b holds " +
			"indices[offsets[b] : offsets[b+1]], the last bag indices[offsets[nbags-1] : nidx]. " +
			"out (nbags x dim) row b = the sum of the table rows of bag b, in float32 from 0 in index " +
			"order; an empty bag gives zeros. offsets[0] must be 0, offsets non-decreasing and at most " +
			"nidx, indices in [0, rows); out must not overlap the other buffers.",
		Params: []api.Param{
			bufParam("table", api.AccessRead, 4, "rows", "dim"), i64Param("rows"), i64Param("dim"),
			bufParam("indices", api.AccessRead, 4, "nidx"), i64Param("nidx"),
			bufParam("offsets", api.AccessRead, 4, "nbags"), i64Param("nbags"),
			bufParam("out", api.AccessWrite, 4, "nbags", "dim"),
		},
	},
	plan: planEmbeddingBagSum,
}

func planEmbeddingBagSum(args []Value, maxWork int) (*Plan, error) {
	var c checker
	rows := c.size("rows", args[1].I64, 0)
	dim := c.size("dim", args[2].I64, 1)
	nidx := c.size("nidx", args[4].I64, 0)
	nbags := c.size("nbags", args[6].I64, 0)
	if c.err == nil && nbags == 0 && nidx > 0 {
		c.fail("nbags = 0 but nidx = %d: every index must belong to a bag", nidx)
	}
	table := view[float32](&c, "table", args[0].Buf, "rows*dim", rows, dim)
	indices := view[int32](&c, "indices", args[3].Buf, "nidx", nidx)
	offsets := view[int32](&c, "offsets", args[5].Buf, "nbags", nbags)
	out := view[float32](&c, "out", args[7].Buf, "nbags*dim", nbags, dim)
	// out must not feed the bags: a bag's row of out would change the table
	// rows, indices or offsets that other bags, on other goroutines, read.
	disjoint(&c, "out", out, "table", table)
	disjoint(&c, "out", out, "indices", indices)
	disjoint(&c, "out", out, "offsets", offsets)
	if c.err != nil {
		return nil, c.err
	}
	if err := checkBags(indices, offsets, rows); err != nil {
		return nil, err
	}
	if nbags == 0 {
		return &Plan{}, nil
	}
	// Bags are independent, so any split between bags gives the same bits.
	// Slices end at bag boundaries where the adds of their bags reach
	// maxWork, so a few large bags do not hide in a slice of many small
	// ones; a bag larger than maxWork is cut in runs of its indices, added
	// in order into its row of out (the same adds in the same order), so
	// that no slice holds the device for much longer than maxWork asks.
	type piece struct {
		lo, hi   int // bags [lo, hi), whole
		from, to int // or, when to > 0, indices [from, to) of bag lo
	}
	var pieces []piece
	start, work := 0, 0
	perRun := max(1, maxWork/dim) // indices of a run of one bag
	for b := range nbags {
		first, end := int(offsets[b]), len(indices)
		if b+1 < nbags {
			end = int(offsets[b+1])
		}
		cost := satMul(max(end-first, 0)+1, dim)
		if cost > maxWork && end-first > perRun {
			if b > start {
				pieces = append(pieces, piece{lo: start, hi: b})
			}
			for i := first; i < end; i += perRun {
				pieces = append(pieces, piece{lo: b, hi: b + 1, from: i, to: min(i+perRun, end)})
			}
			start, work = b+1, 0
			continue
		}
		if work > 0 && cost > maxWork-work {
			pieces = append(pieces, piece{lo: start, hi: b})
			start, work = b, 0
		}
		work = min(work+cost, maxWork)
	}
	if start < nbags {
		pieces = append(pieces, piece{lo: start, hi: nbags})
	}
	return &Plan{n: len(pieces), slice: func(i, workers int) error {
		p := pieces[i]
		if p.to > 0 {
			// One bag: its columns go to the workers, each adding the run's
			// rows into its own columns in index order (the same bits).
			return parallelForN(workers, dim, p.to-p.from, func(c0, c1 int) error {
				return addBag(out, table, indices, offsets, dim, p.lo, p.from, p.to, c0, c1)
			})
		}
		lo, hi := p.lo, p.hi
		// The per-bag cost estimate is the slice's mean, as a whole
		// launch's was: nidx/nbags + 1 index reads and adds of dim floats.
		n := len(indices) - int(offsets[lo])
		if hi < nbags {
			n = int(offsets[hi]) - int(offsets[lo])
		}
		return parallelForN(workers, hi-lo, satMul(max(n, 0)/(hi-lo)+1, dim), func(l, h int) error {
			return sumBags(out, table, indices, offsets, dim, lo+l, lo+h)
		})
	}}, nil
}

// checkBags checks offsets and indices against the rules in Doc, so that a
// launch that breaks them fails before anything is written.
func checkBags(indices, offsets []int32, rows int) error {
	for b, o := range offsets {
		switch {
		case b == 0 && o != 0:
			return fmt.Errorf("offsets[0] = %d, want 0: %w", o, api.ErrInvalidArgument)
		case b > 0 && o < offsets[b-1]:
			return fmt.Errorf("offsets[%d] = %d is less than offsets[%d] = %d: %w", b, o, b-1, offsets[b-1], api.ErrInvalidArgument)
		case int(o) > len(indices):
			return fmt.Errorf("offsets[%d] = %d exceeds nidx = %d: %w", b, o, len(indices), api.ErrInvalidArgument)
		}
	}
	for i, idx := range indices {
		if idx < 0 || int(idx) >= rows {
			return fmt.Errorf("indices[%d] = %d is outside [0, rows = %d): %w", i, idx, rows, api.ErrInvalidArgument)
		}
	}
	return nil
}

// sumBags writes rows [lo, hi) of out. It reads each offset and index once
// and checks it again where it uses it: checkBags has passed, and out
// overlaps none of the inputs, but a concurrent launch of the same tenant
// could still rewrite them, and that must fail the launch, not panic.
func sumBags(out, table []float32, indices, offsets []int32, dim, lo, hi int) error {
	for b := lo; b < hi; b++ {
		if err := addBag(out, table, indices, offsets, dim, b, -1, -1, 0, dim); err != nil {
			return err
		}
	}
	return nil
}

// addBag adds columns [c0, c1) of the table rows of bag b's indices
// [from, to) into its row of out, in order, after clearing them if from is
// where the bag starts; from < 0 means the whole bag. Offsets and indices
// are checked again: the launch does not own them, and they may change
// under it.
func addBag(out, table []float32, indices, offsets []int32, dim, b, from, to, c0, c1 int) error {
	rows := len(table) / dim
	start, end := int(offsets[b]), len(indices)
	if b+1 < len(offsets) {
		end = int(offsets[b+1])
	}
	if start < 0 || start > end || end > len(indices) {
		return fmt.Errorf("bag %d: offsets changed during the launch to [%d, %d), nidx = %d: %w",
			b, start, end, len(indices), api.ErrInvalidArgument)
	}
	if from < 0 {
		from, to = start, end
	}
	if from < start || to > end {
		return fmt.Errorf("bag %d: offsets changed during the launch to [%d, %d), outside the run [%d, %d) being added: %w",
			b, start, end, from, to, api.ErrInvalidArgument)
	}
	acc := out[b*dim+c0 : b*dim+c1]
	if from == start {
		clear(acc)
	}
	for i := from; i < to; i++ {
		r := int(indices[i])
		if r < 0 || r >= rows {
			return fmt.Errorf("bag %d: indices[%d] changed during the launch to %d, outside [0, rows = %d): %w",
				b, i, r, rows, api.ErrInvalidArgument)
		}
		row := table[r*dim+c0 : r*dim+c1][:len(acc)]
		for j, v := range row {
			acc[j] += v
		}
	}
	return nil
}
