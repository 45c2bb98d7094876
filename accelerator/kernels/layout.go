package kernels

import "github.com/vgpu/vgpu/api"

// The layout kernels move elements without changing them: permute, slice,
// concat and kv_append copy runs of their innermost dimension. They are
// memory-bound and run on the caller's goroutine; a slice may cut a run.
// Their outputs must not overlap their inputs, whose elements they would
// otherwise read after writing them.

var permute = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "permute",
		Doc: "out = x permuted: x is d0 x d1 x d2 x d3 row-major, (p0, p1, p2, p3) a permutation of (0, 1, 2, 3), " +
			"and out, of shape (d[p0], d[p1], d[p2], d[p3]), holds out[i0][i1][i2][i3] = x[j] where j[p_k] = " +
			"i_k, as PyTorch's x.permute(p0, p1, p2, p3). Fewer dimensions are leading 1s. out must not " +
			"overlap x.",
		Params: []api.Param{
			i64Param("d0"), i64Param("d1"), i64Param("d2"), i64Param("d3"),
			i64Param("p0"), i64Param("p1"), i64Param("p2"), i64Param("p3"),
			bufParam("x", api.AccessRead, 4, "d0", "d1", "d2", "d3"),
			bufParam("out", api.AccessWrite, 4, "d0", "d1", "d2", "d3"),
		},
	},
	plan: planPermute,
}

var (
	dimNames  = [4]string{"d0", "d1", "d2", "d3"}
	axisNames = [4]string{"p0", "p1", "p2", "p3"}
)

func planPermute(args []Value, maxWork int) (*Plan, error) {
	var c checker
	var d, p [4]int
	for i := range d {
		d[i] = c.size(dimNames[i], args[i].I64, 0)
	}
	var seen [4]bool
	for i := range p {
		p[i] = c.size(axisNames[i], args[4+i].I64, 0)
		if c.err == nil && p[i] > 3 {
			c.fail("%s = %d, want an axis in [0, 3]", axisNames[i], p[i])
		}
		if c.err == nil && seen[p[i]] {
			c.fail("(p0, p1, p2, p3) = (%d, %d, %d, %d) is not a permutation of (0, 1, 2, 3)",
				args[4].I64, args[5].I64, args[6].I64, args[7].I64)
		}
		if c.err == nil {
			seen[p[i]] = true
		}
	}
	x := view[float32](&c, "x", args[8].Buf, "d0*d1*d2*d3", d[:]...)
	out := view[float32](&c, "out", args[9].Buf, "d0*d1*d2*d3", d[:]...)
	disjoint(&c, "out", out, "x", x)
	if c.err != nil {
		return nil, c.err
	}
	if len(out) == 0 {
		return &Plan{}, nil
	}
	// out's shape, and for each of its axes the stride of x along it.
	xStride := [4]int{d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}
	var od, os [4]int
	for i := range p {
		od[i], os[i] = d[p[i]], xStride[p[i]]
	}
	return runsPlan(od[0]*od[1]*od[2], od[3], maxWork, func(r, lo, hi int) error {
		i2, i01 := r%od[2], r/od[2]
		src := i01/od[1]*os[0] + i01%od[1]*os[1] + i2*os[2] + lo*os[3]
		o := out[r*od[3]+lo : r*od[3]+hi]
		for q := range o {
			o[q] = x[src]
			src += os[3]
		}
		return nil
	}), nil
}

var slice = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "slice",
		Doc: "dst[o][j][:] = src[o][start+j][:] for o < outer, j < len: src is outer x mid x inner, dst outer x " +
			"len x inner, as PyTorch's narrow(1, start, len) of src viewed as (outer, mid, inner). start + " +
			"len <= mid. dst must not overlap src.",
		Params: []api.Param{
			i64Param("outer"), i64Param("mid"), i64Param("inner"), i64Param("start"), i64Param("len"),
			bufParam("src", api.AccessRead, 4, "outer", "mid", "inner"),
			bufParam("dst", api.AccessWrite, 4, "outer", "len", "inner"),
		},
	},
	plan: planSlice,
}

func planSlice(args []Value, maxWork int) (*Plan, error) {
	var c checker
	outer := c.size("outer", args[0].I64, 0)
	mid := c.size("mid", args[1].I64, 0)
	inner := c.size("inner", args[2].I64, 0)
	start := c.size("start", args[3].I64, 0)
	n := c.size("len", args[4].I64, 0)
	c.fits("start", start, "len", n, "mid", mid)
	src := view[float32](&c, "src", args[5].Buf, "outer*mid*inner", outer, mid, inner)
	dst := view[float32](&c, "dst", args[6].Buf, "outer*len*inner", outer, n, inner)
	disjoint(&c, "dst", dst, "src", src)
	if c.err != nil {
		return nil, c.err
	}
	if len(dst) == 0 {
		return &Plan{}, nil
	}
	return planCopyRows(dst, n, 0, src, mid, start, outer, n, inner, maxWork), nil
}

