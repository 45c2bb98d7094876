package kernels

import (
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vgpu/vgpu/api"
	"pgregory.net/rapid"
)

// The references below are written the plain way, loop by loop, and compare
// bit for bit with the kernels: each kernel's Doc fixes the order and
// rounding of every sum, so there is one right answer, not a neighbourhood.
// For sgemm the reference loops i-j-p (a dot product per element) where the
// kernel loops i-p-j, unrolled; per element both add the same float32
// products in the same order, so the bits agree, and a kernel that summed in
// another order or fused a multiply-add would be caught.

func refSgemm(m, n, k int, alpha float32, a, b []float32, beta float32, c []float32) []float32 {
	out := slices.Clone(c)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			if beta != 0 {
				s = beta * c[i*n+j]
			}
			if alpha != 0 {
				for p := 0; p < k; p++ {
					s += float32(float32(alpha*a[i*k+p]) * b[p*n+j])
				}
			}
			out[i*n+j] = s
		}
	}
	return out
}

func refSaxpy(a float32, x, y []float32) []float32 {
	out := slices.Clone(y)
	for i := range x {
		out[i] = float32(a*x[i]) + y[i]
	}
	return out
}

func refEmbedding(table []float32, dim int, indices, offsets []int32, out []float32) []float32 {
	out = slices.Clone(out)
	for b := range offsets {
		end := int32(len(indices))
		if b+1 < len(offsets) {
			end = offsets[b+1]
		}
		for j := 0; j < dim; j++ {
			var s float32
			for _, idx := range indices[offsets[b]:end] {
				s += table[int(idx)*dim+j]
			}
			out[b*dim+j] = s
		}
	}
	return out
}

func TestFillF32(t *testing.T) {
	for _, tc := range []struct {
		n     int64
		value float32
		x     []float32
		want  []float32
	}{
		{0, 1, nil, nil},
		{0, 1, []float32{5}, []float32{5}},
		{3, -2.5, []float32{1, 2, 3}, []float32{-2.5, -2.5, -2.5}},
		{2, float32(math.Inf(1)), []float32{1, 2, 3}, []float32{float32(math.Inf(1)), float32(math.Inf(1)), 3}},
	} {
		x := f32Bytes(tc.x...)
		if err := mustLookup(t, "fill_f32").Run([]Value{bufArg(x), i64Arg(tc.n), f32Arg(tc.value)}); err != nil {
			t.Fatal(err)
		}
		sameBits(t, "x", floatsOf(x), tc.want)
	}
}

func TestSaxpy(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int64
		a    float32
		x, y []float32
	}{
		{"empty", 0, 2, nil, nil},
		{"basic", 3, 2, []float32{1, 2, 3}, []float32{10, 20, 30}},
		{"tail untouched", 2, -1, []float32{1, 2, 3}, []float32{4, 5, 6}},
		{"rounding", 2, 0.1, []float32{3, 1e-8}, []float32{0.7, 1}},
		{"infinities", 2, float32(math.Inf(1)), []float32{1, 0}, []float32{float32(math.Inf(-1)), 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := f32Bytes(tc.y...)
			if err := mustLookup(t, "saxpy").Run([]Value{i64Arg(tc.n), f32Arg(tc.a), f32sArg(tc.x...), bufArg(y)}); err != nil {
				t.Fatal(err)
			}
			want := slices.Clone(tc.y)
			copy(want, refSaxpy(tc.a, tc.x[:tc.n], tc.y[:tc.n]))
			sameBits(t, "y", floatsOf(y), want)
		})
	}
}

func TestSaxpyAliased(t *testing.T) {
	// x and y the same buffer: y = a*y + y.
	y := f32Bytes(1, 2, 3)
	if err := mustLookup(t, "saxpy").Run([]Value{i64Arg(3), f32Arg(2), bufArg(y), bufArg(y)}); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "y", floatsOf(y), []float32{3, 6, 9})
}

