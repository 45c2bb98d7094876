package kernels

import (
	"slices"

	"github.com/vgpu/vgpu/api"
)

// The vector kernels run on the caller's goroutine: they do one or two
// memory operations per element, so they are bound by memory bandwidth.

var fillF32 = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name:   "fill_f32",
		Doc:    "x[i] = value for 0 <= i < n.",
		Params: []api.Param{bufParam("x", api.AccessWrite, 4, "n"), i64Param("n"), f32Param("value")},
	},
	plan: planFillF32,
}

func planFillF32(args []Value, maxWork int) (*Plan, error) {
	var c checker
	n := c.size("n", args[1].I64, 0)
	x := view[float32](&c, "x", args[0].Buf, "n", n)
	if c.err != nil {
		return nil, c.err
	}
	value := args[2].F32
	return evenPlan(len(x), vectorCost, maxWork, func(lo, hi, _ int) error {
		s := x[lo:hi]
		for i := range s {
			s[i] = value
		}
		return nil
	}), nil
}

var saxpy = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "saxpy",
		Doc: "y[i] = a*x[i] + y[i] for 0 <= i < n; the product is rounded to float32 " +
			"before the sum (no fused multiply-add). x and y may overlap: x is read as it was before the launch.",
		Params: []api.Param{i64Param("n"), f32Param("a"), bufParam("x", api.AccessRead, 4, "n"), bufParam("y", api.AccessReadWrite, 4, "n")},
	},
	plan: planSaxpy,
}

func planSaxpy(args []Value, maxWork int) (*Plan, error) {
	var c checker
	n := c.size("n", args[0].I64, 0)
	x := view[float32](&c, "x", args[2].Buf, "n", n)
	y := view[float32](&c, "y", args[3].Buf, "n", n)
	if c.err != nil {
		return nil, c.err
	}
	a := args[1].F32
	y = y[:len(x)]
	if overlap(x, y) {
		// As Doc promises. A device hands over a buffer that lies in
		// several runs of its memory as a copy, which overlaps nothing,
		// so this is what any layout of x and y gives.
		x = slices.Clone(x)
	}
	return evenPlan(len(x), vectorCost, maxWork, func(lo, hi, _ int) error {
		ys := y[lo:hi]
		for i, xv := range x[lo:hi] {
			// The conversion forbids fusing into an FMA, whose single
			// rounding would make results differ between platforms.
			ys[i] = float32(a*xv) + ys[i]
		}
		return nil
	}), nil
}

var reduceSumF32 = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "reduce_sum_f32",
		Doc: "out[0] = x[0] + ... + x[n-1], accumulated in float64 in index order and rounded to float32 once " +
			"at the end; n = 0 gives 0.",
		Params: []api.Param{i64Param("n"), bufParam("x", api.AccessRead, 4, "n"), bufParam("out", api.AccessWrite, 4)},
	},
	plan: planReduceSumF32,
}

func planReduceSumF32(args []Value, maxWork int) (*Plan, error) {
	var c checker
	n := c.size("n", args[0].I64, 0)
	x := view[float32](&c, "x", args[1].Buf, "n", n)
	out := view[float32](&c, "out", args[2].Buf, "1", 1)
	if c.err != nil {
		return nil, c.err
	}
	if len(x) == 0 {
		return whole(func() error { out[0] = 0; return nil }), nil
	}
	// float64 holds every float32 exactly and keeps the rounding error of a
	// long sum small; one goroutine, and slices that run in order and carry
	// the sum, keep the order, and so the result, fixed. out is written once,
	// by the last slice, as when the kernel ran whole.
	var sum float64
	p := evenPlan(len(x), vectorCost, maxWork, func(lo, hi, _ int) error {
		for _, v := range x[lo:hi] {
			sum += float64(v)
		}
		if hi == len(x) {
			out[0] = float32(sum)
		}
		return nil
	})
	return p, nil
}
