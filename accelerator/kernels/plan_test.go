package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
)

// runPlan checks args, cuts the launch into slices of maxWork and runs them
// in order, as a scheduler does; it reports the number of slices.
func runPlan(k *Kernel, args []Value, maxWork, workers int) (int, error) {
	p, err := k.Plan(args, maxWork)
	if err != nil {
		return 0, err
	}
	p.SetWorkers(workers)
	n := 0
	for more := p.Len() > 0; more; {
		n++
		if more, err = p.Step(); err != nil {
			return n, err
		}
	}
	if n != p.Len() {
		return n, fmt.Errorf("ran %d slices of a plan of %d", n, p.Len())
	}
	if more, err := p.Step(); more || err != nil {
		return n, fmt.Errorf("Step after the last slice: %v, %v", more, err)
	}
	return n, nil
}

// TestPlanMatchesRun launches every kernel with random arguments over one
// shared memory (buffers may overlap, be short or misaligned), once whole
// with Run and once in slices of random work: both must agree on failure,
// and write the same bytes; a Plan that fails writes nothing.
func TestPlanMatchesRun(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.SampledFrom(all).Draw(t, "kernel")
		mem := alloc(512)
		for i := range mem {
			if rapid.IntRange(0, 3).Draw(t, "zero") == 0 {
				continue // small ints as indices and offsets come up often
			}
			mem[i] = rapid.Byte().Draw(t, "byte")
		}
		type buf struct{ lo, hi int }
		bufs := map[int]buf{}
		args := make([]Value, len(k.Info.Params))
		for i, p := range k.Info.Params {
			args[i] = Value{Kind: p.Kind, I64: rapid.Int64Range(0, 12).Draw(t, "size"), F32: floats32(t, 1, "f32")[0]}
			if p.Kind == api.ArgBuffer {
				lo := 4 * rapid.IntRange(0, len(mem)/4).Draw(t, "buffer start")
				if rapid.IntRange(0, 9).Draw(t, "misalign") == 0 && lo > 0 {
					lo--
				}
				bufs[i] = buf{lo, rapid.IntRange(lo, len(mem)).Draw(t, "buffer end")}
			}
		}
		with := func(mem []byte) []Value {
			out := slices.Clone(args)
			for i, b := range bufs {
				out[i].Buf = mem[b.lo:b.hi]
			}
			return out
		}
		whole := slices.Clone(mem)
		errRun := k.Run(with(whole))
		maxWork := rapid.IntRange(1, 64).Draw(t, "max work")
		sliced := slices.Clone(mem)
		if _, err := k.Plan(with(sliced), maxWork); err != nil && !slices.Equal(sliced, mem) {
			t.Fatalf("Plan failed (%v) and wrote memory", err)
		}
		_, errPlan := runPlan(k, with(sliced), maxWork, rapid.IntRange(0, 3).Draw(t, "workers"))
		if (errRun == nil) != (errPlan == nil) {
			t.Fatalf("Run: %v; in slices of %d: %v", errRun, maxWork, errPlan)
		}
		if !slices.Equal(whole, sliced) {
			t.Fatalf("in slices of %d the kernel wrote other bytes than Run (err %v)", maxWork, errRun)
		}
	})
}

