package kernels

import "github.com/vgpu/vgpu/api"

var sgemm = &Kernel{
	Info: api.KernelInfo{
		Name: "sgemm",
		Doc: "C = alpha*A*B + beta*C with row-major A (m x k), B (k x n) and C (m x n). " +
			"Each C[i][j] starts as beta*C[i][j] (0 if beta = 0: C is not read, as in BLAS), then adds " +
			"(alpha*A[i][p])*B[p][j] for p = 0..k-1 in order, every product and sum rounded to float32 " +
			"(no fused multiply-add); alpha = 0 leaves out A and B. c must not overlap a or b.",
		Params: []api.Param{
			i64Param("m"), i64Param("n"), i64Param("k"), f32Param("alpha"),
			bufParam("a", api.AccessRead, 4, "m", "k"), bufParam("b", api.AccessRead, 4, "k", "n"),
			f32Param("beta"), bufParam("c", api.AccessReadWrite, 4, "m", "n"),
		},
	},
	plan: planSgemm,
}

func planSgemm(args []Value, maxWork int) (*Plan, error) {
	var c checker
	m := c.size("m", args[0].I64, 0)
	n := c.size("n", args[1].I64, 0)
	k := c.size("k", args[2].I64, 0)
	a := view[float32](&c, "a", args[4].Buf, "m*k", m, k)
	b := view[float32](&c, "b", args[5].Buf, "k*n", k, n)
	cm := view[float32](&c, "c", args[7].Buf, "m*n", m, n)
	disjoint(&c, "c", cm, "a", a)
	disjoint(&c, "c", cm, "b", b)
	if c.err != nil {
		return nil, c.err
	}
	if len(cm) == 0 {
		// m or n is 0. Returning here also keeps a huge m with n = 0, which
		// no buffer bounds, from looping over empty rows.
		return &Plan{}, nil
	}
	alpha, beta := args[3].F32, args[6].F32
	return planGemm(m, n, k, maxWork, func(i, j0, j1, p0, p1 int, first bool) {
		sgemmPart(cm[i*n+j0:i*n+j1], a[i*k+p0:i*k+p1], b, n, j0, p0, alpha, beta, first)
	}), nil
}

// gemmPart computes columns [j0, j1) of row i of a matrix product from the
// products of p in [p0, p1): it adds them, in p order, to what those
// elements hold, or to zero (sgemm: to beta·C) when first. Calls for
// distinct elements may run concurrently.
type gemmPart func(i, j0, j1, p0, p1 int, first bool)

// planGemm plans a matrix product of rows rows of n elements, each a sum of
// k products, computed by part.
//
// Elements are independent, and each sums its products in p order, so any
// split of rows or columns, into slices and within a slice across
// goroutines, and any split of p into chunks run in order, gives the same
// bits.
func planGemm(rows, n, k, maxWork int, part gemmPart) *Plan {
	cost := satMul(n, k+1)
	if cost <= maxWork {
		return rowPlan(rows, cost, maxWork, func(lo, hi int) error {
			for i := lo; i < hi; i++ {
				part(i, 0, n, 0, k, true)
			}
			return nil
		})
	}
	// A row costs more than a slice may, so that a wide or deep operand
	// would make one slice hold the device: cut each row into blocks of
	// columns, and each block's sum into chunks of p, the chunks of a block
	// in order.
	width := min(n, max(64, maxWork/4))
	blocks := (n + width - 1) / width
	depth := max(4, maxWork/width)
	chunks := max(1, (k+depth-1)/depth)
	items := satMul(satMul(rows, blocks), chunks)
	return evenPlan(items, satMul(width, depth), maxWork, func(lo, hi, workers int) error {
		for item := lo; item < hi; item++ {
			chunk, rest := item%chunks, item/chunks
			i, j0 := rest/blocks, rest%blocks*width
			j1, p0 := min(j0+width, n), chunk*depth
			p1 := min(p0+depth, k)
			err := parallelForN(workers, j1-j0, p1-p0+1, func(l, h int) error {
				part(i, j0+l, j0+h, p0, p1, chunk == 0)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// sgemmPart adds alpha·A[i][p]·B[p][j] for p in [p0, p0+len(ai)) to c,
// which is C[i][j0 : j0+len(c)], given ai = A[i][p0 : p0+len(ai)]; first,
// it scales c by beta.
//
// The loops run k-j: the inner one walks a row of B and of C contiguously,
// so it streams through cache. p is unrolled by four and the four updates
// of C[i][j] chained through a register, which loads and stores each
// element of C once per four products instead of once per product while
// keeping the order of the sum per element (p ascending) that Doc
// promises: each sum is rounded in turn either way, so chunks of p give
// the bits of one pass.
func sgemmPart(ci, ai, b []float32, n, j0, p0 int, alpha, beta float32, first bool) {
	if first {
		switch beta {
		case 0:
			clear(ci)
		case 1:
		default:
			for j := range ci {
				ci[j] *= beta
			}
		}
	}
	if alpha == 0 {
		return
	}
	j1 := j0 + len(ci)
	q := 0
	for ; q+4 <= len(ai); q += 4 {
		p := p0 + q
		t0, t1, t2, t3 := alpha*ai[q], alpha*ai[q+1], alpha*ai[q+2], alpha*ai[q+3]
		// Reslicing to len(ci) lets the compiler drop bounds checks below.
		b0 := b[p*n+j0 : p*n+j1][:len(ci)]
		b1 := b[(p+1)*n+j0 : (p+1)*n+j1][:len(ci)]
		b2 := b[(p+2)*n+j0 : (p+2)*n+j1][:len(ci)]
		b3 := b[(p+3)*n+j0 : (p+3)*n+j1][:len(ci)]
		for j, s := range ci {
			// Each conversion rounds its product, which forbids the
			// compiler to fuse it with the sum into an FMA.
			s += float32(t0 * b0[j])
			s += float32(t1 * b1[j])
			s += float32(t2 * b2[j])
			s += float32(t3 * b3[j])
			ci[j] = s
		}
	}
	for ; q < len(ai); q++ {
		p := p0 + q
		t := alpha * ai[q]
		bp := b[p*n+j0 : p*n+j1][:len(ci)]
		for j, bv := range bp {
			ci[j] += float32(t * bv)
		}
	}
}
