package kernels

import "github.com/vgpu/vgpu/api"

// The vector kernels run on the caller's goroutine: they do one or two
// memory operations per element, so they are bound by memory bandwidth, and
// a single pass in index order keeps overlapping arguments deterministic.

var fillF32 = &Kernel{
	Info: api.KernelInfo{
		Name:   "fill_f32",
		Doc:    "x[i] = value for 0 <= i < n.",
		Params: []api.Param{bufParam("x", api.AccessWrite, 4, "n"), i64Param("n"), f32Param("value")},
	},
	run: runFillF32,
}

func runFillF32(args []Value) error {
	var c checker
	n := c.size("n", args[1].I64, 0)
	x := view[float32](&c, "x", args[0].Buf, "n", n)
	if c.err != nil {
		return c.err
	}
	value := args[2].F32
	for i := range x {
		x[i] = value
	}
	return nil
}

var saxpy = &Kernel{
	Info: api.KernelInfo{
		Name: "saxpy",
		Doc: "y[i] = a*x[i] + y[i] for 0 <= i < n, in index order; the product is rounded to float32 " +
			"before the sum (no fused multiply-add). x and y may overlap.",
		Params: []api.Param{i64Param("n"), f32Param("a"), bufParam("x", api.AccessRead, 4, "n"), bufParam("y", api.AccessReadWrite, 4, "n")},
	},
	run: runSaxpy,
}

func runSaxpy(args []Value) error {
	var c checker
	n := c.size("n", args[0].I64, 0)
	x := view[float32](&c, "x", args[2].Buf, "n", n)
	y := view[float32](&c, "y", args[3].Buf, "n", n)
	if c.err != nil {
		return c.err
	}
	a := args[1].F32
	y = y[:len(x)]
	for i, xv := range x {
		// The conversion forbids fusing into an FMA, whose single rounding
		// would make results differ between platforms.
		y[i] = float32(a*xv) + y[i]
	}
	return nil
}

var reduceSumF32 = &Kernel{
	Info: api.KernelInfo{
		Name: "reduce_sum_f32",
		Doc: "out[0] = x[0] + ... + x[n-1], accumulated in float64 in index order and rounded to float32 once " +
			"at the end; n = 0 gives 0.",
		Params: []api.Param{i64Param("n"), bufParam("x", api.AccessRead, 4, "n"), bufParam("out", api.AccessWrite, 4)},
	},
	run: runReduceSumF32,
}

func runReduceSumF32(args []Value) error {
	var c checker
	n := c.size("n", args[0].I64, 0)
	x := view[float32](&c, "x", args[1].Buf, "n", n)
	out := view[float32](&c, "out", args[2].Buf, "1", 1)
	if c.err != nil {
		return c.err
	}
	// float64 holds every float32 exactly and keeps the rounding error of a
	// long sum small; one goroutine keeps the order, and so the result, fixed.
	var sum float64
	for _, v := range x {
		sum += float64(v)
	}
	out[0] = float32(sum)
	return nil
}