func TestReduceSumF32(t *testing.T) {
	big := make([]float32, 10001)
	big[0] = 1 << 24
	for i := 1; i < len(big); i++ {
		big[i] = 1 // each lost in a float32 sum at 2^24, kept in float64
	}
	for _, tc := range []struct {
		name string
		n    int64
		x    []float32
		want float32
	}{
		{"empty", 0, nil, 0},
		{"one", 1, []float32{-3.5}, -3.5},
		{"prefix", 2, []float32{1, 2, 100}, 3},
		{"float64 accumulator", int64(len(big)), big, 1<<24 + 10000},
		{"cancellation", 3, []float32{1e10, 1, -1e10}, 1},
		{"overflow to inf", 2, []float32{math.MaxFloat32, math.MaxFloat32}, float32(math.Inf(1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := f32Bytes(7, 7)
			if err := mustLookup(t, "reduce_sum_f32").Run([]Value{i64Arg(tc.n), f32sArg(tc.x...), bufArg(out)}); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "out", floatsOf(out), []float32{tc.want, 7})
		})
	}
}

func TestSgemm(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name        string
		m, n, k     int
		alpha, beta float32
		a, b, c     []float32
		want        []float32 // nil: the reference's answer
	}{
		{name: "2x3x4", m: 2, n: 3, k: 4, alpha: 1, beta: 0,
			a:    []float32{1, 2, 3, 4, 5, 6, 7, 8},
			b:    []float32{1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1},
			c:    sevens(6),
			want: []float32{5, 6, 7, 13, 14, 15}},
		{name: "alpha beta", m: 2, n: 2, k: 2, alpha: 2, beta: -1,
			a: []float32{1, 2, 3, 4}, b: []float32{5, 6, 7, 8}, c: []float32{1, 1, 1, 1},
			want: []float32{37, 43, 85, 99}},
		{name: "beta 0 ignores NaN in C", m: 1, n: 2, k: 1, alpha: 1, beta: 0,
			a: []float32{2}, b: []float32{3, 4}, c: []float32{nan, nan}, want: []float32{6, 8}},
		{name: "alpha 0 ignores A and B", m: 1, n: 2, k: 1, alpha: 0, beta: 2,
			a: []float32{nan}, b: []float32{float32(math.Inf(1)), 1}, c: []float32{1, 2}, want: []float32{2, 4}},
		{name: "k 0 scales C", m: 2, n: 2, k: 0, alpha: 1, beta: 3, c: []float32{1, 2, 3, 4}, want: []float32{3, 6, 9, 12}},
		{name: "m 0", m: 0, n: 3, k: 2, alpha: 1, beta: 1, b: make([]float32, 6)},
		{name: "n 0", m: 3, n: 0, k: 2, alpha: 1, beta: 1, a: make([]float32, 6)},
		// No buffer bounds m when n and k are 0; the kernel must not loop over it.
		{name: "huge m, n 0", m: math.MaxInt, n: 0, k: 0, alpha: 1, beta: 1, want: []float32{}},
		{name: "k 7 exercises the unrolled loop and its tail", m: 3, n: 5, k: 7, alpha: 0.3, beta: 0.7,
			a: seq(21, 0.1), b: seq(35, -0.37), c: seq(15, 1.3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := f32Bytes(tc.c...)
			err := mustLookup(t, "sgemm").Run([]Value{
				i64Arg(int64(tc.m)), i64Arg(int64(tc.n)), i64Arg(int64(tc.k)), f32Arg(tc.alpha),
				f32sArg(tc.a...), f32sArg(tc.b...), f32Arg(tc.beta), bufArg(c)})
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == nil {
				want = refSgemm(tc.m, tc.n, tc.k, tc.alpha, tc.a, tc.b, tc.beta, tc.c)
			}
			sameBits(t, "c", floatsOf(c), want)
		})
	}
}

// seq returns n floats that are not round numbers, so that rounding shows.
func seq(n int, step float32) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = float32(i%11-5)*step + 1/float32(i+3)
	}
	return xs
}

// TestSgemmDeterministic runs an sgemm big enough to split across
// goroutines under several GOMAXPROCS and checks every run against the
// reference, bit for bit.
func TestSgemmDeterministic(t *testing.T) {
	const m, n, k = 67, 129, 61
	a, b, c := seq(m*k, 0.01), seq(k*n, 0.03), seq(m*n, 0.7)
	want := refSgemm(m, n, k, 1.5, a, b, -0.5, c)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 2, 3, 8} {
		runtime.GOMAXPROCS(procs)
		cb := f32Bytes(c...)
		err := mustLookup(t, "sgemm").Run([]Value{i64Arg(m), i64Arg(n), i64Arg(k), f32Arg(1.5),
			f32sArg(a...), f32sArg(b...), f32Arg(-0.5), bufArg(cb)})
		if err != nil {
			t.Fatal(err)
		}
		sameBits(t, "c", floatsOf(cb), want)
	}
}

