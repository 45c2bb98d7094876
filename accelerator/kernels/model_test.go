package kernels

import (
	"bytes"
	"fmt"
	"math"
	"math/big"
	"runtime"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
)

// The kernels for models against references written here the plain way,
// loop by loop in float64, calling nothing of the package. Where a
// kernel's Doc fixes every rounding (matmul, the norms, the layout kernels,
// add, mul, relu, argmax) the comparison is bit for bit; where it takes an
// exponential or erf, which the references take from Go's math package, it
// is within a tolerance stated with each case: 1 ulp of float32, plus, for
// gelu and attention, the error of the reference formula itself where a
// sum cancels.

// refCase is a launch with valid arguments and what the reference says
// its output argument holds afterwards.
type refCase struct {
	args []Value
	out  int       // the argument the kernel writes
	want []float64 // its first len(want) elements; bytes past them stay
	i32  bool      // out holds int32
	// tol is the allowed |got - want| of element i beyond 1 ulp of
	// float32; nil means bit for bit.
	tol func(i int) float64
}

// outF32 is an output buffer of n floats and a sentinel, all 7.
func outF32(n int) Value { return f32sArg(sevens(n + 1)...) }

func widen(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// ulp32 is the gap between |w| rounded to float32 and the next float32.
func ulp32(w float64) float64 {
	a := float32(math.Abs(w))
	return float64(math.Nextafter32(a, float32(math.Inf(1))) - a)
}

// check compares the output got, which began as before, with c.want.
func (c refCase) check(t tb, got, before []byte) {
	t.Helper()
	n := 4 * len(c.want)
	if !bytes.Equal(got[n:], before[n:]) {
		t.Fatalf("the kernel wrote past its %d output elements", len(c.want))
	}
	if c.i32 {
		for i, w := range c.want {
			if g := int32(uint32(got[4*i]) | uint32(got[4*i+1])<<8 | uint32(got[4*i+2])<<16 | uint32(got[4*i+3])<<24); int64(g) != int64(w) {
				t.Fatalf("out[%d] = %d, want %v", i, g, w)
			}
		}
		return
	}
	gs := floatsOf(got[:n])
	if c.tol == nil {
		want := make([]float32, len(c.want))
		for i, w := range c.want {
			want[i] = float32(w)
		}
		sameBits(t, "out", gs, want)
		return
	}
	for i, w := range c.want {
		g := float64(gs[i])
		if g != g && w != w || g == w {
			continue
		}
		if d := math.Abs(g - w); !(d <= ulp32(w)+c.tol(i)) {
			t.Fatalf("out[%d] = %v, want %v within %g + %g", i, gs[i], w, ulp32(w), c.tol(i))
		}
	}
}

// ulp1 is the tolerance of a result computed like its reference in
// float64 and rounded once: 1 ulp of float32, nothing more.
func ulp1(int) float64 { return 0 }

// ulp1Of is ulp1 for unaryCase.
func ulp1Of(float64) float64 { return 0 }

func refMatmul(batch, m, n, k int, transA, transB bool, bBatch int, a, b []float32) []float64 {
	out := make([]float64, batch*m*n)
	for i := 0; i < batch; i++ {
		bi := i
		if bBatch == 1 {
			bi = 0
		}
		for r := 0; r < m; r++ {
			for j := 0; j < n; j++ {
				var s float32
				for p := 0; p < k; p++ {
					av := a[i*m*k+r*k+p]
					if transA {
						av = a[i*m*k+p*m+r]
					}
					bv := b[bi*k*n+p*n+j]
					if transB {
						bv = b[bi*k*n+j*k+p]
					}
					s += float32(av * bv)
				}
				out[(i*m+r)*n+j] = float64(s)
			}
		}
	}
	return out
}

func matmulCase(batch, m, n, k int, transA, transB bool, bBatch int, a, b []float32) refCase {
	flag := func(b bool) int64 {
		if b {
			return 1
		}
		return 0
	}
	return refCase{
		args: []Value{i64Arg(int64(batch)), i64Arg(int64(m)), i64Arg(int64(n)), i64Arg(int64(k)),
			i64Arg(flag(transA)), i64Arg(flag(transB)), i64Arg(int64(bBatch)),
			f32sArg(a...), f32sArg(b...), outF32(batch * m * n)},
		out: 9, want: refMatmul(batch, m, n, k, transA, transB, bBatch, a, b),
	}
}

func binaryCase(product bool, rows, cols, bRows int, a, b []float32) refCase {
	want := make([]float64, rows*cols)
	for r := 0; r < rows; r++ {
		for j := 0; j < cols; j++ {
			bv := b[j]
			if bRows != 1 {
				bv = b[r*cols+j]
			}
			if product {
				want[r*cols+j] = float64(a[r*cols+j] * bv)
			} else {
				want[r*cols+j] = float64(a[r*cols+j] + bv)
			}
		}
	}
	return refCase{args: []Value{i64Arg(int64(rows)), i64Arg(int64(cols)), i64Arg(int64(bRows)),
		f32sArg(a...), f32sArg(b...), outF32(rows * cols)}, out: 5, want: want}
}

// unaryCase applies ref to x; approximate, if not nil, is gelu's flag.
func unaryCase(x []float32, approximate []int64, ref func(float64) float64, tol func(x float64) float64) refCase {
	args := []Value{i64Arg(int64(len(x)))}
	for _, a := range approximate {
		args = append(args, i64Arg(a))
	}
	want := make([]float64, len(x))
	for i, v := range x {
		want[i] = ref(float64(v))
	}
	c := refCase{args: append(args, f32sArg(x...), outF32(len(x))), out: len(args) + 1, want: want}
	if tol != nil {
		c.tol = func(i int) float64 { return tol(float64(x[i])) }
	}
	return c
}

func refRelu(x float64) float64 {
	if x > 0 || math.IsNaN(x) {
		return x
	}
	return 0
}

func refSilu(x float64) float64 { return x / (1 + math.Exp(-x)) }

func refGeluErf(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

func refGeluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// geluTol is the error of the references' 1 + erf(…) and 1 + tanh(…),
// which cancel for negative x: a few ulp of 1, times x/2.
func geluTol(x float64) float64 { return math.Abs(x) * 0x1p-50 }

func softmaxCase(rows, cols, q int, causal bool, offset int, scale float32, x []float32) refCase {
	want := make([]float64, rows*cols)
	for r := 0; r < rows; r++ {
		keep := cols
		if causal {
			keep = min(cols, r%q+offset+1)
		}
		m := math.Inf(-1)
		for j := 0; j < keep; j++ {
			m = math.Max(m, float64(scale)*float64(x[r*cols+j]))
		}
		var sum float64
		for j := 0; j < keep; j++ {
			want[r*cols+j] = math.Exp(float64(scale)*float64(x[r*cols+j]) - m)
			sum += want[r*cols+j]
		}
		for j := 0; j < keep; j++ {
			want[r*cols+j] /= sum
		}
	}
	causalArg := int64(0)
	if causal {
		causalArg = 1
	}
	return refCase{args: []Value{i64Arg(int64(rows)), i64Arg(int64(cols)), i64Arg(int64(q)), i64Arg(causalArg),
		i64Arg(int64(offset)), f32Arg(scale), f32sArg(x...), outF32(rows * cols)},
		out: 7, want: want, tol: ulp1}
}

// normCase is layer_norm, or rms_norm when beta is nil.
func normCase(rows, cols int, eps float32, x, gamma, beta []float32) refCase {
	want := make([]float64, rows*cols)
	n := float64(cols)
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		if beta == nil {
			var ms float64
			for _, v := range row {
				ms += float64(v) * float64(v)
			}
			ms /= n
			for j, v := range row {
				want[r*cols+j] = float64(float32(float64(v) / math.Sqrt(ms+float64(eps)) * float64(gamma[j])))
			}
			continue
		}
		var mean, variance float64
		for _, v := range row {
			mean += float64(v)
		}
		mean /= n
		for _, v := range row {
			d := float64(v) - mean
			variance += float64(d * d)
		}
		variance /= n
		for j, v := range row {
			y := (float64(v) - mean) / math.Sqrt(variance+float64(eps))
			want[r*cols+j] = float64(float32(float64(y*float64(gamma[j])) + float64(beta[j])))
		}
	}
	args := []Value{i64Arg(int64(rows)), i64Arg(int64(cols)), f32Arg(eps), f32sArg(x...), f32sArg(gamma...)}
	if beta != nil {
		args = append(args, f32sArg(beta...))
	}
	return refCase{args: append(args, outF32(rows*cols)), out: len(args), want: want}
}

func gatherCase(vocab, dim int, ids []int32, table []float32) refCase {
	var want []float64
	for _, id := range ids {
		want = append(want, widen(table[int(id)*dim:int(id+1)*dim])...)
	}
	return refCase{args: []Value{i64Arg(int64(len(ids))), i64Arg(int64(vocab)), i64Arg(int64(dim)),
		i32sArg(ids...), f32sArg(table...), outF32(len(ids) * dim)}, out: 5, want: want}
}

func permuteCase(d, p [4]int, x []float32) refCase {
	od := [4]int{d[p[0]], d[p[1]], d[p[2]], d[p[3]]}
	want := make([]float64, len(x))
	var at [4]int // an index of x
	for i0 := 0; i0 < od[0]; i0++ {
		for i1 := 0; i1 < od[1]; i1++ {
			for i2 := 0; i2 < od[2]; i2++ {
				for i3 := 0; i3 < od[3]; i3++ {
					at[p[0]], at[p[1]], at[p[2]], at[p[3]] = i0, i1, i2, i3
					src := ((at[0]*d[1]+at[1])*d[2]+at[2])*d[3] + at[3]
					want[((i0*od[1]+i1)*od[2]+i2)*od[3]+i3] = float64(x[src])
				}
			}
		}
	}
	var args []Value
	for _, v := range append(d[:], p[:]...) {
		args = append(args, i64Arg(int64(v)))
	}
	return refCase{args: append(args, f32sArg(x...), outF32(len(x))), out: 9, want: want}
}

func sliceCase(outer, mid, inner, start, n int, src []float32) refCase {
	var want []float64
	for o := 0; o < outer; o++ {
		want = append(want, widen(src[(o*mid+start)*inner:(o*mid+start+n)*inner])...)
	}
	return refCase{args: []Value{i64Arg(int64(outer)), i64Arg(int64(mid)), i64Arg(int64(inner)), i64Arg(int64(start)),
		i64Arg(int64(n)), f32sArg(src...), outF32(outer * n * inner)}, out: 6, want: want}
}

func concatCase(outer, midA, midB, inner int, a, b []float32) refCase {
	var want []float64
	for o := 0; o < outer; o++ {
		want = append(want, widen(a[o*midA*inner:(o+1)*midA*inner])...)
		want = append(want, widen(b[o*midB*inner:(o+1)*midB*inner])...)
	}
	mid := midA + midB
	return refCase{args: []Value{i64Arg(int64(outer)), i64Arg(int64(midA)), i64Arg(int64(midB)), i64Arg(int64(mid)),
		i64Arg(int64(inner)), f32sArg(a...), f32sArg(b...), outF32(outer * mid * inner)}, out: 7, want: want}
}

func kvAppendCase(outer, capacity, n, inner, pos int, src, cache []float32) refCase {
	want := widen(cache)
	for o := 0; o < outer; o++ {
		for j := 0; j < n; j++ {
			for c := 0; c < inner; c++ {
				want[(o*capacity+pos+j)*inner+c] = float64(src[(o*n+j)*inner+c])
			}
		}
	}
	return refCase{args: []Value{i64Arg(int64(outer)), i64Arg(int64(capacity)), i64Arg(int64(n)), i64Arg(int64(inner)),
		i64Arg(int64(pos)), f32sArg(src...), f32sArg(append(slices.Clone(cache), 7)...)}, out: 6, want: want}
}

func attentionCase(heads, t, d, capacity, pos int, causal bool, scale float32, q, k, v []float32) refCase {
	want := make([]float64, heads*t*d)
	mag := make([]float64, heads*t*d) // the sum of |terms|, for the tolerance
	for h := 0; h < heads; h++ {
		for i := 0; i < t; i++ {
			keys := pos + t
			if causal {
				keys = pos + i + 1
			}
			w := make([]float64, keys)
			m := math.Inf(-1)
			for j := range w {
				var dot float64
				for c := 0; c < d; c++ {
					dot += float64(q[(h*t+i)*d+c]) * float64(k[(h*capacity+j)*d+c])
				}
				w[j] = float64(scale) * dot
				m = math.Max(m, w[j])
			}
			var sum float64
			for j := range w {
				w[j] = math.Exp(w[j] - m)
				sum += w[j]
			}
			for c := 0; c < d; c++ {
				var acc, abs float64
				for j := range w {
					acc += float64(w[j] * float64(v[(h*capacity+j)*d+c]))
					abs += math.Abs(w[j] * float64(v[(h*capacity+j)*d+c]))
				}
				want[(h*t+i)*d+c], mag[(h*t+i)*d+c] = acc/sum, abs/sum
			}
		}
	}
	causalArg := int64(0)
	if causal {
		causalArg = 1
	}
	return refCase{
		args: []Value{i64Arg(int64(heads)), i64Arg(int64(t)), i64Arg(int64(d)), i64Arg(int64(capacity)), i64Arg(int64(pos)),
			i64Arg(causalArg), f32Arg(scale), f32sArg(q...), f32sArg(k...), f32sArg(v...), outF32(heads * t * d)},
		out: 10, want: want,
		// The exponentials may differ by an ulp of float64 each; where the
		// weighted sum cancels, that shows relative to its terms.
		tol: func(i int) float64 { return mag[i] * 0x1p-44 },
	}
}

func argmaxCase(rows, cols int, x []float32) refCase {
	want := make([]float64, rows)
	for r := 0; r < rows; r++ {
		best := 0
		for j := 1; j < cols; j++ {
			b, v := x[r*cols+best], x[r*cols+j]
			if b != b {
				break
			}
			if v != v || v > b {
				best = j
			}
		}
		want[r] = float64(best)
	}
	return refCase{args: []Value{i64Arg(int64(rows)), i64Arg(int64(cols)), f32sArg(x...), outF32(rows)},
		out: 3, want: want, i32: true}
}

// specials32 draws n floats like floats32, with NaNs, infinities and
// signed zeros among them.
func specials32(t *rapid.T, n int, label string) []float32 {
	inf := float32(math.Inf(1))
	return rapid.SliceOfN(rapid.OneOf(
		rapid.Float32Range(-4, 4),
		rapid.SampledFrom([]float32{0, float32(math.Copysign(0, -1)), 1, -1, 3, inf, -inf, float32(math.NaN())}),
	), n, n).Draw(t, label)
}

// refCases draws a launch of each kernel for models: small random shapes
// (often empty), data of mixed magnitude.
var refCases = []struct {
	kernel string
	draw   func(t *rapid.T) refCase
}{
	{"matmul", func(t *rapid.T) refCase {
		batch := rapid.IntRange(0, 3).Draw(t, "batch")
		m, n, k := rapid.IntRange(0, 6).Draw(t, "m"), rapid.IntRange(0, 9).Draw(t, "n"), rapid.IntRange(0, 9).Draw(t, "k")
		bBatch := rapid.SampledFrom([]int{1, batch}).Draw(t, "b_batch")
		return matmulCase(batch, m, n, k, rapid.Bool().Draw(t, "trans_a"), rapid.Bool().Draw(t, "trans_b"), bBatch,
			floats32(t, batch*m*k, "a"), floats32(t, bBatch*k*n, "b"))
	}},
	{"add", func(t *rapid.T) refCase { return drawBinary(t, false) }},
	{"mul", func(t *rapid.T) refCase { return drawBinary(t, true) }},
	{"relu", func(t *rapid.T) refCase {
		return unaryCase(specials32(t, rapid.IntRange(0, 20).Draw(t, "n"), "x"), nil, refRelu, nil)
	}},
	{"silu", func(t *rapid.T) refCase {
		return unaryCase(floats32(t, rapid.IntRange(0, 20).Draw(t, "n"), "x"), nil, refSilu, ulp1Of)
	}},
	{"gelu", func(t *rapid.T) refCase {
		x := wide32(t, rapid.IntRange(0, 20).Draw(t, "n"), "x")
		if rapid.Bool().Draw(t, "tanh") {
			return unaryCase(x, []int64{1}, refGeluTanh, geluTol)
		}
		return unaryCase(x, []int64{0}, refGeluErf, geluTol)
	}},
	{"softmax", func(t *rapid.T) refCase {
		q := rapid.IntRange(1, 4).Draw(t, "q")
		rows, cols := q*rapid.IntRange(0, 3).Draw(t, "blocks"), rapid.IntRange(0, 9).Draw(t, "cols")
		return softmaxCase(rows, cols, q, rapid.Bool().Draw(t, "causal"), rapid.IntRange(0, 10).Draw(t, "offset"),
			rapid.SampledFrom([]float32{1, 0.125, -2, 0}).Draw(t, "scale"), wide32(t, rows*cols, "x"))
	}},
	{"layer_norm", func(t *rapid.T) refCase {
		rows, cols := rapid.IntRange(0, 4).Draw(t, "rows"), rapid.IntRange(0, 9).Draw(t, "cols")
		return normCase(rows, cols, rapid.SampledFrom([]float32{0, 1e-5, 0.5}).Draw(t, "eps"),
			floats32(t, rows*cols, "x"), floats32(t, cols, "gamma"), floats32(t, cols, "beta"))
	}},
	{"rms_norm", func(t *rapid.T) refCase {
		rows, cols := rapid.IntRange(0, 4).Draw(t, "rows"), rapid.IntRange(0, 9).Draw(t, "cols")
		return normCase(rows, cols, rapid.SampledFrom([]float32{0, 1e-6, 0.5}).Draw(t, "eps"),
			floats32(t, rows*cols, "x"), floats32(t, cols, "gamma"), nil)
	}},
	{"embedding", func(t *rapid.T) refCase {
		vocab, dim := rapid.IntRange(1, 6).Draw(t, "vocab"), rapid.IntRange(0, 5).Draw(t, "dim")
		ids := rapid.SliceOfN(rapid.Int32Range(0, int32(vocab-1)), 0, 8).Draw(t, "ids")
		return gatherCase(vocab, dim, ids, floats32(t, vocab*dim, "table"))
	}},
	{"permute", func(t *rapid.T) refCase {
		var d [4]int
		for i := range d {
			d[i] = rapid.IntRange(0, 4).Draw(t, "d")
		}
		p := rapid.Permutation([]int{0, 1, 2, 3}).Draw(t, "p")
		return permuteCase(d, [4]int(p), floats32(t, d[0]*d[1]*d[2]*d[3], "x"))
	}},
	{"slice", func(t *rapid.T) refCase {
		outer, mid, inner := rapid.IntRange(0, 3).Draw(t, "outer"), rapid.IntRange(0, 6).Draw(t, "mid"), rapid.IntRange(0, 4).Draw(t, "inner")
		start := rapid.IntRange(0, mid).Draw(t, "start")
		return sliceCase(outer, mid, inner, start, rapid.IntRange(0, mid-start).Draw(t, "len"), floats32(t, outer*mid*inner, "src"))
	}},
	{"concat", func(t *rapid.T) refCase {
		outer, midA, midB := rapid.IntRange(0, 3).Draw(t, "outer"), rapid.IntRange(0, 4).Draw(t, "mid_a"), rapid.IntRange(0, 4).Draw(t, "mid_b")
		inner := rapid.IntRange(0, 4).Draw(t, "inner")
		return concatCase(outer, midA, midB, inner, floats32(t, outer*midA*inner, "a"), floats32(t, outer*midB*inner, "b"))
	}},
	{"kv_append", func(t *rapid.T) refCase {
		outer, capacity, inner := rapid.IntRange(0, 3).Draw(t, "outer"), rapid.IntRange(0, 6).Draw(t, "cap"), rapid.IntRange(0, 4).Draw(t, "inner")
		pos := rapid.IntRange(0, capacity).Draw(t, "pos")
		n := rapid.IntRange(0, capacity-pos).Draw(t, "len")
		return kvAppendCase(outer, capacity, n, inner, pos, floats32(t, outer*n*inner, "src"), floats32(t, outer*capacity*inner, "cache"))
	}},
	{"attention", func(t *rapid.T) refCase {
		heads, tq, d := rapid.IntRange(0, 3).Draw(t, "heads"), rapid.IntRange(0, 4).Draw(t, "t"), rapid.IntRange(0, 5).Draw(t, "d")
		capacity := rapid.IntRange(tq, tq+5).Draw(t, "cap")
		pos := rapid.IntRange(0, capacity-tq).Draw(t, "pos")
		return attentionCase(heads, tq, d, capacity, pos, rapid.Bool().Draw(t, "causal"),
			rapid.SampledFrom([]float32{1, 0.35355339, -0.5}).Draw(t, "scale"),
			floats32(t, heads*tq*d, "q"), floats32(t, heads*capacity*d, "k"), floats32(t, heads*capacity*d, "v"))
	}},
	{"argmax", func(t *rapid.T) refCase {
		rows, cols := rapid.IntRange(0, 4).Draw(t, "rows"), rapid.IntRange(1, 7).Draw(t, "cols")
		x := specials32(t, rows*cols, "x")
		if rapid.Bool().Draw(t, "ties") { // few values, many ties
			for i := range x {
				x[i] = float32(int(x[i]) % 2)
			}
		}
		return argmaxCase(rows, cols, x)
	}},
}

// wide32 draws n floats like floats32, and large ones, where the
// exponentials of gelu and softmax saturate.
func wide32(t *rapid.T, n int, label string) []float32 {
	return rapid.SliceOfN(rapid.OneOf(rapid.Float32Range(-4, 4), rapid.Float32Range(-200, 200),
		rapid.SampledFrom([]float32{0, -1e30, 1e30, 12, -12, 5e-30})), n, n).Draw(t, label)
}

func drawBinary(t *rapid.T, product bool) refCase {
	rows, cols := rapid.IntRange(0, 4).Draw(t, "rows"), rapid.IntRange(0, 6).Draw(t, "cols")
	bRows := rapid.SampledFrom([]int{1, rows}).Draw(t, "b_rows")
	return binaryCase(product, rows, cols, bRows, specials32(t, rows*cols, "a"), specials32(t, bRows*cols, "b"))
}

// cloneArgs copies args with fresh, aligned buffers.
func cloneArgs(args []Value) []Value {
	out := slices.Clone(args)
	for i, a := range out {
		if a.Kind == api.ArgBuffer {
			out[i].Buf = alloc(len(a.Buf))
			copy(out[i].Buf, a.Buf)
		}
	}
	return out
}

// runRefCase runs c whole with Run and in slices of maxWork over workers,
// and checks both against the reference and each other; inputs must stay
// as they were.
func runRefCase(t tb, k *Kernel, c refCase, maxWork, workers int) {
	t.Helper()
	whole := cloneArgs(c.args)
	if err := k.Run(whole); err != nil {
		t.Fatalf("Run: %v", err)
	}
	c.check(t, whole[c.out].Buf, c.args[c.out].Buf)
	for i, a := range whole {
		if i != c.out && !bytes.Equal(a.Buf, c.args[i].Buf) {
			t.Fatalf("input %d (%s) written", i, k.Info.Params[i].Name)
		}
	}
	sliced := cloneArgs(c.args)
	if _, err := runPlan(k, sliced, maxWork, workers); err != nil {
		t.Fatalf("in slices of %d: %v", maxWork, err)
	}
	if !bytes.Equal(sliced[c.out].Buf, whole[c.out].Buf) {
		t.Fatalf("in slices of %d on %d workers the kernel wrote other bytes than Run", maxWork, workers)
	}
}

func TestModelKernelsMatchReferences(t *testing.T) {
	for _, rc := range refCases {
		t.Run(rc.kernel, func(t *testing.T) {
			k := mustLookup(t, rc.kernel)
			rapid.Check(t, func(t *rapid.T) {
				runRefCase(t, k, rc.draw(t), rapid.IntRange(1, 64).Draw(t, "max work"), rapid.IntRange(0, 3).Draw(t, "workers"))
			})
		})
	}
}

// TestModelKernelsLarge runs the parallel kernels on shapes big enough to
// split across goroutines, under several GOMAXPROCS, and the others on
// shapes of many slices, against the references, in slices of several
// sizes.
func TestModelKernelsLarge(t *testing.T) {
	const d = 32
	x := func(n int, step float32) []float32 { return seq(n, step) }
	ids := make([]int32, 300)
	for i := range ids {
		ids[i] = int32(i * 7919 % 1000)
	}
	cases := []struct {
		kernel string
		c      refCase
	}{
		{"matmul", matmulCase(2, 67, 129, 61, false, false, 1, x(2*67*61, 0.01), x(61*129, 0.03))},
		{"matmul", matmulCase(2, 67, 129, 61, true, true, 2, x(2*67*61, 0.01), x(2*61*129, 0.03))},
		{"matmul", matmulCase(1, 1, 1000, 256, false, true, 1, x(256, 0.01), x(1000*256, 0.03))},
		{"softmax", softmaxCase(300, 301, 100, true, 200, 0.125, x(300*301, 0.9))},
		{"layer_norm", normCase(300, 257, 1e-5, x(300*257, 0.3), x(257, 0.1), x(257, 0.2))},
		{"rms_norm", normCase(300, 257, 1e-6, x(300*257, 0.3), x(257, 0.1), nil)},
		{"attention", attentionCase(4, 64, d, 160, 90, true, 0.17677669, x(4*64*d, 0.05), x(4*160*d, 0.04), x(4*160*d, 0.3))},
		{"attention", attentionCase(2, 64, d, 64, 0, false, 0.17677669, x(2*64*d, 0.05), x(2*64*d, 0.04), x(2*64*d, 0.3))},
		{"gelu", unaryCase(x(10001, 0.7), []int64{0}, refGeluErf, geluTol)},
		{"embedding", gatherCase(1000, 33, ids, x(1000*33, 0.1))},
		{"permute", permuteCase([4]int{3, 17, 5, 19}, [4]int{2, 0, 3, 1}, x(3*17*5*19, 0.1))},
		{"argmax", argmaxCase(7, 5000, x(7*5000, 0.1))},
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range cases {
		k := mustLookup(t, tc.kernel)
		for i, procs := range []int{1, 2, 3, 8} {
			runtime.GOMAXPROCS(procs)
			runRefCase(t, k, tc.c, []int{1, 100, 4096, 1 << 18}[i], procs-1)
		}
		if p, err := k.Plan(cloneArgs(tc.c.args), 100); err != nil || p.Len() < 10 {
			t.Errorf("%s: %v in slices of 100", tc.kernel, err)
		}
	}
}

// TestElementwiseInPlace runs each elementwise kernel with out the same
// elements as an input.
func TestElementwiseInPlace(t *testing.T) {
	a, b := []float32{1, -2, 3.5, -0.25, 6, 0}, []float32{0.5, 4, -1}
	for _, tc := range []struct {
		kernel string
		c      refCase
		in     int // the input out is
	}{
		{"add", binaryCase(false, 2, 3, 1, a, b), 3},
		{"mul", binaryCase(true, 2, 3, 2, a, append(b, b...)), 4},
		{"relu", unaryCase(a, nil, refRelu, nil), 1},
		{"silu", unaryCase(a, nil, refSilu, ulp1Of), 1},
		{"gelu", unaryCase(a, []int64{1}, refGeluTanh, geluTol), 2},
	} {
		args := cloneArgs(tc.c.args)
		args[tc.c.out] = args[tc.in]
		before := bytes.Clone(args[tc.in].Buf)
		if err := mustLookup(t, tc.kernel).Run(args); err != nil {
			t.Fatalf("%s in place: %v", tc.kernel, err)
		}
		tc.c.check(t, args[tc.in].Buf, before)
	}
}

func TestModelKernelExamples(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name   string
		kernel string
		args   []Value
		out    int
		want   []float32
	}{
		{"matmul 2x2 by a shared b", "matmul", []Value{i64Arg(2), i64Arg(1), i64Arg(2), i64Arg(2), i64Arg(0), i64Arg(0), i64Arg(1),
			f32sArg(1, 2, 3, 4), f32sArg(1, 0, 0, 10), outF32(4)}, 9, []float32{1, 20, 3, 40, 7}},
		{"matmul trans_b", "matmul", []Value{i64Arg(1), i64Arg(1), i64Arg(2), i64Arg(2), i64Arg(0), i64Arg(1), i64Arg(1),
			f32sArg(1, 2), f32sArg(1, 10, 100, 1000), outF32(2)}, 9, []float32{21, 2100, 7}},
		{"matmul k 0 gives zeros", "matmul", []Value{i64Arg(1), i64Arg(1), i64Arg(2), i64Arg(0), i64Arg(0), i64Arg(0), i64Arg(1),
			f32sArg(), f32sArg(), outF32(2)}, 9, []float32{0, 0, 7}},
		{"softmax causal", "softmax", []Value{i64Arg(2), i64Arg(3), i64Arg(2), i64Arg(1), i64Arg(0), f32Arg(1),
			f32sArg(5, 1, 1, 0, 0, 9), outF32(6)}, 7, []float32{1, 0, 0, 0.5, 0.5, 0, 7}},
		{"softmax NaN row", "softmax", []Value{i64Arg(2), i64Arg(2), i64Arg(1), i64Arg(0), i64Arg(0), f32Arg(1),
			f32sArg(0, nan, 1, 1), outF32(4)}, 7, []float32{nan, nan, 0.5, 0.5, 7}},
		{"softmax -inf is 0", "softmax", []Value{i64Arg(1), i64Arg(2), i64Arg(1), i64Arg(0), i64Arg(0), f32Arg(1),
			f32sArg(-inf, 3), outF32(2)}, 7, []float32{0, 1, 7}},
		{"layer_norm", "layer_norm", []Value{i64Arg(1), i64Arg(2), f32Arg(0), f32sArg(1, 3), f32sArg(2, 2), f32sArg(0, 1), outF32(2)},
			6, []float32{-2, 3, 7}},
		{"rms_norm", "rms_norm", []Value{i64Arg(1), i64Arg(2), f32Arg(0), f32sArg(3, 4), f32sArg(1, 2), outF32(2)},
			5, []float32{float32(3 / math.Sqrt(12.5)), float32(8 / math.Sqrt(12.5)), 7}},
		{"relu NaN and -0", "relu", []Value{i64Arg(3), f32sArg(nan, float32(math.Copysign(0, -1)), -inf), outF32(3)}, 2, []float32{nan, 0, 0, 7}},
		{"gelu erf of 1", "gelu", []Value{i64Arg(1), i64Arg(0), f32sArg(1), outF32(1)}, 3, []float32{0.8413447460685429, 7}},
		{"kv_append at the end", "kv_append", []Value{i64Arg(1), i64Arg(3), i64Arg(1), i64Arg(2), i64Arg(2),
			f32sArg(8, 9), f32sArg(1, 2, 3, 4, 5, 6)}, 6, []float32{1, 2, 3, 4, 8, 9}},
		{"permute a matrix", "permute", []Value{i64Arg(1), i64Arg(1), i64Arg(2), i64Arg(3), i64Arg(0), i64Arg(1), i64Arg(3), i64Arg(2),
			f32sArg(1, 2, 3, 4, 5, 6), outF32(6)}, 9, []float32{1, 4, 2, 5, 3, 6, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := mustLookup(t, tc.kernel).Run(tc.args); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "out", floatsOf(tc.args[tc.out].Buf), tc.want)
		})
	}
}

