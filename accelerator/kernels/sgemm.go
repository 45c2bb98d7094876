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
	// Rows are independent, so any split, into slices and within a slice
	// across goroutines, gives the same bits.
	cost := satMul(n, k+1)
	return evenPlan(m, cost, maxWork, func(lo, hi, workers int) error {
		return parallelForN(workers, hi-lo, cost, func(l, h int) error {
			l, h = lo+l, lo+h
			sgemmRows(cm[l*n:h*n], a[l*k:h*k], b, n, k, alpha, beta)
			return nil
		})
	}), nil
}

// sgemmRows computes the rows of C in c from the matching rows of A in a.
//
// The loops run i-k-j: the innermost walks a row of B and a row of C
// contiguously, so it streams through cache. p is unrolled by four and the
// four updates of C[i][j] chained through a register, which loads and stores
// each element of C once per four products instead of once per product while
// keeping the order of the sum per element (p ascending) that Doc promises.
func sgemmRows(c, a, b []float32, n, k int, alpha, beta float32) {
	for i := 0; i < len(c)/n; i++ {
		ci := c[i*n : i*n+n]
		switch beta {
		case 0:
			clear(ci)
		case 1:
		default:
			for j := range ci {
				ci[j] *= beta
			}
		}
		if alpha == 0 {
			continue
		}
		ai := a[i*k : i*k+k]
		p := 0
		for ; p+4 <= k; p += 4 {
			t0, t1, t2, t3 := alpha*ai[p], alpha*ai[p+1], alpha*ai[p+2], alpha*ai[p+3]
			// Reslicing to len(ci) lets the compiler drop bounds checks below.
			b0 := b[p*n : p*n+n][:len(ci)]
			b1 := b[(p+1)*n : (p+1)*n+n][:len(ci)]
			b2 := b[(p+2)*n : (p+2)*n+n][:len(ci)]
			b3 := b[(p+3)*n : (p+3)*n+n][:len(ci)]
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
		for ; p < k; p++ {
			t := alpha * ai[p]
			bp := b[p*n : p*n+n][:len(ci)]
			for j, bv := range bp {
				ci[j] += float32(t * bv)
			}
		}
	}
}