func TestSgemmBuffersInOneAllocation(t *testing.T) {
	// a, b and c laid end to end in one allocation, each buffer running to
	// its end, as a node passes them: adjacent is not overlapping.
	mem := f32Bytes(1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0)
	err := mustLookup(t, "sgemm").Run([]Value{i64Arg(2), i64Arg(2), i64Arg(2), f32Arg(1),
		bufArg(mem), bufArg(mem[16:]), f32Arg(0), bufArg(mem[32:])})
	if err != nil {
		t.Fatal(err)
	}
	sameBits(t, "mem", floatsOf(mem), []float32{1, 2, 3, 4, 5, 6, 7, 8, 19, 22, 43, 50})
}

func TestEmbeddingBagSum(t *testing.T) {
	// table rows r = [r, 10r, 100r] for r in 0..4.
	var table []float32
	for r := range 5 {
		table = append(table, float32(r), float32(10*r), float32(100*r))
	}
	for _, tc := range []struct {
		name             string
		rows             int
		indices, offsets []int32
		want             []float32
	}{
		{"bags", 5, []int32{0, 4, 1, 1, 3, 2}, []int32{0, 2, 2}, []float32{4, 40, 400, 0, 0, 0, 7, 70, 700}},
		{"one bag", 5, []int32{3, 3}, []int32{0}, []float32{6, 60, 600}},
		{"empty last bag", 5, []int32{1}, []int32{0, 1}, []float32{1, 10, 100, 0, 0, 0}},
		{"no indices", 5, nil, []int32{0, 0}, []float32{0, 0, 0, 0, 0, 0}},
		{"no bags", 5, nil, nil, nil},
		{"empty table", 0, nil, []int32{0}, []float32{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nbags := len(tc.offsets)
			out := f32Bytes(sevens(nbags*3 + 1)...)
			err := mustLookup(t, "embedding_bag_sum").Run([]Value{
				f32sArg(table[:tc.rows*3]...), i64Arg(int64(tc.rows)), i64Arg(3),
				i32sArg(tc.indices...), i64Arg(int64(len(tc.indices))),
				i32sArg(tc.offsets...), i64Arg(int64(nbags)), bufArg(out)})
			if err != nil {
				t.Fatal(err)
			}
			sameBits(t, "out", floatsOf(out), append(slices.Clone(tc.want), 7))
			sameBits(t, "reference", tc.want, refEmbedding(table, 3, tc.indices, tc.offsets, make([]float32, nbags*3)))
		})
	}
}

// TestEmbeddingBagSumParallel uses enough bags to split across goroutines.
func TestEmbeddingBagSumParallel(t *testing.T) {
	const rows, dim, nbags = 1000, 16, 600
	table := seq(rows*dim, 0.25)
	var indices, offsets []int32
	for b := range nbags {
		offsets = append(offsets, int32(len(indices)))
		for i := range b % 13 {
			indices = append(indices, int32((b*31+i*17)%rows))
		}
	}
	want := refEmbedding(table, dim, indices, offsets, make([]float32, nbags*dim))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 4} {
		runtime.GOMAXPROCS(procs)
		out := alloc(nbags * dim * 4)
		err := mustLookup(t, "embedding_bag_sum").Run([]Value{
			f32sArg(table...), i64Arg(rows), i64Arg(dim), i32sArg(indices...), i64Arg(int64(len(indices))),
			i32sArg(offsets...), i64Arg(nbags), bufArg(out)})
		if err != nil {
			t.Fatal(err)
		}
		sameBits(t, "out", floatsOf(out), want)
	}
}

