package kernels

import (
	"math"

	"github.com/vgpu/vgpu/api"
)

// The row kernels reduce along the last dimension of a rows x cols matrix.
// softmax and the norms compute each row in float64, in index order, and
// round each output once; rows are independent, so they spread over the
// workers and must not write what they read. argmax is memory-bound and
// runs on the caller's goroutine.

var softmax = &Kernel{
	Info: api.KernelInfo{
		Name: "softmax",
		Doc: "Softmax along each row of x (rows x cols) of scale*x, stable: in float64, y[j] = scale*x[r][j] " +
			"(exact), m = the largest y[j] of the row's kept columns, e[j] = e^(y[j]-m), s = the sum of the " +
			"e[j] in index order, out[r][j] = e[j]/s rounded to float32 once. If causal = 1, row r keeps " +
			"the columns j <= (r mod q) + offset and writes 0 in the others (scores of q queries per block " +
			"of rows, the first at position offset); if causal = 0 every column is kept. q >= 1 must divide " +
			"rows, offset >= 0, so every row keeps column 0. A NaN or infinity among a row's kept inputs " +
			"makes the row NaN. e^x gives the same bits on every platform (within 1 ulp of float64): " +
			"results within 1 ulp of float32 of the float64 formula. out must not overlap x.",
		Params: []api.Param{
			i64Param("rows"), i64Param("cols"), i64Param("q"), i64Param("causal"), i64Param("offset"),
			f32Param("scale"),
			bufParam("x", api.AccessRead, 4, "rows", "cols"),
			bufParam("out", api.AccessWrite, 4, "rows", "cols"),
		},
	},
	plan: planSoftmax,
}

func planSoftmax(args []Value, maxWork int) (*Plan, error) {
	var c checker
	rows := c.size("rows", args[0].I64, 0)
	cols := c.size("cols", args[1].I64, 0)
	q := c.size("q", args[2].I64, 1)
	causal := c.flag("causal", args[3].I64)
	offset := c.size("offset", args[4].I64, 0)
	if c.err == nil && rows%q != 0 {
		c.fail("rows = %d is not a multiple of q = %d", rows, q)
	}
	x := view[float32](&c, "x", args[6].Buf, "rows*cols", rows, cols)
	out := view[float32](&c, "out", args[7].Buf, "rows*cols", rows, cols)
	disjoint(&c, "out", out, "x", x)
	if c.err != nil {
		return nil, c.err
	}
	if len(out) == 0 {
		return &Plan{}, nil
	}
	scale := float64(args[5].F32)
	return rowPlan(rows, satMul(cols, expCost), maxWork, func(lo, hi int) error {
		y := make([]float64, cols)
		for r := lo; r < hi; r++ {
			keep := cols
			if causal && offset < cols-r%q {
				keep = r%q + offset + 1
			}
			xr, or := x[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols]
			yr := y[:keep]
			for j := range yr {
				// A product of two float32s is exact in float64.
				yr[j] = scale * float64(xr[j])
			}
			sum := expShift(yr)
			for j, e := range yr {
				or[j] = float32(e / sum)
			}
			clear(or[keep:])
		}
		return nil
	}), nil
}

// expShift replaces each y[j] of a non-empty y by e^(y[j] - max y) and
// returns their sum in index order. The largest term is 1, so the sum is
// at least 1 and nothing overflows; a NaN anywhere, or an infinity, which
// makes y[j] - max y NaN, makes the sum NaN.
func expShift(y []float64) float64 {
	m := y[0]
	for _, v := range y[1:] {
		if v > m {
			m = v
		}
	}
	var sum float64
	for j, v := range y {
		y[j] = exp(v - m)
		sum += y[j]
	}
	return sum
}

// normCost is what an element of layer_norm or rms_norm counts as in work:
// two or three passes over the row and a division, in float64, measured at
// about 8 multiply-adds of sgemm.
const normCost = 8

var layerNorm = &Kernel{
	Info: api.KernelInfo{
		Name: "layer_norm",
		Doc: "Layer normalisation of each row of x (rows x cols), as PyTorch's: in float64, mu = the sum of " +
			"the row in index order / cols, v = the sum of (x[j] - mu)^2 in index order / cols (biased), " +
			"y = (x[j] - mu) / sqrt(v + eps), out[r][j] = y*gamma[j] + beta[j], every operation rounded " +
			"in float64 (no fused multiply-add) and the result rounded to float32 once: the same bits on " +
			"every platform. eps must be finite and >= 0. out must not overlap x, gamma or beta.",
		Params: []api.Param{
			i64Param("rows"), i64Param("cols"), f32Param("eps"),
			bufParam("x", api.AccessRead, 4, "rows", "cols"),
			bufParam("gamma", api.AccessRead, 4, "cols"),
			bufParam("beta", api.AccessRead, 4, "cols"),
			bufParam("out", api.AccessWrite, 4, "rows", "cols"),
		},
	},
	plan: func(args []Value, maxWork int) (*Plan, error) { return planNorm(args, maxWork, false) },
}

