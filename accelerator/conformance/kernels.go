package conformance

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// kernelCase is one launch of a kernel: its scalar arguments by parameter
// name, and the contents of its int32 input buffers (indices, which must be
// in range); float32 buffers get seeded random values, outputs included, so
// a kernel that fails to write an element shows.
type kernelCase struct {
	name   string
	kernel string
	i64    map[string]int64
	f32    map[string]float32
	i32    map[string][]int32
}

// cases has at least one case for every kernel of the catalog
// (TestCasesCoverCatalog checks it), with shapes that are not multiples of
// anything, empty bags, broadcasts and transposes.
var cases = []kernelCase{
	{name: "bags", kernel: "embedding_bag_sum",
		i64: map[string]int64{"rows": 5, "dim": 7, "nidx": 9, "nbags": 3},
		i32: map[string][]int32{"indices": {0, 4, 2, 2, 1, 3, 4, 0, 1}, "offsets": {0, 4, 4}}},
	{kernel: "fill_f32", i64: map[string]int64{"n": 1001}, f32: map[string]float32{"value": 1.5}},
	{kernel: "reduce_sum_f32", i64: map[string]int64{"n": 3001}},
	{kernel: "saxpy", i64: map[string]int64{"n": 2003}, f32: map[string]float32{"a": 0.75}},
	{kernel: "sgemm", i64: map[string]int64{"m": 13, "n": 17, "k": 19}, f32: map[string]float32{"alpha": 1.25, "beta": 0.5}},
	{name: "trans_a shared b", kernel: "matmul",
		i64: map[string]int64{"batch": 2, "m": 5, "n": 6, "k": 7, "trans_a": 1, "trans_b": 0, "b_batch": 1}},
	{name: "trans_b batched b", kernel: "matmul",
		i64: map[string]int64{"batch": 3, "m": 9, "n": 70, "k": 11, "trans_a": 0, "trans_b": 1, "b_batch": 3}},
	{name: "broadcast", kernel: "add", i64: map[string]int64{"rows": 7, "cols": 13, "b_rows": 1}},
	{kernel: "mul", i64: map[string]int64{"rows": 7, "cols": 13, "b_rows": 7}},
	{kernel: "relu", i64: map[string]int64{"n": 999}},
	{kernel: "silu", i64: map[string]int64{"n": 999}},
	{name: "erf", kernel: "gelu", i64: map[string]int64{"n": 999, "approximate": 0}},
	{name: "tanh", kernel: "gelu", i64: map[string]int64{"n": 999, "approximate": 1}},
	{name: "causal", kernel: "softmax", i64: map[string]int64{"rows": 6, "cols": 9, "q": 3, "causal": 1, "offset": 2},
		f32: map[string]float32{"scale": 0.5}},
	{kernel: "layer_norm", i64: map[string]int64{"rows": 4, "cols": 33}, f32: map[string]float32{"eps": 1e-5}},
	{kernel: "rms_norm", i64: map[string]int64{"rows": 4, "cols": 33}, f32: map[string]float32{"eps": 1e-6}},
	{kernel: "embedding", i64: map[string]int64{"n": 6, "vocab": 10, "dim": 5},
		i32: map[string][]int32{"ids": {9, 0, 3, 3, 7, 1}}},
	{kernel: "permute", i64: map[string]int64{"d0": 2, "d1": 3, "d2": 4, "d3": 5, "p0": 2, "p1": 0, "p2": 3, "p3": 1}},
	{kernel: "slice", i64: map[string]int64{"outer": 3, "mid": 7, "inner": 4, "start": 2, "len": 3}},
	{kernel: "concat", i64: map[string]int64{"outer": 2, "mid_a": 3, "mid_b": 4, "mid": 7, "inner": 5}},
	{kernel: "kv_append", i64: map[string]int64{"outer": 2, "cap": 8, "len": 3, "inner": 4, "pos": 4}},
	{name: "causal", kernel: "attention", i64: map[string]int64{"heads": 2, "t": 3, "d": 8, "cap": 6, "pos": 2, "causal": 1},
		f32: map[string]float32{"scale": 0.35}},
	{kernel: "argmax", i64: map[string]int64{"rows": 5, "cols": 11}},
}