// TestSumBagsRechecks feeds sumBags offsets and indices that checkBags would
// have refused, as a concurrent writer could leave them: it must fail, not
// panic.
func TestSumBagsRechecks(t *testing.T) {
	table, out := make([]float32, 6), make([]float32, 6)
	for _, tc := range []struct {
		name             string
		indices, offsets []int32
		want             string
	}{
		{"index too big", []int32{0, 3}, []int32{0, 1}, "bag 1: indices[1] changed during the launch to 3"},
		{"negative index", []int32{-1, 0}, []int32{0, 1}, "bag 0: indices[0] changed during the launch to -1"},
		{"offsets backwards", []int32{0, 1}, []int32{2, 1}, "bag 0: offsets changed during the launch to [2, 1)"},
		{"offset past nidx", []int32{0, 1}, []int32{0, 5}, "bag 0: offsets changed during the launch to [0, 5), nidx = 2"},
		{"negative offset", []int32{0, 1}, []int32{-1, 1}, "bag 0: offsets changed during the launch to [-1, 1)"},
	} {
		err := sumBags(out, table, tc.indices, tc.offsets, 2, 0, 2)
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: sumBags = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestParallelFor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 2, 5} {
		runtime.GOMAXPROCS(procs)
		for _, n := range []int{0, 1, 2, 7, 1000} {
			for _, cost := range []int{0, 1, minChunkWork / 3, minChunkWork} {
				hits := make([]atomic.Int32, n)
				var calls atomic.Int32
				err := parallelFor(n, cost, func(lo, hi int) error {
					calls.Add(1)
					for i := lo; i < hi; i++ {
						hits[i].Add(1)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				for i := range hits {
					if h := hits[i].Load(); h != 1 {
						t.Fatalf("procs %d n %d cost %d: item %d run %d times", procs, n, cost, i, h)
					}
				}
				if c := int(calls.Load()); c > procs || n*cost < 2*minChunkWork && c > 1 {
					t.Errorf("procs %d n %d cost %d: %d chunks", procs, n, cost, c)
				}
			}
		}
	}
}

func TestParallelForErrors(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(4)
	bad := errors.New("bad")
	err := parallelFor(4, minChunkWork, func(lo, hi int) error {
		if lo >= 1 {
			return bad
		}
		return nil
	})
	if !errors.Is(err, bad) {
		t.Fatalf("parallelFor = %v, want the chunk's error", err)
	}
	for _, panicky := range []int{0, 3} { // the caller's chunk and another's
		err = parallelFor(4, minChunkWork, func(lo, hi int) error {
			if lo == panicky {
				panic("boom")
			}
			return nil
		})
		if !errors.Is(err, api.ErrInternal) || !strings.Contains(err.Error(), "boom") {
			t.Fatalf("panic in chunk %d: parallelFor = %v, want ErrInternal", panicky, err)
		}
	}
}

// floats32 draws n floats of mixed magnitude, with exact zeros and
// negatives, so that rounding differences show.
func floats32(t *rapid.T, n int, label string) []float32 {
	return rapid.SliceOfN(rapid.OneOf(
		rapid.Float32Range(-4, 4),
		rapid.SampledFrom([]float32{0, 1, -1, 0.1, 1e7, -3e-7}),
	), n, n).Draw(t, label)
}

func TestSgemmProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := rapid.IntRange(0, 9).Draw(t, "m")
		n := rapid.IntRange(0, 9).Draw(t, "n")
		k := rapid.IntRange(0, 9).Draw(t, "k")
		alpha := floats32(t, 1, "alpha")[0]
		beta := floats32(t, 1, "beta")[0]
		a, b, c := floats32(t, m*k, "a"), floats32(t, k*n, "b"), floats32(t, m*n, "c")
		cb := f32Bytes(c...)
		err := mustLookup(t, "sgemm").Run([]Value{i64Arg(int64(m)), i64Arg(int64(n)), i64Arg(int64(k)), f32Arg(alpha),
			f32sArg(a...), f32sArg(b...), f32Arg(beta), bufArg(cb)})
		if err != nil {
			t.Fatal(err)
		}
		sameBits(t, "c", floatsOf(cb), refSgemm(m, n, k, alpha, a, b, beta, c))
	})
}

func TestSaxpyProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 40).Draw(t, "n")
		extra := rapid.IntRange(0, 3).Draw(t, "extra")
		a := floats32(t, 1, "a")[0]
		x, y := floats32(t, n+extra, "x"), floats32(t, n+extra, "y")
		yb := f32Bytes(y...)
		if err := mustLookup(t, "saxpy").Run([]Value{i64Arg(int64(n)), f32Arg(a), f32sArg(x...), bufArg(yb)}); err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(y)
		copy(want, refSaxpy(a, x[:n], y[:n]))
		sameBits(t, "y", floatsOf(yb), want)
	})
}