var rmsNorm = &Kernel{
	Info: api.KernelInfo{
		Name: "rms_norm",
		Doc: "RMS normalisation of each row of x (rows x cols): in float64, ms = the sum of x[j]^2 in index " +
			"order / cols, out[r][j] = (x[j] / sqrt(ms + eps)) * gamma[j], every operation rounded in " +
			"float64 and the result rounded to float32 once: the same bits on every platform. eps must be " +
			"finite and >= 0. out must not overlap x or gamma.",
		Params: []api.Param{
			i64Param("rows"), i64Param("cols"), f32Param("eps"),
			bufParam("x", api.AccessRead, 4, "rows", "cols"),
			bufParam("gamma", api.AccessRead, 4, "cols"),
			bufParam("out", api.AccessWrite, 4, "rows", "cols"),
		},
	},
	plan: func(args []Value, maxWork int) (*Plan, error) { return planNorm(args, maxWork, true) },
}

// planNorm plans layer_norm, or rms_norm when rms (which has no beta).
func planNorm(args []Value, maxWork int, rms bool) (*Plan, error) {
	var c checker
	rows := c.size("rows", args[0].I64, 0)
	cols := c.size("cols", args[1].I64, 0)
	eps := float64(args[2].F32)
	if c.err == nil && !(eps >= 0 && eps <= math.MaxFloat32) {
		c.fail("eps = %v, want a finite value >= 0", eps)
	}
	x := view[float32](&c, "x", args[3].Buf, "rows*cols", rows, cols)
	gamma := view[float32](&c, "gamma", args[4].Buf, "cols", cols)
	var beta []float32
	outArg := 5
	if !rms {
		beta = view[float32](&c, "beta", args[5].Buf, "cols", cols)
		outArg = 6
	}
	out := view[float32](&c, "out", args[outArg].Buf, "rows*cols", rows, cols)
	disjoint(&c, "out", out, "x", x)
	disjoint(&c, "out", out, "gamma", gamma)
	disjoint(&c, "out", out, "beta", beta)
	if c.err != nil {
		return nil, c.err
	}
	if len(out) == 0 {
		return &Plan{}, nil
	}
	n := float64(cols)
	return rowPlan(rows, satMul(cols, normCost), maxWork, func(lo, hi int) error {
		for r := lo; r < hi; r++ {
			xr, or := x[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols]
			if rms {
				var ss float64
				for _, v := range xr {
					// Exact in float64, so fusing cannot change it.
					ss += float64(v) * float64(v)
				}
				den := math.Sqrt(ss/n + eps)
				for j, v := range xr {
					or[j] = float32(float64(v) / den * float64(gamma[j]))
				}
				continue
			}
			var s float64
			for _, v := range xr {
				s += float64(v)
			}
			mu := s / n
			var ss float64
			for _, v := range xr {
				d := float64(v) - mu
				ss += float64(d * d)
			}
			den := math.Sqrt(ss/n + eps)
			for j, v := range xr {
				y := (float64(v) - mu) / den
				or[j] = float32(float64(y*float64(gamma[j])) + float64(beta[j]))
			}
		}
		return nil
	}), nil
}

var argmax = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "argmax",
		Doc: "out[r] = the index of the largest element of row r of x (rows x cols, cols >= 1): the first " +
			"such index, where a NaN counts as larger than everything (the first NaN wins) and -0 equals " +
			"+0. out is int32 and must not overlap x.",
		Params: []api.Param{
			i64Param("rows"), i64Param("cols"),
			bufParam("x", api.AccessRead, 4, "rows", "cols"),
			i32Param("out", api.AccessWrite, "rows"),
		},
	},
	plan: planArgmax,
}

func planArgmax(args []Value, maxWork int) (*Plan, error) {
	var c checker
	rows := c.size("rows", args[0].I64, 0)
	cols := c.size("cols", args[1].I64, 1)
	if c.err == nil && cols > math.MaxInt32 {
		c.fail("cols = %d: an index of out, int32, holds at most %d", cols, math.MaxInt32)
	}
	x := view[float32](&c, "x", args[2].Buf, "rows*cols", rows, cols)
	out := view[int32](&c, "out", args[3].Buf, "rows", rows)
	disjoint(&c, "out", out, "x", x)
	if c.err != nil {
		return nil, c.err
	}
	// Slices may cut a row: the row's best so far carries to the next.
	var best float32
	var at int
	return runsPlan(rows, cols, maxWork, func(r, lo, hi int) error {
		xr := x[r*cols : (r+1)*cols]
		for j := lo; j < hi; j++ {
			if v := xr[j]; j == 0 || best == best && (v > best || v != v) {
				best, at = v, j
			}
		}
		if hi == cols {
			out[r] = int32(at)
		}
		return nil
	}), nil
}