// bufferAt is a kernel buffer argument as placed in device memory, with
// the bytes the reference run works on.
type bufferAt struct {
	param   int
	extents []api.Extent
	host    []byte // input, then the reference's result
	input   []byte // what was written to the device
}

// placer hands out device memory for kernel buffers: every buffer crosses
// a frame boundary or sits in two extents far apart, as the node's frames
// of one allocation may.
type placer struct{ near, far uint64 }

func newPlacer() *placer { return &placer{near: frame - 20, far: 3*frame + 8} }

func (p *placer) place(i int, n uint64) []api.Extent {
	if n == 0 {
		return []api.Extent{{Addr: p.near, Len: 0}}
	}
	if i%2 == 0 || n < 8 {
		x := api.Extent{Addr: p.near, Len: n}
		p.near += (n + 4 + 3) &^ 3 // a gap, so an overrun shows as a change
		return []api.Extent{x}
	}
	head := n / 2 &^ 3
	xs := []api.Extent{{Addr: p.near, Len: head}, {Addr: p.far, Len: n - head}}
	p.near += (head + 4 + 3) &^ 3
	p.far += (n - head + 4 + 3) &^ 3
	return xs
}

// build makes c's arguments for the device and writes its buffers there.
func (c kernelCase) build(t *testing.T, d accelerator.Device, k *kernels.Kernel, r *rand.Rand) ([]api.NodeArg, []*bufferAt) {
	t.Helper()
	ps := k.Info.Params
	wire := make([]api.Arg, len(ps)) // for KernelInfo.Extent
	args := make([]api.NodeArg, len(ps))
	for i, p := range ps {
		switch p.Kind {
		case api.ArgI64:
			v, ok := c.i64[p.Name]
			if !ok {
				t.Fatalf("case of %s has no value for %s", c.kernel, p.Name)
			}
			wire[i] = api.Arg{Kind: api.ArgI64, Bits: uint64(v)}
		case api.ArgF32:
			v, ok := c.f32[p.Name]
			if !ok {
				t.Fatalf("case of %s has no value for %s", c.kernel, p.Name)
			}
			wire[i] = api.Arg{Kind: api.ArgF32, Bits: api.F32Bits(v)}
		default:
			wire[i] = api.Arg{Kind: p.Kind}
		}
		args[i] = api.NodeArg{Kind: wire[i].Kind, Bits: wire[i].Bits}
	}
	pl := newPlacer()
	var bufs []*bufferAt
	for i, p := range ps {
		if p.Kind != api.ArgBuffer {
			continue
		}
		n, ok := k.Info.Extent(i, wire)
		if !ok {
			t.Fatalf("%s: extent of %s undetermined by the case", c.kernel, p.Name)
		}
		b := &bufferAt{param: i, extents: pl.place(len(bufs), n), host: make([]byte, n)}
		if ids, ok := c.i32[p.Name]; ok {
			if uint64(len(ids))*4 != n {
				t.Fatalf("%s: %d values for %s of %d bytes", c.kernel, len(ids), p.Name, n)
			}
			for j, v := range ids {
				binary.LittleEndian.PutUint32(b.host[4*j:], uint32(v))
			}
		} else {
			for j := 0; j+4 <= len(b.host); j += 4 {
				binary.LittleEndian.PutUint32(b.host[j:], math.Float32bits(float32(r.NormFloat64())))
			}
		}
		b.input = bytes.Clone(b.host)
		write(t, d, b.host, b.extents...)
		args[i].Extents = b.extents
		bufs = append(bufs, b)
	}
	return args, bufs
}

