package kernels

import (
	"fmt"
	"math"
	"sort"

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
			i32Param("indices", api.AccessRead, "nidx"), i64Param("nidx"),
			i32Param("offsets", api.AccessRead, "nbags"), i64Param("nbags"),
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
	// Bags are independent, and each element of out sums its bag's indices
	// in order from 0, so any split between bags or between columns, and any
	// split of a bag's indices into runs added in order, gives the same bits.
	// Slices end at bag boundaries where the adds of their bags reach
	// maxWork, so a few large bags do not hide in a slice of many small
	// ones; a bag larger than maxWork is cut in runs of its indices and,
	// where a row is wider than maxWork, blocks of its columns, so that no
	// slice holds the device for much longer than maxWork asks.
	width := (dim-1)/((dim-1)/maxWork+1) + 1 // columns of a block: at most maxWork, blocks near even
	blocks := (dim-1)/width + 1              // blocks of a row
	perRun := max(1, maxWork/width)          // indices of a run of one bag
	type piece struct {
		first    int // the piece's first slice
		lo, hi   int // bags [lo, hi), whole, in one slice
		cut      bool
		from, to int // or, if cut, bag lo = indices [from, to): a slice per run and block
	}
	var pieces []piece
	total := 0 // slices so far
	add := func(p piece, count int) {
		p.first = total
		pieces = append(pieces, p)
		total = min(total, math.MaxInt-count) + count // saturates, as work estimates do
	}
	start, work := 0, 0
	for b := range nbags {
		first, end := int(offsets[b]), len(indices)
		if b+1 < nbags {
			end = int(offsets[b+1])
		}
		size := max(end-first, 0)
		cost := satMul(size+1, dim)
		if cost > maxWork && (size > perRun || blocks > 1) {
			if b > start {
				add(piece{lo: start, hi: b}, 1)
			}
			runs := 1 // an empty bag has one, which clears its row
			if size > 0 {
				runs = (size-1)/perRun + 1
			}
			add(piece{lo: b, hi: b + 1, cut: true, from: first, to: end}, satMul(runs, blocks))
			start, work = b+1, 0
			continue
		}
		if work > 0 && cost > maxWork-work {
			add(piece{lo: start, hi: b}, 1)
			start, work = b, 0
		}
		work = min(work+cost, maxWork)
	}
	if start < nbags {
		add(piece{lo: start, hi: nbags}, 1)
	}
	return &Plan{n: total, slice: func(i, workers int) error {
		p := pieces[sort.Search(len(pieces), func(k int) bool { return pieces[k].first > i })-1]
		if p.cut {
			// Runs in order, the blocks of each run in turn: every element
			// gets the bag's indices in order, and is cleared by the first
			// run. The block's columns go to the workers.
			run, block := (i-p.first)/blocks, (i-p.first)%blocks
			from := p.from + run*perRun
			to, c0 := min(from+perRun, p.to), block*width
			c1 := min(c0+width, dim)
			return parallelForN(workers, c1-c0, to-from, func(l, h int) error {
				return addBag(out, table, indices, offsets, dim, p.lo, from, to, c0+l, c0+h)
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

var embedding = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "embedding",
		Doc: "out[i] = table[ids[i]] for i < n: a gather of rows of dim floats from table (vocab x dim), as " +
			"PyTorch's Embedding. ids is int32; every id is checked to lie in [0, vocab) before anything is " +
			"written. out must not overlap ids or table.",
		Params: []api.Param{
			i64Param("n"), i64Param("vocab"), i64Param("dim"),
			i32Param("ids", api.AccessRead, "n"),
			bufParam("table", api.AccessRead, 4, "vocab", "dim"),
			bufParam("out", api.AccessWrite, 4, "n", "dim"),
		},
	},
	plan: planEmbedding,
}

func planEmbedding(args []Value, maxWork int) (*Plan, error) {
	var c checker
	n := c.size("n", args[0].I64, 0)
	vocab := c.size("vocab", args[1].I64, 0)
	dim := c.size("dim", args[2].I64, 0)
	ids := view[int32](&c, "ids", args[3].Buf, "n", n)
	table := view[float32](&c, "table", args[4].Buf, "vocab*dim", vocab, dim)
	out := view[float32](&c, "out", args[5].Buf, "n*dim", n, dim)
	disjoint(&c, "out", out, "ids", ids)
	disjoint(&c, "out", out, "table", table)
	if c.err != nil {
		return nil, c.err
	}
	for i, id := range ids {
		if id < 0 || int(id) >= vocab {
			return nil, fmt.Errorf("ids[%d] = %d is outside [0, vocab = %d): %w", i, id, vocab, api.ErrInvalidArgument)
		}
	}
	if len(out) == 0 {
		return &Plan{}, nil
	}
	return runsPlan(n, dim, maxWork, func(i, lo, hi int) error {
		// Checked again: a concurrent launch of the tenant may have
		// rewritten ids since (as addBag).
		id := int(ids[i])
		if id < 0 || id >= vocab {
			return fmt.Errorf("ids[%d] changed during the launch to %d, outside [0, vocab = %d): %w", i, id, vocab, api.ErrInvalidArgument)
		}
		copy(out[i*dim+lo:i*dim+hi], table[id*dim+lo:id*dim+hi])
		return nil
	}), nil
}