var concat = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "concat",
		Doc: "out[o] = a[o] followed by b[o] for o < outer: a is outer x mid_a x inner, b outer x mid_b x " +
			"inner, out outer x mid x inner with mid = mid_a + mid_b, as PyTorch's cat((a, b), 1) of the " +
			"three viewed so. out must not overlap a or b.",
		Params: []api.Param{
			i64Param("outer"), i64Param("mid_a"), i64Param("mid_b"), i64Param("mid"), i64Param("inner"),
			bufParam("a", api.AccessRead, 4, "outer", "mid_a", "inner"),
			bufParam("b", api.AccessRead, 4, "outer", "mid_b", "inner"),
			bufParam("out", api.AccessWrite, 4, "outer", "mid", "inner"),
		},
	},
	plan: planConcat,
}

func planConcat(args []Value, maxWork int) (*Plan, error) {
	var c checker
	outer := c.size("outer", args[0].I64, 0)
	midA := c.size("mid_a", args[1].I64, 0)
	midB := c.size("mid_b", args[2].I64, 0)
	mid := c.size("mid", args[3].I64, 0)
	inner := c.size("inner", args[4].I64, 0)
	if c.err == nil && (midA > mid || mid-midA != midB) {
		c.fail("mid = %d, want mid_a + mid_b = %d + %d", mid, midA, midB)
	}
	a := view[float32](&c, "a", args[5].Buf, "outer*mid_a*inner", outer, midA, inner)
	b := view[float32](&c, "b", args[6].Buf, "outer*mid_b*inner", outer, midB, inner)
	out := view[float32](&c, "out", args[7].Buf, "outer*mid*inner", outer, mid, inner)
	disjoint(&c, "out", out, "a", a)
	disjoint(&c, "out", out, "b", b)
	if c.err != nil {
		return nil, c.err
	}
	if len(out) == 0 {
		return &Plan{}, nil
	}
	return runsPlan(outer*mid, inner, maxWork, func(r, lo, hi int) error {
		o, j := r/mid, r%mid
		src, s := a, (o*midA+j)*inner
		if j >= midA {
			src, s = b, (o*midB+j-midA)*inner
		}
		copy(out[r*inner+lo:r*inner+hi], src[s+lo:s+hi])
		return nil
	}), nil
}

var kvAppend = &Kernel{
	serial: true,
	Info: api.KernelInfo{
		Name: "kv_append",
		Doc: "cache[o][pos+j][:] = src[o][j][:] for o < outer, j < len: src is outer x len x inner, cache " +
			"outer x cap x inner (a KV cache of cap positions per head); the rest of cache is left as it " +
			"was. pos + len <= cap. src must not overlap cache.",
		Params: []api.Param{
			i64Param("outer"), i64Param("cap"), i64Param("len"), i64Param("inner"), i64Param("pos"),
			bufParam("src", api.AccessRead, 4, "outer", "len", "inner"),
			bufParam("cache", api.AccessReadWrite, 4, "outer", "cap", "inner"),
		},
	},
	plan: planKVAppend,
}

func planKVAppend(args []Value, maxWork int) (*Plan, error) {
	var c checker
	outer := c.size("outer", args[0].I64, 0)
	capacity := c.size("cap", args[1].I64, 0)
	n := c.size("len", args[2].I64, 0)
	inner := c.size("inner", args[3].I64, 0)
	pos := c.size("pos", args[4].I64, 0)
	c.fits("pos", pos, "len", n, "cap", capacity)
	src := view[float32](&c, "src", args[5].Buf, "outer*len*inner", outer, n, inner)
	cache := view[float32](&c, "cache", args[6].Buf, "outer*cap*inner", outer, capacity, inner)
	disjoint(&c, "cache", cache, "src", src)
	if c.err != nil {
		return nil, c.err
	}
	if len(src) == 0 {
		return &Plan{}, nil
	}
	return planCopyRows(cache, capacity, pos, src, n, 0, outer, n, inner, maxWork), nil
}

// planCopyRows plans dst[o][dstAt+j][:] = src[o][srcAt+j][:] for o < outer
// and j < n, where dst is outer x dstMid x inner and src outer x srcMid x
// inner, both checked; outer*n*inner > 0.
func planCopyRows(dst []float32, dstMid, dstAt int, src []float32, srcMid, srcAt, outer, n, inner, maxWork int) *Plan {
	return runsPlan(outer*n, inner, maxWork, func(r, lo, hi int) error {
		o, j := r/n, r%n
		d, s := (o*dstMid+dstAt+j)*inner, (o*srcMid+srcAt+j)*inner
		copy(dst[d+lo:d+hi], src[s+lo:s+hi])
		return nil
	})
}
