package kernels

import "github.com/vgpu/vgpu/api"

var attention = &Kernel{
	Info: api.KernelInfo{
		Name: "attention",
		Doc: "Scaled dot-product attention over a KV cache, per head h < heads and query i < t: q is heads x t " +
			"x d, k and v heads x cap x d (the cache), out heads x t x d. Query i sits at position pos+i and " +
			"attends to the keys j <= pos+i if causal = 1, j < pos+t if causal = 0; pos + t <= cap. In " +
			"float64: s[j] = scale * (the sum over c of q[h][i][c]*k[h][j][c] in c order), m = the largest " +
			"s[j], e[j] = e^(s[j]-m), sum = the e[j] in j order, out[h][i][c] = (the sum over j in j order of " +
			"e[j]*v[h][j][c]) / sum, rounded to float32 once; every product rounded on its own (no fused " +
			"multiply-add). e^x gives the same bits on every platform (within 1 ulp of float64's). The " +
			"(head, query) rows spread over the device's workers; out must not overlap q, k or v.",
		Params: []api.Param{
			i64Param("heads"), i64Param("t"), i64Param("d"), i64Param("cap"), i64Param("pos"),
			i64Param("causal"), f32Param("scale"),
			bufParam("q", api.AccessRead, 4, "heads", "t", "d"),
			bufParam("k", api.AccessRead, 4, "heads", "cap", "d"),
			bufParam("v", api.AccessRead, 4, "heads", "cap", "d"),
			bufParam("out", api.AccessWrite, 4, "heads", "t", "d"),
		},
	},
	plan: planAttention,
}

func planAttention(args []Value, maxWork int) (*Plan, error) {
	var c checker
	heads := c.size("heads", args[0].I64, 0)
	t := c.size("t", args[1].I64, 0)
	d := c.size("d", args[2].I64, 0)
	capacity := c.size("cap", args[3].I64, 0)
	pos := c.size("pos", args[4].I64, 0)
	causal := c.flag("causal", args[5].I64)
	c.fits("pos", pos, "t", t, "cap", capacity)
	q := view[float32](&c, "q", args[7].Buf, "heads*t*d", heads, t, d)
	k := view[float32](&c, "k", args[8].Buf, "heads*cap*d", heads, capacity, d)
	v := view[float32](&c, "v", args[9].Buf, "heads*cap*d", heads, capacity, d)
	out := view[float32](&c, "out", args[10].Buf, "heads*t*d", heads, t, d)
	disjoint(&c, "out", out, "q", q)
	disjoint(&c, "out", out, "k", k)
	disjoint(&c, "out", out, "v", v)
	if c.err != nil {
		return nil, c.err
	}
	if len(out) == 0 {
		return &Plan{}, nil
	}
	// heads, t and d are at least 1 now, so k's view bounds cap, and the
	// scores of a row, pos+t of them at most, fit in memory.
	scale := float64(args[6].F32)
	keys := pos + t
	// A row of (head, query) computes a dot product and a weighted sum of
	// d for each key, and an exponential: the rows are the pieces.
	return rowPlan(heads*t, satMul(keys, 2*d+expCost), maxWork, func(lo, hi int) error {
		s, acc := make([]float64, keys), make([]float64, d)
		for row := lo; row < hi; row++ {
			h, i := row/t, row%t
			n := keys
			if causal {
				n = pos + i + 1
			}
			qr := q[row*d : (row+1)*d]
			kh, vh := k[h*capacity*d:(h+1)*capacity*d], v[h*capacity*d:(h+1)*capacity*d]
			sr := s[:n]
			scores(sr, qr, kh, scale)
			sum := expShift(sr)
			weigh(acc, sr, vh)
			or := out[row*d : (row+1)*d][:len(acc)]
			for c, a := range acc {
				or[c] = float32(a / sum)
			}
		}
		return nil
	}), nil
}

// scores sets s[j] = scale·(q·k[j]) in float64, each dot product summed in
// index order, for the keys k[j] = kh[j·d : (j+1)·d], d = len(q). Four keys
// at a time keep four independent sums in flight, where one would wait on
// each add; a product of two float32s is exact in float64, so fusing
// cannot change it.
func scores(s []float64, q, kh []float32, scale float64) {
	d := len(q)
	j := 0
	for ; j+4 <= len(s); j += 4 {
		k0 := kh[j*d : (j+1)*d][:d]
		k1 := kh[(j+1)*d : (j+2)*d][:d]
		k2 := kh[(j+2)*d : (j+3)*d][:d]
		k3 := kh[(j+3)*d : (j+4)*d][:d]
		var d0, d1, d2, d3 float64
		for c, qv := range q {
			x := float64(qv)
			d0 += x * float64(k0[c])
			d1 += x * float64(k1[c])
			d2 += x * float64(k2[c])
			d3 += x * float64(k3[c])
		}
		s[j], s[j+1], s[j+2], s[j+3] = float64(scale*d0), float64(scale*d1), float64(scale*d2), float64(scale*d3)
	}
	for ; j < len(s); j++ {
		kj := kh[j*d : (j+1)*d][:d]
		var dot float64
		for c, qv := range q {
			dot += float64(qv) * float64(kj[c])
		}
		s[j] = float64(scale * dot)
	}
}

// weigh sets acc[c] to the sum over j of w[j]·v[j][c] in j order, for the
// values v[j] = vh[j·d : (j+1)·d], d = len(acc), every product rounded
// before its add. Four values at a time chain four adds of each acc[c]
// through a register, as sgemmPart does, keeping the order.
func weigh(acc, w []float64, vh []float32) {
	d := len(acc)
	clear(acc)
	j := 0
	for ; j+4 <= len(w); j += 4 {
		w0, w1, w2, w3 := w[j], w[j+1], w[j+2], w[j+3]
		v0 := vh[j*d : (j+1)*d][:d]
		v1 := vh[(j+1)*d : (j+2)*d][:d]
		v2 := vh[(j+2)*d : (j+3)*d][:d]
		v3 := vh[(j+3)*d : (j+4)*d][:d]
		for c, a := range acc {
			a += float64(w0 * float64(v0[c]))
			a += float64(w1 * float64(v1[c]))
			a += float64(w2 * float64(v2[c]))
			a += float64(w3 * float64(v3[c]))
			acc[c] = a
		}
	}
	for ; j < len(w); j++ {
		vj := vh[j*d : (j+1)*d][:d]
		for c, vv := range vj {
			acc[c] += float64(w[j] * float64(vv))
		}
	}
}