func TestArgmaxExamples(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	x := []float32{1, 3, 3, 2, -inf, -inf, -inf, -inf, 0, nan, inf, nan, float32(math.Copysign(0, -1)), 0, 0, -1}
	out := i32Bytes(7, 7, 7, 7, 7)
	if err := mustLookup(t, "argmax").Run([]Value{i64Arg(4), i64Arg(4), f32sArg(x...), bufArg(out)}); err != nil {
		t.Fatal(err)
	}
	if want := i32Bytes(1, 0, 1, 0, 7); !bytes.Equal(out, want) {
		t.Fatalf("argmax = %v, want %v", out, want)
	}
}

// TestAttentionDecodeMatchesPrefill checks the KV-cache promise the
// decoder relies on: the last query of a causal prefill over t positions
// and a decode step of one query at pos = t-1 see the same keys and give
// the same bits.
func TestAttentionDecodeMatchesPrefill(t *testing.T) {
	const heads, tq, d, capacity = 2, 5, 4, 8
	q, k, v := seq(heads*tq*d, 0.3), seq(heads*capacity*d, 0.2), seq(heads*capacity*d, 0.7)
	prefill := attentionCase(heads, tq, d, capacity, 0, true, 0.5, q, k, v)
	if err := mustLookup(t, "attention").Run(prefill.args); err != nil {
		t.Fatal(err)
	}
	full := floatsOf(prefill.args[10].Buf)
	var last []float32
	for h := range heads {
		last = append(last, q[(h*tq+tq-1)*d:(h*tq+tq)*d]...)
	}
	step := attentionCase(heads, 1, d, capacity, tq-1, true, 0.5, last, k, v)
	if err := mustLookup(t, "attention").Run(step.args); err != nil {
		t.Fatal(err)
	}
	got := floatsOf(step.args[10].Buf)
	for h := range heads {
		sameBits(t, "decode", got[h*d:(h+1)*d], full[(h*tq+tq-1)*d:(h*tq+tq)*d])
	}
}

