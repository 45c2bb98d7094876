package kernels

import "github.com/vgpu/vgpu/api"

var matmul = &Kernel{
	Info: api.KernelInfo{
		Name: "matmul",
		Doc: "Batched matrix product: c[i] = op(a[i]) x op(b[i]) for i < batch, each c[i] m x n row-major; " +
			"b[i] is b[0] when b_batch = 1 (one right operand for the whole batch, as a weight), else " +
			"b_batch must equal batch. op(a[i]) is a[i] (m x k) when trans_a = 0, the transpose of a[i] " +
			"stored k x m when 1; op(b[i]) is b[i] (k x n) when trans_b = 0, the transpose of b[i] stored " +
			"n x k when 1. Every c element sums its k products in p order from 0, each product and each " +
			"sum rounded to float32 (no fused multiply-add): bit for bit a float32 triple loop; k = 0 " +
			"gives zeros. c must not overlap a or b.",
		Params: []api.Param{
			i64Param("batch"), i64Param("m"), i64Param("n"), i64Param("k"),
			i64Param("trans_a"), i64Param("trans_b"), i64Param("b_batch"),
			bufParam("a", api.AccessRead, 4, "batch", "m", "k"),
			bufParam("b", api.AccessRead, 4, "b_batch", "k", "n"),
			bufParam("c", api.AccessWrite, 4, "batch", "m", "n"),
		},
	},
	plan: planMatmul,
}

func planMatmul(args []Value, maxWork int) (*Plan, error) {
	var c checker
	batch := c.size("batch", args[0].I64, 0)
	m := c.size("m", args[1].I64, 0)
	n := c.size("n", args[2].I64, 0)
	k := c.size("k", args[3].I64, 0)
	transA := c.flag("trans_a", args[4].I64)
	transB := c.flag("trans_b", args[5].I64)
	bBatch := c.size("b_batch", args[6].I64, 0)
	if c.err == nil && bBatch != 1 && bBatch != batch {
		c.fail("b_batch = %d, want 1 or batch = %d", bBatch, batch)
	}
	a := view[float32](&c, "a", args[7].Buf, "batch*m*k", batch, m, k)
	b := view[float32](&c, "b", args[8].Buf, "b_batch*k*n", bBatch, k, n)
	cm := view[float32](&c, "c", args[9].Buf, "batch*m*n", batch, m, n)
	disjoint(&c, "c", cm, "a", a)
	disjoint(&c, "c", cm, "b", b)
	if c.err != nil {
		return nil, c.err
	}
	if len(cm) == 0 {
		// As sgemm: no rows, or rows of nothing, which no buffer bounds.
		return &Plan{}, nil
	}
	bStride := k * n // elements of one b[i]; none when all share b[0]
	if bBatch == 1 {
		bStride = 0
	}
	// Row i of the batch's stacked rows is row r of c[i/m]. Non-transposed
	// b streams its rows as sgemm does; transposed, each element is a dot
	// product of two contiguous runs. Both sum each element in p order.
	return planGemm(batch*m, n, k, maxWork, func(i, j0, j1, p0, p1 int, first bool) {
		bi, r := i/m, i%m
		ci := cm[i*n+j0 : i*n+j1]
		bb := b[bi*bStride : bi*bStride+k*n]
		var ai []float32
		if transA {
			// a[bi] is stored k x m: gather its column r, which the p
			// loops below read once per column of c (or four).
			ab := a[bi*m*k : (bi+1)*m*k]
			ai = make([]float32, p1-p0)
			for q := range ai {
				ai[q] = ab[(p0+q)*m+r]
			}
		} else {
			ai = a[i*k+p0 : i*k+p1]
		}
		if transB {
			dotPart(ci, ai, bb, k, j0, p0, first)
		} else {
			sgemmPart(ci, ai, bb, n, j0, p0, 1, 0, first)
		}
	}), nil
}

// dotPart adds A[i][p]·B[p][j] for p in [p0, p0+len(ai)) to ci, which is
// C[i][j0 : j0+len(ci)], or to zero when first, given ai = A[i][p0 : …]
// and bt = Bᵀ, stored n x k, whose rows are B's columns. Four columns at a
// time keep four independent sums in flight, each reading ai once per four
// products; each element still sums its products in p order.
func dotPart(ci, ai, bt []float32, k, j0, p0 int, first bool) {
	if first {
		clear(ci)
	}
	p1 := p0 + len(ai)
	j := 0
	for ; j+4 <= len(ci); j += 4 {
		r := (j0 + j) * k
		b0 := bt[r+p0 : r+p1][:len(ai)]
		b1 := bt[r+k+p0 : r+k+p1][:len(ai)]
		b2 := bt[r+2*k+p0 : r+2*k+p1][:len(ai)]
		b3 := bt[r+3*k+p0 : r+3*k+p1][:len(ai)]
		s0, s1, s2, s3 := ci[j], ci[j+1], ci[j+2], ci[j+3]
		for q, av := range ai {
			// The conversions forbid fusing into FMAs, as in sgemmPart.
			s0 += float32(av * b0[q])
			s1 += float32(av * b1[q])
			s2 += float32(av * b2[q])
			s3 += float32(av * b3[q])
		}
		ci[j], ci[j+1], ci[j+2], ci[j+3] = s0, s1, s2, s3
	}
	for ; j < len(ci); j++ {
		r := (j0 + j) * k
		bj := bt[r+p0 : r+p1][:len(ai)]
		s := ci[j]
		for q, av := range ai {
			s += float32(av * bj[q])
		}
		ci[j] = s
	}
}
