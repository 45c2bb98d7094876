package kernels

import "testing"

func benchRun(b *testing.B, name string, args []Value) {
	k := mustLookup(b, name)
	b.ResetTimer()
	for b.Loop() {
		if err := k.Run(args); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSgemm512(b *testing.B) { benchSgemm(b, 512) }
func BenchmarkSgemm256(b *testing.B) { benchSgemm(b, 256) }

func benchSgemm(b *testing.B, n int) {
	args := []Value{i64Arg(int64(n)), i64Arg(int64(n)), i64Arg(int64(n)), f32Arg(1),
		f32sArg(seq(n*n, 0.01)...), f32sArg(seq(n*n, 0.02)...), f32Arg(0.5), f32sArg(seq(n*n, 0.03)...)}
	benchRun(b, "sgemm", args)
	b.ReportMetric(2*float64(n*n*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkMatmul runs matmul beside sgemm's shapes, in each layout, and
// in the shapes of a small GPT decoder's step: one row against a weight,
// and the LM head against the tied embedding (transposed).
func BenchmarkMatmul(b *testing.B) {
	for _, bc := range []struct {
		name           string
		batch, m, n, k int
		transA, transB int64
	}{
		{"256", 1, 256, 256, 256, 0, 0},
		{"256/trans_a", 1, 256, 256, 256, 1, 0},
		{"256/trans_b", 1, 256, 256, 256, 0, 1},
		{"512", 1, 512, 512, 512, 0, 0},
		{"512/trans_b", 1, 512, 512, 512, 0, 1},
		{"batch8x64", 8, 64, 64, 64, 0, 0},
		{"decode/1x768x256", 1, 1, 768, 256, 0, 0},
		{"decode/lm_head_1x4096x256", 1, 1, 4096, 256, 0, 1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			args := []Value{i64Arg(int64(bc.batch)), i64Arg(int64(bc.m)), i64Arg(int64(bc.n)), i64Arg(int64(bc.k)),
				i64Arg(bc.transA), i64Arg(bc.transB), i64Arg(1),
				f32sArg(seq(bc.batch*bc.m*bc.k, 0.01)...), f32sArg(seq(bc.k*bc.n, 0.02)...), bufArg(alloc(4 * bc.batch * bc.m * bc.n))}
			benchRun(b, "matmul", args)
			b.ReportMetric(2*float64(bc.batch*bc.m*bc.n*bc.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkAttention is a decoder's attention at 4 heads of 64: a prefill
// of 128 positions, and a decode step at position 255.
func BenchmarkAttention(b *testing.B) {
	const heads, d, capacity = 4, 64, 256
	for _, bc := range []struct {
		name   string
		t, pos int
	}{{"prefill128", 128, 0}, {"decode", 1, 255}} {
		b.Run(bc.name, func(b *testing.B) {
			benchRun(b, "attention", []Value{i64Arg(heads), i64Arg(int64(bc.t)), i64Arg(d), i64Arg(capacity), i64Arg(int64(bc.pos)),
				i64Arg(1), f32Arg(0.125), f32sArg(seq(heads*bc.t*d, 0.1)...), f32sArg(seq(heads*capacity*d, 0.2)...),
				f32sArg(seq(heads*capacity*d, 0.3)...), bufArg(alloc(4 * heads * bc.t * d))})
		})
	}
}

func BenchmarkSaxpy(b *testing.B) {
	const n = 1 << 20
	b.SetBytes(3 * 4 * n) // read x and y, write y
	benchRun(b, "saxpy", []Value{i64Arg(n), f32Arg(1.5), f32sArg(seq(n, 0.1)...), f32sArg(seq(n, 0.2)...)})
}

// BenchmarkEmbeddingBag is shaped like a DLRM inference lookup: a batch of
// 2048 bags of 80 rows of 64 floats from a table of 2^18 rows.
func BenchmarkEmbeddingBag(b *testing.B) {
	const rows, dim, nbags, per = 1 << 18, 64, 2048, 80
	indices := make([]int32, nbags*per)
	for i := range indices {
		indices[i] = int32(uint32(i) * 2654435761 % rows) // scattered, like hashed ids
	}
	offsets := make([]int32, nbags)
	for i := range offsets {
		offsets[i] = int32(i * per)
	}
	b.SetBytes(int64(len(indices)) * dim * 4) // table bytes gathered
	benchRun(b, "embedding_bag_sum", []Value{
		bufArg(alloc(rows * dim * 4)), i64Arg(rows), i64Arg(dim),
		i32sArg(indices...), i64Arg(int64(len(indices))), i32sArg(offsets...), i64Arg(nbags),
		bufArg(alloc(nbags * dim * 4))})
}