// TestExpAndErfMatchMath checks the package's portable exp against e^x
// computed to 256 bits (within 1 ulp, as msun's is), and erf against Go's
// (within 2 ulp: its large-argument branch takes two exponentials, and
// Go's math.Exp on amd64 is its own assembly, not always within 1 ulp —
// exp(148) is 1.3 ulp below e^148 — so the two exps may differ by 2 ulp).
func TestExpAndErfMatchMath(t *testing.T) {
	ulps := func(a, b float64) uint64 {
		if a == b || a != a && b != b {
			return 0
		}
		if math.Signbit(a) != math.Signbit(b) {
			return math.MaxUint64
		}
		x, y := math.Float64bits(a), math.Float64bits(b)
		return max(x, y) - min(x, y)
	}
	checkExp := func(x float64) string {
		if e := expUlpError(x); e > 1 {
			return fmt.Sprintf("exp(%v) = %v: %.2f ulp from e^x", x, exp(x), e)
		}
		return ""
	}
	for _, x := range []float64{0, math.Copysign(0, -1), 1, -1, 1e-300, 0x1p-29, -0x1p-29, 709, 709.79, -745.13, -745.14,
		math.Inf(1), math.Inf(-1), math.NaN(), 0.5, 0.84375, 1.25, 1 / 0.35, 6, -6, 27, 5.9999, 148} {
		if msg := checkExp(x); msg != "" {
			t.Error(msg)
		}
		if u := ulps(erf(x), math.Erf(x)); u > 2 {
			t.Errorf("erf(%v) = %v, math.Erf: %v", x, erf(x), math.Erf(x))
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		x := rapid.Float64Range(-750, 709).Draw(t, "x")
		if msg := checkExp(x); msg != "" {
			t.Fatal(msg)
		}
		x = rapid.Float64Range(-8, 8).Draw(t, "erf x")
		if u := ulps(erf(x), math.Erf(x)); u > 2 {
			t.Fatalf("erf(%v) = %v, math.Erf: %v (%d ulp)", x, erf(x), math.Erf(x), u)
		}
	})
}

