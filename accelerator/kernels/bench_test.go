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

func BenchmarkSgemm512(b *testing.B) {
	const n = 512
	args := []Value{i64Arg(n), i64Arg(n), i64Arg(n), f32Arg(1),
		f32sArg(seq(n*n, 0.01)...), f32sArg(seq(n*n, 0.02)...), f32Arg(0.5), f32sArg(seq(n*n, 0.03)...)}
	benchRun(b, "sgemm", args)
	b.ReportMetric(2*n*n*n*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
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