// TestPlanLarge runs each kernel on random data of some size in slices of
// several sizes and compares the bits with Run's.
func TestPlanLarge(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	rnd := func(n int) []float32 {
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = float32(r.NormFloat64()) * float32(math.Pow(10, float64(r.IntN(7)-3)))
		}
		return xs
	}
	const m, n, kk = 37, 29, 17
	const nv = 10001
	const rows, dim, nbags = 50, 7, 40
	var indices, offsets []int32
	for b := range nbags {
		offsets = append(offsets, int32(len(indices)))
		size := r.IntN(6)
		if b == 7 {
			size = 300 // one bag larger than a slice
		}
		for range size {
			indices = append(indices, int32(r.IntN(rows)))
		}
	}
	cases := []struct {
		kernel string
		args   func() []Value // fresh buffers, same contents every call
		out    int            // the argument written
	}{
		{"sgemm", func() []Value {
			r = rand.New(rand.NewPCG(3, 4))
			return []Value{i64Arg(m), i64Arg(n), i64Arg(kk), f32Arg(1.5), f32sArg(rnd(m * kk)...), f32sArg(rnd(kk * n)...), f32Arg(0.25), f32sArg(rnd(m * n)...)}
		}, 7},
		{"saxpy", func() []Value {
			r = rand.New(rand.NewPCG(5, 6))
			return []Value{i64Arg(nv), f32Arg(-0.75), f32sArg(rnd(nv)...), f32sArg(rnd(nv)...)}
		}, 3},
		{"fill_f32", func() []Value { return []Value{bufArg(alloc(4 * nv)), i64Arg(nv), f32Arg(3.5)} }, 0},
		{"reduce_sum_f32", func() []Value {
			r = rand.New(rand.NewPCG(7, 8))
			return []Value{i64Arg(nv), f32sArg(rnd(nv)...), f32sArg(42)}
		}, 2},
		{"embedding_bag_sum", func() []Value {
			r = rand.New(rand.NewPCG(9, 10))
			return []Value{f32sArg(rnd(rows * dim)...), i64Arg(rows), i64Arg(dim), i32sArg(indices...), i64Arg(int64(len(indices))),
				i32sArg(offsets...), i64Arg(nbags), f32sArg(sevens(nbags * dim)...)}
		}, 7},
	}
	for _, tc := range cases {
		k := mustLookup(t, tc.kernel)
		want := tc.args()
		if err := k.Run(want); err != nil {
			t.Fatalf("%s: %v", tc.kernel, err)
		}
		for i, maxWork := range []int{1, 100, 4096, 1 << 18} {
			got := tc.args()
			slices, err := runPlan(k, got, maxWork, i)
			if err != nil {
				t.Fatalf("%s in slices of %d: %v", tc.kernel, maxWork, err)
			}
			if maxWork == 100 && slices < 10 {
				t.Errorf("%s: %d slices of work 100", tc.kernel, slices)
			}
			sameBits(t, tc.kernel, floatsOf(got[tc.out].Buf), floatsOf(want[tc.out].Buf))
		}
	}
}

// TestPlanSliceWork checks that slices are bounded in work, at least one
// item each: rows of sgemm, or where a row costs more than a slice, blocks
// of its columns (64 at least) in chunks of its sums (4 products at least).
func TestPlanSliceWork(t *testing.T) {
	const m, n, k = 64, 63, 63
	args := []Value{i64Arg(m), i64Arg(n), i64Arg(k), f32Arg(1), bufArg(alloc(4 * m * k)), bufArg(alloc(4 * k * n)), f32Arg(0), bufArg(alloc(4 * m * n))}
	for _, tc := range []struct{ maxWork, want int }{{n * (k + 1) * 4, 16}, {n*(k+1)*4 + 1, 16}, {(k + 1) * 8, m * 8}, {1, m * 16}, {math.MaxInt, 1}} {
		p, err := mustLookup(t, "sgemm").Plan(args, tc.maxWork)
		if err != nil {
			t.Fatal(err)
		}
		if p.Len() != tc.want {
			t.Errorf("sgemm %dx%dx%d in slices of work %d: %d slices, want %d", m, n, k, tc.maxWork, p.Len(), tc.want)
		}
	}
	p, err := mustLookup(t, "saxpy").Plan([]Value{i64Arg(1000), f32Arg(1), bufArg(alloc(4000)), bufArg(alloc(4000))}, 400)
	if err != nil || p.Len() != 10 {
		t.Errorf("saxpy of 1000 in slices of work 400 (100 elements): %d slices, %v", p.Len(), err)
	}
	// Bags: [0 0 0 0 | 50 indices | 0 0] of rows of 4: the large bag is
	// cut in runs of 5 indices (20 adds), ten slices of its own.
	offs := []int32{0, 0, 0, 0, 0, 50, 50}
	emb := []Value{bufArg(alloc(4 * 4)), i64Arg(1), i64Arg(4), bufArg(alloc(4 * 50)), i64Arg(50), i32sArg(offs...), i64Arg(int64(len(offs))), bufArg(alloc(4 * 4 * len(offs)))}
	p, err = mustLookup(t, "embedding_bag_sum").Plan(emb, 20)
	if err != nil || p.Len() != 12 {
		t.Errorf("embedding_bag_sum with one large bag: %d slices, %v; want 12", p.Len(), err)
	}
	// Nothing to do: no slices.
	p, err = mustLookup(t, "sgemm").Plan([]Value{i64Arg(0), i64Arg(5), i64Arg(5), f32Arg(1), bufArg(nil), bufArg(alloc(100)), f32Arg(0), bufArg(nil)}, 10)
	if err != nil || p.Len() != 0 {
		t.Errorf("empty sgemm: %d slices, %v", p.Len(), err)
	}
}