// The reference for exp catches an exp a little off: math.Exp itself is
// 1.3 ulp off at 148, and so is an exp whose result is scaled by one ulp.
func TestExpUlpErrorCatchesAnUlp(t *testing.T) {
	if e := ulpError(math.Exp(148), exactExp(148)); e < 1.2 || e > 1.4 {
		t.Errorf("math.Exp(148): %.2f ulp from e^148, want about 1.3", e)
	}
	off := math.Nextafter(math.Nextafter(exp(2), 0), 0)
	if e := ulpError(off, exactExp(2)); e <= 1 {
		t.Errorf("exp(2) two ulp down: %.2f ulp from e^2, want more than 1", e)
	}
}

// expUlpError is how far exp(x) is from e^x, in ulps of exp(x); 0 where
// e^x is beyond float64's range and exp(x) says so (±Inf, 0).
func expUlpError(x float64) float64 {
	got := exp(x)
	switch {
	case x != x:
		if got == got {
			return math.Inf(1)
		}
		return 0
	case math.IsInf(x, 1) || x > 709.782712893384:
		if math.IsInf(got, 1) {
			return 0
		}
		return math.Inf(1)
	case math.IsInf(x, -1):
		if got == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return ulpError(got, exactExp(x))
}

// ulpError is |got - want| in ulps of got (of the smallest subnormal for 0).
func ulpError(got float64, want *big.Float) float64 {
	ulp := math.Nextafter(math.Abs(got), math.Inf(1)) - math.Abs(got)
	d := new(big.Float).SetPrec(want.Prec()).SetFloat64(got)
	d.Sub(d, want).Abs(d)
	e, _ := d.Quo(d, new(big.Float).SetFloat64(ulp)).Float64()
	return e
}

// exactExp is e^x to 256 bits: x halved until under 2^-8, the Taylor
// series summed until its terms fall below 2^-300, then squared back.
func exactExp(x float64) *big.Float {
	const prec = 256
	z := new(big.Float).SetPrec(prec).SetFloat64(x)
	halvings := 0
	for z.Sign() != 0 && z.MantExp(nil) > -8 {
		z.SetMantExp(z, -1)
		halvings++
	}
	sum := new(big.Float).SetPrec(prec).SetInt64(1)
	term := new(big.Float).SetPrec(prec).SetInt64(1)
	for n := int64(1); term.Sign() != 0 && term.MantExp(nil) > -300; n++ {
		term.Mul(term, z)
		term.Quo(term, new(big.Float).SetPrec(prec).SetInt64(n))
		sum.Add(sum, term)
	}
	for range halvings {
		sum.Mul(sum, sum)
	}
	return sum
}

// modelBadCases are launches of the kernels for models that must fail
// without writing anything (TestBadInputs): each check once.
func modelBadCases() []badCase {
	const huge = 1 << 62
	f := func(n int) Value { return f32sArg(make([]float32, n)...) }
	mis := func(n int) Value { return bufArg(misaligned(f32Bytes(make([]float32, n)...))) }
	mem := f32Bytes(make([]float32, 64)...)
	at := func(lo, hi int) Value { return bufArg(mem[4*lo : 4*hi]) }
	// Valid launches, broken one argument at a time below.
	mm := []Value{i64Arg(2), i64Arg(2), i64Arg(3), i64Arg(4), i64Arg(0), i64Arg(0), i64Arg(1), f(16), f(12), outF32(12)}
	ad := []Value{i64Arg(2), i64Arg(3), i64Arg(1), f(6), f(3), outF32(6)}
	un := []Value{i64Arg(3), f(3), outF32(3)}
	ge := []Value{i64Arg(3), i64Arg(1), f(3), outF32(3)}
	sm := []Value{i64Arg(4), i64Arg(3), i64Arg(2), i64Arg(1), i64Arg(0), f32Arg(1), f(12), outF32(12)}
	ln := []Value{i64Arg(2), i64Arg(3), f32Arg(1e-5), f(6), f(3), f(3), outF32(6)}
	rn := []Value{i64Arg(2), i64Arg(3), f32Arg(1e-5), f(6), f(3), outF32(6)}
	em := []Value{i64Arg(3), i64Arg(4), i64Arg(2), i32sArg(0, 3, 1), f(8), outF32(6)}
	pe := []Value{i64Arg(1), i64Arg(2), i64Arg(3), i64Arg(2), i64Arg(0), i64Arg(2), i64Arg(1), i64Arg(3), f(12), outF32(12)}
	sl := []Value{i64Arg(2), i64Arg(4), i64Arg(2), i64Arg(1), i64Arg(2), f(16), outF32(8)}
	co := []Value{i64Arg(2), i64Arg(1), i64Arg(2), i64Arg(3), i64Arg(2), f(4), f(8), outF32(12)}
	kv := []Value{i64Arg(2), i64Arg(4), i64Arg(1), i64Arg(3), i64Arg(3), f(6), f(24)}
	at4 := []Value{i64Arg(2), i64Arg(2), i64Arg(3), i64Arg(4), i64Arg(1), i64Arg(1), f32Arg(0.5), f(12), f(24), f(24), outF32(12)}
	am := []Value{i64Arg(2), i64Arg(3), f(6), i32sArg(7, 7)}
	nan := float32(math.NaN())
	return []badCase{
		{"matmul negative batch", "matmul", with(mm, 0, i64Arg(-1)), "matmul: batch = -1 is negative"},
		{"matmul negative k", "matmul", with(mm, 3, i64Arg(-4)), "matmul: k = -4 is negative"},
		{"matmul trans_a 2", "matmul", with(mm, 4, i64Arg(2)), "matmul: trans_a = 2, want 0 or 1"},
		{"matmul trans_b -1", "matmul", with(mm, 5, i64Arg(-1)), "matmul: trans_b = -1, want 0 or 1"},
		{"matmul b_batch", "matmul", with(mm, 6, i64Arg(3)), "matmul: b_batch = 3, want 1 or batch = 2"},
		{"matmul short a", "matmul", with(mm, 7, f(15)), "matmul: buffer a holds 60 bytes, batch*m*k = 2*2*4 float32 need 64"},
		{"matmul short batched b", "matmul", with(mm, 6, i64Arg(2)), "matmul: buffer b holds 48 bytes, b_batch*k*n = 2*4*3 float32 need 96"},
		{"matmul short c", "matmul", with(mm, 9, f(11)), "buffer c holds 44 bytes, batch*m*n = 2*2*3 float32 need 48"},
		{"matmul misaligned b", "matmul", with(mm, 8, mis(12)), "matmul: buffer b starts 1 bytes past a 4-byte boundary"},
		{"matmul overflow", "matmul", with(mm, 0, i64Arg(huge)), on64("matmul: buffer a: batch*m*k = 4611686018427387904*2*4 float32 overflows", "batch = 4611686018427387904 does not fit in an int")},
		{"matmul c over a", "matmul", with(with(mm, 7, at(0, 16)), 9, at(12, 24)), "matmul: output c overlaps input a"},
		{"matmul c is b", "matmul", with(with(mm, 8, at(0, 12)), 9, at(0, 12)), "matmul: output c overlaps input b"},

		{"add negative cols", "add", with(ad, 1, i64Arg(-3)), "add: cols = -3 is negative"},
		{"add b_rows", "add", with(ad, 2, i64Arg(3)), "add: b_rows = 3, want 1 or rows = 2"},
		{"add short b", "add", with(ad, 2, i64Arg(2)), "add: buffer b holds 12 bytes, b_rows*cols = 2*3 float32 need 24"},
		{"add misaligned out", "add", with(ad, 5, mis(6)), "add: buffer out starts 1 bytes past"},
		{"add out shifted over a", "add", with(with(ad, 3, at(0, 6)), 5, at(1, 7)), "add: output out overlaps input a without being the same elements"},
		{"add out over a broadcast b", "add", with(with(ad, 4, at(0, 3)), 5, at(0, 6)), "add: output out overlaps input b without being the same elements"},
		{"mul short a", "mul", with(ad, 3, f(5)), "mul: buffer a holds 20 bytes, rows*cols = 2*3 float32 need 24"},
		{"mul out shifted over b", "mul", with(with(with(ad, 2, i64Arg(2)), 4, at(2, 8)), 5, at(0, 6)), "mul: output out overlaps input b without"},

		{"relu negative n", "relu", with(un, 0, i64Arg(-1)), "relu: n = -1 is negative"},
		{"relu short out", "relu", with(un, 2, f(2)), "relu: buffer out holds 8 bytes, n = 3 float32 need 12"},
		{"relu out shifted over x", "relu", with(with(un, 1, at(1, 4)), 2, at(0, 3)), "relu: output out overlaps input x without"},
		{"silu misaligned x", "silu", with(un, 1, mis(3)), "silu: buffer x starts 1 bytes past"},
		{"gelu approximate 2", "gelu", with(ge, 1, i64Arg(2)), "gelu: approximate = 2, want 0 or 1"},
		{"gelu short x", "gelu", with(ge, 2, f(2)), "gelu: buffer x holds 8 bytes, n = 3 float32 need 12"},

		{"softmax q 0", "softmax", with(sm, 2, i64Arg(0)), "softmax: q = 0, want at least 1"},
		{"softmax rows not a multiple of q", "softmax", with(sm, 2, i64Arg(3)), "softmax: rows = 4 is not a multiple of q = 3"},
		{"softmax causal 2", "softmax", with(sm, 3, i64Arg(2)), "softmax: causal = 2, want 0 or 1"},
		{"softmax negative offset", "softmax", with(sm, 4, i64Arg(-1)), "softmax: offset = -1 is negative"},
		{"softmax short x", "softmax", with(sm, 6, f(11)), "softmax: buffer x holds 44 bytes, rows*cols = 4*3 float32 need 48"},
		{"softmax in place", "softmax", with(with(sm, 6, at(0, 12)), 7, at(0, 12)), "softmax: output out overlaps input x"},

		{"layer_norm negative eps", "layer_norm", with(ln, 2, f32Arg(-1)), "layer_norm: eps = -1, want a finite value >= 0"},
		{"layer_norm NaN eps", "layer_norm", with(ln, 2, f32Arg(nan)), "layer_norm: eps = NaN, want a finite value >= 0"},
		{"layer_norm short gamma", "layer_norm", with(ln, 4, f(2)), "layer_norm: buffer gamma holds 8 bytes, cols = 3 float32 need 12"},
		{"layer_norm short beta", "layer_norm", with(ln, 5, f(2)), "layer_norm: buffer beta holds 8 bytes, cols = 3 float32 need 12"},
		{"layer_norm out over beta", "layer_norm", with(with(ln, 5, at(4, 7)), 6, at(0, 6)), "layer_norm: output out overlaps input beta"},
		{"rms_norm infinite eps", "rms_norm", with(rn, 2, f32Arg(float32(math.Inf(1)))), "rms_norm: eps = +Inf, want a finite value >= 0"},
		{"rms_norm negative rows", "rms_norm", with(rn, 0, i64Arg(-2)), "rms_norm: rows = -2 is negative"},
		{"rms_norm in place", "rms_norm", with(with(rn, 3, at(0, 6)), 5, at(0, 6)), "rms_norm: output out overlaps input x"},

		{"embedding id = vocab", "embedding", with(em, 3, i32sArg(0, 4, 1)), "embedding: ids[1] = 4 is outside [0, vocab = 4)"},
		{"embedding negative id", "embedding", with(em, 3, i32sArg(0, 1, -1)), "embedding: ids[2] = -1 is outside [0, vocab = 4)"},
		{"embedding short ids", "embedding", with(em, 3, i32sArg(0, 1)), "embedding: buffer ids holds 8 bytes, n = 3 int32 need 12"},
		{"embedding misaligned ids", "embedding", with(em, 3, bufArg(misaligned(i32Bytes(0, 1, 2)))), "embedding: buffer ids starts 1 bytes past a 4-byte boundary; int32 data must be aligned"},
		{"embedding short table", "embedding", with(em, 4, f(7)), "embedding: buffer table holds 28 bytes, vocab*dim = 4*2 float32 need 32"},
		{"embedding out over table", "embedding", with(with(em, 4, at(0, 8)), 5, at(7, 13)), "embedding: output out overlaps input table"},
		{"embedding out over ids", "embedding", with(with(em, 3, at(5, 8)), 5, at(0, 6)), "embedding: output out overlaps input ids"},

		{"permute not a permutation", "permute", with(pe, 6, i64Arg(0)), "permute: (p0, p1, p2, p3) = (0, 2, 0, 3) is not a permutation of (0, 1, 2, 3)"},
		{"permute axis 4", "permute", with(pe, 7, i64Arg(4)), "permute: p3 = 4, want an axis in [0, 3]"},
		{"permute negative d2", "permute", with(pe, 2, i64Arg(-3)), "permute: d2 = -3 is negative"},
		{"permute short x", "permute", with(pe, 8, f(11)), "permute: buffer x holds 44 bytes, d0*d1*d2*d3 = 1*2*3*2 float32 need 48"},
		{"permute in place", "permute", with(with(pe, 8, at(0, 12)), 9, at(0, 12)), "permute: output out overlaps input x"},

		{"slice past mid", "slice", with(sl, 3, i64Arg(3)), "slice: start + len = 3 + 2 exceeds mid = 4"},
		{"slice huge start", "slice", with(sl, 3, i64Arg(math.MaxInt64)), on64("slice: start + len = 9223372036854775807 + 2 exceeds mid = 4", "does not fit in an int")},
		{"slice negative len", "slice", with(sl, 4, i64Arg(-1)), "slice: len = -1 is negative"},
		{"slice short dst", "slice", with(sl, 6, f(7)), "slice: buffer dst holds 28 bytes, outer*len*inner = 2*2*2 float32 need 32"},
		{"slice dst over src", "slice", with(with(sl, 5, at(0, 16)), 6, at(15, 23)), "slice: output dst overlaps input src"},

		{"concat mid", "concat", with(co, 3, i64Arg(4)), "concat: mid = 4, want mid_a + mid_b = 1 + 2"},
		{"concat mid below mid_a", "concat", with(co, 3, i64Arg(0)), "concat: mid = 0, want mid_a + mid_b = 1 + 2"},
		{"concat short b", "concat", with(co, 6, f(7)), "concat: buffer b holds 28 bytes, outer*mid_b*inner = 2*2*2 float32 need 32"},
		{"concat out over a", "concat", with(with(co, 5, at(8, 12)), 7, at(0, 12)), "concat: output out overlaps input a"},

		{"kv_append past cap", "kv_append", with(kv, 4, i64Arg(4)), "kv_append: pos + len = 4 + 1 exceeds cap = 4"},
		{"kv_append long src", "kv_append", with(with(kv, 2, i64Arg(2)), 5, f(12)), "kv_append: pos + len = 3 + 2 exceeds cap = 4"},
		{"kv_append huge pos", "kv_append", with(kv, 4, i64Arg(math.MaxInt64)), on64("kv_append: pos + len = 9223372036854775807 + 1 exceeds cap = 4", "does not fit in an int")},
		{"kv_append negative pos", "kv_append", with(kv, 4, i64Arg(-1)), "kv_append: pos = -1 is negative"},
		{"kv_append short cache", "kv_append", with(kv, 6, f(23)), "kv_append: buffer cache holds 92 bytes, outer*cap*inner = 2*4*3 float32 need 96"},
		{"kv_append src in cache", "kv_append", with(with(kv, 5, at(20, 26)), 6, at(0, 24)), "kv_append: output cache overlaps input src"},

		{"attention past cap", "attention", with(at4, 4, i64Arg(3)), "attention: pos + t = 3 + 2 exceeds cap = 4"},
		{"attention causal 5", "attention", with(at4, 5, i64Arg(5)), "attention: causal = 5, want 0 or 1"},
		{"attention negative d", "attention", with(at4, 2, i64Arg(-3)), "attention: d = -3 is negative"},
		{"attention short k", "attention", with(at4, 8, f(23)), "attention: buffer k holds 92 bytes, heads*cap*d = 2*4*3 float32 need 96"},
		{"attention short v", "attention", with(at4, 9, f(23)), "attention: buffer v holds 92 bytes, heads*cap*d = 2*4*3 float32 need 96"},
		{"attention misaligned q", "attention", with(at4, 7, mis(12)), "attention: buffer q starts 1 bytes past"},
		{"attention out over v", "attention", with(with(at4, 9, at(0, 24)), 10, at(20, 32)), "attention: output out overlaps input v"},

		{"argmax cols 0", "argmax", with(am, 1, i64Arg(0)), "argmax: cols = 0, want at least 1"},
		{"argmax cols past int32", "argmax", with(am, 1, i64Arg(1<<31)), on64("argmax: cols = 2147483648: an index of out, int32, holds at most 2147483647", "does not fit in an int")},
		{"argmax short out", "argmax", with(am, 3, i32sArg(7)), "argmax: buffer out holds 4 bytes, rows = 2 int32 need 8"},
		{"argmax out over x", "argmax", with(with(am, 2, at(0, 6)), 3, at(5, 7)), "argmax: output out overlaps input x"},
	}
}