func testKernels(t *testing.T, d accelerator.Device, o Options) {
	if m := uncovered(); len(m) > 0 {
		t.Errorf("kernels of the catalog without a conformance case: %v", m)
	}
	r := rng()
	for _, c := range cases {
		name := c.kernel
		if c.name != "" {
			name += "/" + c.name
		}
		t.Run(name, func(t *testing.T) {
			k, err := kernels.Lookup(c.kernel)
			if err != nil {
				t.Fatal(err)
			}
			// Whole, and in slices as small as the kernel cuts them.
			for _, maxWork := range []int{math.MaxInt, 1} {
				args, bufs := c.build(t, d, k, r)
				vals := make([]kernels.Value, len(args))
				for i, a := range args {
					vals[i] = kernels.Scalar(a)
				}
				for _, b := range bufs {
					vals[b.param].Buf = b.host
				}
				if err := k.Run(vals); err != nil {
					t.Fatalf("reference run: %v", err)
				}
				if err := Launch(d, k, args, maxWork); err != nil {
					t.Fatalf("launch (maxWork %d): %v", maxWork, err)
				}
				for _, b := range bufs {
					p := k.Info.Params[b.param]
					got := read(t, d, b.extents...)
					what := fmt.Sprintf("%s (maxWork %d)", p.Name, maxWork)
					if p.Access < api.AccessWrite {
						same(t, what+", an input", got, b.input)
						continue
					}
					compare(t, what, got, b.host, p.DType == api.DTypeI32, o.MaxRelErr)
				}
			}
		})
	}
}

// compare checks a kernel's result against the reference's: bit for bit
// where exact, else within maxRel of max(1, |want|) per float32.
func compare(t *testing.T, what string, got, want []byte, exact bool, maxRel float64) {
	t.Helper()
	if exact || maxRel == 0 {
		same(t, what, got, want)
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := 0; i+4 <= len(got); i += 4 {
		g := float64(math.Float32frombits(binary.LittleEndian.Uint32(got[i:])))
		w := float64(math.Float32frombits(binary.LittleEndian.Uint32(want[i:])))
		if math.IsNaN(w) != math.IsNaN(g) || math.Abs(g-w) > maxRel*max(1, math.Abs(w)) {
			t.Fatalf("%s: element %d is %v, want %v (within %g)", what, i/4, g, w, maxRel)
		}
	}
}

func testKernelErrors(t *testing.T, d accelerator.Device) {
	r := rng()
	k, err := kernels.Lookup("embedding")
	if err != nil {
		t.Fatal(err)
	}
	c := cases[0]
	for _, cc := range cases {
		if cc.kernel == "embedding" {
			c = cc
		}
	}
	// Too few arguments.
	args, _ := c.build(t, d, k, r)
	_, _, err = d.Prepare(k, args[:len(args)-1], math.MaxInt)
	WantErr(t, "too few arguments", err, api.ErrInvalidArgument, "embedding")
	// An index out of range: refused, and nothing written.
	bad := c
	bad.i32 = map[string][]int32{"ids": {0, 1, 2, 10, 3, 4}}
	args, bufs := bad.build(t, d, k, r)
	out := bufs[len(bufs)-1]
	err = Launch(d, k, args, math.MaxInt)
	WantErr(t, "an id outside the vocabulary", err, api.ErrInvalidArgument, "ids[3] = 10")
	same(t, "out of a refused launch", read(t, d, out.extents...), out.input)
	// A buffer shorter than its sizes need.
	args[len(args)-1].Extents = []api.Extent{{Addr: out.extents[0].Addr, Len: out.extents[0].Len - 4}}
	err = Launch(d, k, args, math.MaxInt)
	WantErr(t, "a short output buffer", err, api.ErrInvalidArgument, "out")
	// A buffer outside memory.
	args[len(args)-1].Extents = []api.Extent{{Addr: d.Info().Memory - 4, Len: 120}}
	err = Launch(d, k, args, math.MaxInt)
	WantErr(t, "an output outside memory", err, api.ErrInvalidAddress)
}

// uncovered lists the catalog's kernels that have no case here: the suite
// fails while there are any.
func uncovered() []string {
	have := map[string]bool{}
	for _, c := range cases {
		have[c.kernel] = true
	}
	var missing []string
	for _, info := range kernels.Catalog() {
		if !have[info.Name] {
			missing = append(missing, info.Name)
		}
	}
	return missing
}
