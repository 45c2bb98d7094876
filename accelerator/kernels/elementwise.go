package kernels

import (
	"math"

	"github.com/vgpu/vgpu/api"
)

// The elementwise kernels compute out[i] from the inputs' element i alone,
// reading it before writing out[i], so they may run in place: out may be
// exactly an input (the same elements), though not overlap one otherwise.
// Like the vector kernels they run on the caller's goroutine.

// binaryParams is the signature of add and mul.
func binaryParams() []api.Param {
	return []api.Param{
		i64Param("rows"), i64Param("cols"), i64Param("b_rows"),
		bufParam("a", api.AccessRead, 4, "rows", "cols"),
		bufParam("b", api.AccessRead, 4, "b_rows", "cols"),
		bufParam("out", api.AccessWrite, 4, "rows", "cols"),
	}
}

const binaryDoc = " for rows x cols row-major a and out; b is rows x cols too when b_rows = rows, or one row " +
	"of cols broadcast over every row of a when b_rows = 1 (a bias). Exact IEEE float32 arithmetic, " +
	"correctly rounded. out may be exactly a or b (in place) but must not overlap them otherwise."

var add = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name:   "add",
		Doc:    "out[r][j] = a[r][j] + b[r][j] (b[0][j] when b_rows = 1)" + binaryDoc,
		Params: binaryParams(),
	},
	plan: func(args []Value, maxWork int) (*Plan, error) { return planBinary(args, maxWork, false) },
}

var mul = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name:   "mul",
		Doc:    "out[r][j] = a[r][j] * b[r][j] (b[0][j] when b_rows = 1)" + binaryDoc,
		Params: binaryParams(),
	},
	plan: func(args []Value, maxWork int) (*Plan, error) { return planBinary(args, maxWork, true) },
}

func planBinary(args []Value, maxWork int, product bool) (*Plan, error) {
	var c checker
	rows := c.size("rows", args[0].I64, 0)
	cols := c.size("cols", args[1].I64, 0)
	bRows := c.size("b_rows", args[2].I64, 0)
	if c.err == nil && bRows != 1 && bRows != rows {
		c.fail("b_rows = %d, want 1 or rows = %d", bRows, rows)
	}
	a := view[float32](&c, "a", args[3].Buf, "rows*cols", rows, cols)
	b := view[float32](&c, "b", args[4].Buf, "b_rows*cols", bRows, cols)
	out := view[float32](&c, "out", args[5].Buf, "rows*cols", rows, cols)
	inPlace(&c, "out", out, "a", a)
	inPlace(&c, "out", out, "b", b)
	if c.err != nil {
		return nil, c.err
	}
	if len(out) == 0 {
		return &Plan{}, nil
	}
	return runsPlan(rows, cols, maxWork, func(r, lo, hi int) error {
		ar := a[r*cols+lo : r*cols+hi]
		or := out[r*cols+lo : r*cols+hi][:len(ar)]
		br := b[lo:hi]
		if bRows != 1 {
			br = b[r*cols+lo : r*cols+hi]
		}
		br = br[:len(ar)]
		if product {
			for j, x := range ar {
				or[j] = x * br[j]
			}
			return nil
		}
		for j, x := range ar {
			or[j] = x + br[j]
		}
		return nil
	}), nil
}

// unaryParams is the signature of relu and silu; gelu adds approximate
// after n.
func unaryParams(extra ...api.Param) []api.Param {
	return append(append([]api.Param{i64Param("n")}, extra...),
		bufParam("x", api.AccessRead, 4, "n"), bufParam("out", api.AccessWrite, 4, "n"))
}

const unaryDoc = " for i < n. out may be exactly x (in place) but must not overlap it otherwise."

var relu = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name:   "relu",
		Doc:    "out[i] = x[i] if x[i] > 0 or x[i] is NaN, else +0," + unaryDoc,
		Params: unaryParams(),
	},
	plan: func(args []Value, maxWork int) (*Plan, error) {
		return planUnary(args[0].I64, args[1].Buf, args[2].Buf, vectorCost, maxWork, func(x float32) float32 {
			if x > 0 || x != x {
				return x
			}
			return 0
		})
	},
}

var silu = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "silu",
		Doc: "out[i] = x[i]*sigmoid(x[i]), computed in float64 as x/(1 + e^-x) and rounded to float32 once, " +
			"with an exponential that gives the same bits on every platform (within 1 ulp of float64's e^x): " +
			"within 1 ulp of float32 of the exact value," + unaryDoc,
		Params: unaryParams(),
	},
	plan: func(args []Value, maxWork int) (*Plan, error) {
		return planUnary(args[0].I64, args[1].Buf, args[2].Buf, expCost, maxWork, func(x float32) float32 {
			v := float64(x)
			return float32(v / (1 + exp(-v)))
		})
	},
}

// sqrt2OverPi is the √(2/π) of gelu's tanh form.
var sqrt2OverPi = math.Sqrt(2 / math.Pi)

var gelu = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "gelu",
		Doc: "GELU, computed in float64 and rounded to float32 once. approximate = 0: out[i] = " +
			"0.5*x*(1 + erf(x/sqrt(2))) (PyTorch's exact form); approximate = 1: out[i] = " +
			"0.5*x*(1 + tanh(u)) with u = sqrt(2/pi)*(x + 0.044715*x^3) (PyTorch's approximate='tanh', " +
			"GPT-2's), computed as x/(1 + e^(-2u)), the same value without the cancellation of 1 + tanh(u) " +
			"for negative x. erf and e^x give the same bits on every platform, within 1 ulp of float64: " +
			"within 1 ulp of float32 of the float64 formula," + unaryDoc,
		Params: unaryParams(i64Param("approximate")),
	},
	plan: func(args []Value, maxWork int) (*Plan, error) {
		var c checker
		f := geluErf
		if c.flag("approximate", args[1].I64) {
			f = geluTanh
		}
		if c.err != nil {
			return nil, c.err
		}
		return planUnary(args[0].I64, args[2].Buf, args[3].Buf, expCost, maxWork, f)
	},
}

func geluErf(x float32) float32 {
	v := float64(x)
	return float32(0.5 * v * (1 + erf(v/math.Sqrt2)))
}

func geluTanh(x float32) float32 {
	v := float64(x)
	u := float64(sqrt2OverPi * (v + float64(0.044715*(v*v*v))))
	return float32(v / (1 + exp(-2*u)))
}

// planUnary plans out[i] = f(x[i]) for i < n, each element costing cost.
func planUnary(nArg int64, xBuf, outBuf []byte, cost, maxWork int, f func(float32) float32) (*Plan, error) {
	var c checker
	n := c.size("n", nArg, 0)
	x := view[float32](&c, "x", xBuf, "n", n)
	out := view[float32](&c, "out", outBuf, "n", n)
	inPlace(&c, "out", out, "x", x)
	if c.err != nil {
		return nil, c.err
	}
	return evenPlan(len(out), cost, maxWork, func(lo, hi, _ int) error {
		o := out[lo:hi]
		for i, v := range x[lo:hi] {
			o[i] = f(v)
		}
		return nil
	}), nil
}