// randomBags draws 1 to 6 bags of 0 to maxSize indices each, of rows rows:
// their sizes, indices and offsets.
func randomBags(t *rapid.T, rows, maxSize int) (sizes []int, indices, offsets []int32) {
	sizes = rapid.SliceOfN(rapid.IntRange(0, maxSize), 1, 6).Draw(t, "bag sizes")
	for _, s := range sizes {
		offsets = append(offsets, int32(len(indices)))
		indices = append(indices, rapid.SliceOfN(rapid.Int32Range(0, int32(rows-1)), s, s).Draw(t, "bag")...)
	}
	return sizes, indices, offsets
}

func TestEmbeddingBagSumProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rows := rapid.IntRange(1, 6).Draw(t, "rows")
		dim := rapid.IntRange(1, 5).Draw(t, "dim")
		sizes, indices, offsets := randomBags(t, rows, 4)
		table := floats32(t, rows*dim, "table")
		out := f32Bytes(sevens(len(sizes) * dim)...)
		err := mustLookup(t, "embedding_bag_sum").Run([]Value{
			f32sArg(table...), i64Arg(int64(rows)), i64Arg(int64(dim)),
			i32sArg(indices...), i64Arg(int64(len(indices))),
			i32sArg(offsets...), i64Arg(int64(len(sizes))), bufArg(out)})
		if err != nil {
			t.Fatal(err)
		}
		sameBits(t, "out", floatsOf(out), refEmbedding(table, dim, indices, offsets, make([]float32, len(sizes)*dim)))
	})
}

// TestRunHostileArguments launches every kernel with random kinds, sizes
// (negative, huge, near the buffers' lengths) and buffers (short, long,
// misaligned, shared, holding random indices): Run must never panic, must
// fail only with ErrInvalidArgument, and must leave memory alone when it
// fails.
func TestRunHostileArguments(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.SampledFrom(all).Draw(t, "kernel")
		mem := alloc(256)
		for i := range mem {
			mem[i] = rapid.Byte().Draw(t, "byte")
		}
		sizes := rapid.OneOf(rapid.Int64Range(-2, 12), rapid.SampledFrom([]int64{1 << 31, 1 << 40, math.MaxInt64, math.MinInt64}))
		kinds := rapid.SampledFrom([]api.ArgKind{api.ArgBuffer, api.ArgI64, api.ArgF32})
		nargs := len(k.Info.Params)
		if rapid.IntRange(0, 9).Draw(t, "miscount") == 0 {
			nargs = rapid.IntRange(0, 10).Draw(t, "nargs")
		}
		args := make([]Value, nargs)
		for i := range args {
			kind := api.ArgKind(0)
			if i < len(k.Info.Params) {
				kind = k.Info.Params[i].Kind
			}
			if kind == 0 || rapid.IntRange(0, 19).Draw(t, "wrong kind") == 0 {
				kind = kinds.Draw(t, "kind")
			}
			args[i] = Value{Kind: kind, I64: sizes.Draw(t, "size"), F32: floats32(t, 1, "f32")[0]}
			if kind == api.ArgBuffer {
				lo := rapid.IntRange(0, len(mem)).Draw(t, "buffer start")
				args[i].Buf = mem[lo:rapid.IntRange(lo, len(mem)).Draw(t, "buffer end")]
			}
		}
		before := slices.Clone(mem)
		err := k.Run(args)
		if err != nil && api.CodeOf(err) != api.CodeInvalidArgument {
			t.Fatalf("Run = %v, want nil or ErrInvalidArgument", err)
		}
		if err != nil && !slices.Equal(mem, before) {
			t.Fatalf("failed launch (%v) wrote memory", err)
		}
	})
}

func TestSatMul(t *testing.T) {
	for _, tc := range []struct{ a, b, want int }{
		{0, math.MaxInt, 0},
		{3, 5, 15},
		{math.MaxInt, 1, math.MaxInt},
		{math.MaxInt/2 + 1, 2, math.MaxInt},
		{math.MaxInt / 3, 4, math.MaxInt},
	} {
		if got := satMul(tc.a, tc.b); got != tc.want {
			t.Errorf("satMul(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestViewAsRefusesUncheckedBuffers checks the last line of defence of the
// unsafe code: a caller that skipped the checks gets a panic, not a view of
// memory the buffer does not own.
func TestViewAsRefusesUncheckedBuffers(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		n    int
	}{
		{"short", alloc(7), 2},
		{"negative", alloc(8), -1},
		{"misaligned", misaligned(alloc(8)), 1},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: viewAs did not panic", tc.name)
				}
			}()
			viewAs[float32](tc.b, tc.n)
		}()
	}
}