// TestPlanEmbeddingWideRows cuts rows wider than a slice into blocks of
// columns: with maxWork 16, rows of 4*16+3 = 67 columns make 5 blocks of at
// most 14, and each index (or empty bag, which is cleared) of each block is
// a slice of its own, 16 adds at most. The bytes must be Run's.
func TestPlanEmbeddingWideRows(t *testing.T) {
	const rows, maxWork, dim = 3, 16, 4*16 + 3
	r := rand.New(rand.NewPCG(11, 12))
	table := make([]float32, rows*dim)
	for i := range table {
		table[i] = float32(r.NormFloat64()) * float32(math.Pow(10, float64(r.IntN(7)-3)))
	}
	// Bags: [2 0 2 | empty | 1 | empty | 2 2].
	indices := []int32{2, 0, 2, 1, 2, 2}
	offsets := []int32{0, 3, 3, 4, 4}
	args := func() []Value {
		return []Value{f32sArg(table...), i64Arg(rows), i64Arg(dim), i32sArg(indices...), i64Arg(int64(len(indices))),
			i32sArg(offsets...), i64Arg(int64(len(offsets))), f32sArg(sevens(len(offsets) * dim)...)}
	}
	k := mustLookup(t, "embedding_bag_sum")
	want := args()
	if err := k.Run(want); err != nil {
		t.Fatal(err)
	}
	const slices = (3 + 1 + 1 + 1 + 2) * 5
	for workers := range 4 {
		got := args()
		n, err := runPlan(k, got, maxWork, workers)
		if err != nil || n != slices {
			t.Fatalf("rows of %d in slices of work %d: %d slices, %v; want %d", dim, maxWork, n, err, slices)
		}
		sameBits(t, "out", floatsOf(got[7].Buf), floatsOf(want[7].Buf))
	}
}

// TestPlanEmbeddingMatchesRun runs embedding_bag_sum on valid random bags,
// rows often wider than a slice, whole with Run and in slices of random
// work: the bytes must agree, and no slice may do more than maxWork adds,
// so there are at least nidx*dim/maxWork slices.
func TestPlanEmbeddingMatchesRun(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rows := rapid.IntRange(1, 5).Draw(t, "rows")
		dim := rapid.IntRange(1, 40).Draw(t, "dim")
		_, indices, offsets := randomBags(t, rows, 7)
		table := floats32(t, rows*dim, "table")
		args := func() []Value {
			return []Value{f32sArg(table...), i64Arg(int64(rows)), i64Arg(int64(dim)), i32sArg(indices...), i64Arg(int64(len(indices))),
				i32sArg(offsets...), i64Arg(int64(len(offsets))), f32sArg(sevens(len(offsets) * dim)...)}
		}
		k := mustLookup(t, "embedding_bag_sum")
		want := args()
		if err := k.Run(want); err != nil {
			t.Fatal(err)
		}
		maxWork := rapid.IntRange(1, 64).Draw(t, "max work")
		got := args()
		n, err := runPlan(k, got, maxWork, rapid.IntRange(0, 3).Draw(t, "workers"))
		if err != nil {
			t.Fatalf("in slices of %d: %v", maxWork, err)
		}
		if adds := len(indices) * dim; n*maxWork < adds {
			t.Fatalf("%d adds in %d slices of work %d", adds, n, maxWork)
		}
		sameBits(t, "out", floatsOf(got[7].Buf), floatsOf(want[7].Buf))
	})
}
