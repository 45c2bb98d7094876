package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Pure-Go references of the catalog's kernels, in the order of operations
// each kernel's Doc promises, so a device result can be checked against
// them (vgpuctl demo, vgpuctl bench). Products are converted to float32
// before they are added, which keeps the compiler from fusing them into a
// multiply-add that the kernels do not do.

// RandFloats returns n floats drawn uniformly from [-1, 1).
func RandFloats(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = rng.Float32()*2 - 1
	}
	return v
}

// SgemmRef computes C = alpha·A·B + beta·C in place: row-major A (m×k),
// B (k×n) and C (m×n), as the sgemm kernel does (beta = 0: C is not read).
func SgemmRef(m, n, k int, alpha float32, a, b []float32, beta float32, c []float32) {
	for i := range m {
		ci := c[i*n : i*n+n]
		for j := range ci {
			if beta == 0 {
				ci[j] = 0
			} else {
				ci[j] *= beta
			}
		}
		if alpha == 0 {
			continue
		}
		for p := range k {
			av := alpha * a[i*k+p]
			bp := b[p*n : p*n+n]
			for j := range ci {
				ci[j] += float32(av * bp[j])
			}
		}
	}
}

// EmbeddingBagSumRef pools bags of rows of a table with dim columns, as the
// embedding_bag_sum kernel does: bag b sums the rows indices[offsets[b] :
// offsets[b+1]] (the last bag up to the end of indices), in index order.
func EmbeddingBagSumRef(table []float32, dim int, indices, offsets []int32) []float32 {
	out := make([]float32, len(offsets)*dim)
	for b := range offsets {
		end := len(indices)
		if b+1 < len(offsets) {
			end = int(offsets[b+1])
		}
		ob := out[b*dim : b*dim+dim]
		for _, idx := range indices[offsets[b]:end] {
			row := table[int(idx)*dim : int(idx)*dim+dim]
			for j := range ob {
				ob[j] += row[j]
			}
		}
	}
	return out
}

// CloseEnough compares got and want with a relative tolerance fit for
// float32 sums whose order may differ, and names the first mismatch.
func CloseEnough(got, want []float32, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d results, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(g) || math.Abs(g-w) > tol*math.Max(1, math.Abs(w)) {
			return fmt.Errorf("element %d is %g, reference %g", i, g, w)
		}
	}
	return nil
}
