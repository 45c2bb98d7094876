package client

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
)

// The builder writes exactly the api.GraphDef it describes, which survives
// the wire and passes the graph check against a catalog of the kernels it
// names.
func TestGraphDefBuildsTheWireGraph(t *testing.T) {
	b := NewGraphDef("axpy")
	pos := b.Scalar("pos")
	w := b.Weight("w", api.DTypeF32, 0x1000, 2, 3)
	kv := b.KVCache("kv", api.DTypeF32, 0x2000, 6)
	x := b.Input("x", api.DTypeF32, 6)
	y := b.Activation("y", api.DTypeF32, 6)
	out := b.Output("out", api.DTypeF32, 6)
	b.Op(api.PhaseDecode, "scale", Int(6), Float(0.5), x, y)
	b.Op(api.PhasePrefill, "mix", Int(6), pos.Times(2).Plus(1), y, w, kv, out)
	want := api.GraphDef{
		Name:    "axpy",
		Scalars: []string{"pos"},
		Tensors: []api.TensorDef{
			{Name: "w", DType: api.DTypeF32, Shape: []int64{2, 3}, Residency: api.ResWeight, Addr: 0x1000},
			{Name: "kv", DType: api.DTypeF32, Shape: []int64{6}, Residency: api.ResKVCache, Addr: 0x2000},
			{Name: "x", DType: api.DTypeF32, Shape: []int64{6}, Residency: api.ResInput},
			{Name: "y", DType: api.DTypeF32, Shape: []int64{6}, Residency: api.ResActivation},
			{Name: "out", DType: api.DTypeF32, Shape: []int64{6}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{
			{Kernel: "scale", Phase: api.PhaseDecode, Args: []api.OpArg{
				{Kind: api.OpArgI64, I64: 6}, {Kind: api.OpArgF32, F32: 0.5},
				{Kind: api.OpArgTensor, Tensor: uint32(x)}, {Kind: api.OpArgTensor, Tensor: uint32(y)}}},
			{Kernel: "mix", Phase: api.PhasePrefill, Args: []api.OpArg{
				{Kind: api.OpArgI64, I64: 6}, {Kind: api.OpArgScalar, Scalar: uint32(pos), Mul: 2, I64: 1},
				{Kind: api.OpArgTensor, Tensor: uint32(y)}, {Kind: api.OpArgTensor, Tensor: uint32(w)},
				{Kind: api.OpArgTensor, Tensor: uint32(kv)}, {Kind: api.OpArgTensor, Tensor: uint32(out)}}},
		},
	}
	if !reflect.DeepEqual(*b.Def(), want) {
		t.Fatalf("built\n%+v\nwant\n%+v", *b.Def(), want)
	}
	var back api.GraphDef
	if err := api.Decode(api.Encode(b.Def()), &back); err != nil || !reflect.DeepEqual(back, want) {
		t.Fatalf("after the wire: %v\n%+v", err, back)
	}
	buf := func(name string, access api.Access, dims ...string) api.Param {
		return api.Param{Name: name, Kind: api.ArgBuffer, Access: access, Elem: 4, Dims: dims, DType: api.DTypeF32}
	}
	i64 := func(name string) api.Param { return api.Param{Name: name, Kind: api.ArgI64} }
	catalog := map[string]api.KernelInfo{
		"scale": {Name: "scale", Params: []api.Param{i64("n"), {Name: "a", Kind: api.ArgF32}, buf("x", api.AccessRead, "n"), buf("y", api.AccessWrite, "n")}},
		"mix": {Name: "mix", Params: []api.Param{i64("n"), i64("at"), buf("y", api.AccessRead, "n"), buf("w", api.AccessRead, "n"),
			buf("kv", api.AccessReadWrite, "n"), buf("out", api.AccessWrite, "n")}},
	}
	if _, err := api.CheckGraph(b.Def(), catalog); err != nil {
		t.Fatalf("check: %v", err)
	}
}

func TestTensorBytes(t *testing.T) {
	for _, c := range []struct {
		shape []int64
		want  uint64
		err   string
	}{
		{[]int64{3}, 12, ""},
		{[]int64{2, 3, 4, 5}, 480, ""},
		{[]int64{2, 0}, 0, "dimension 1 is 0"},
		{[]int64{-1}, 0, "dimension 0 is -1"},
		{[]int64{1 << 31, 1 << 31}, 0, "overflow"},
		{[]int64{1 << 62}, 0, "overflow"},
	} {
		n, err := TensorBytes(api.DTypeF32, c.shape)
		if c.err == "" && (err != nil || n != c.want) || c.err != "" && (!errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("TensorBytes(%v) = %d, %v; want %d, %q", c.shape, n, err, c.want, c.err)
		}
	}
}

// Mistakes the SDK can see are refused before anything is sent, naming
// the tensor: here the client has no connection, so a request would fail
// otherwise.
func TestGraphMistakesRefusedBeforeSending(t *testing.T) {
	c := &Client{}
	b := NewGraphDef("g")
	b.Input("ids", api.DTypeI32, 4)
	b.Weight("w", api.DTypeF32, 0, 4)
	if _, err := c.RegisterGraph(b); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "tensor 1 (w, weight)") {
		t.Errorf("weight without an allocation: %v", err)
	}
	b = NewGraphDef("g")
	b.Output("huge", api.DTypeF32, 1<<40, 1<<40)
	if _, err := c.RegisterGraph(b); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "tensor 0 (huge)") {
		t.Errorf("huge output: %v", err)
	}

	g := &TensorGraph{c: c, name: "g", inputs: []graphIO{{tensor: 2, name: "ids", size: 16}, {tensor: 5, name: "mask", size: 4}}}
	for _, c := range []struct {
		in   [][]byte
		want string
	}{
		{[][]byte{make([]byte, 16)}, "takes 2 inputs, got 1"},
		{[][]byte{make([]byte, 16), make([]byte, 8)}, "input tensor 5 (mask) holds 4 bytes, got 8"},
		{[][]byte{make([]byte, 12), make([]byte, 8)}, "input tensor 2 (ids) holds 16 bytes, got 12"},
	} {
		if _, err := g.Invoke(nil, c.in...); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Invoke of %d inputs: %v, want %q", len(c.in), err, c.want)
		}
	}
}

// Whatever a builder is asked to build survives the wire exactly.
func TestGraphDefSurvivesTheWire(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		b := NewGraphDef(rapid.String().Draw(rt, "name"))
		scalars := rapid.IntRange(0, api.MaxGraphScalars).Draw(rt, "scalars")
		for range scalars {
			b.Scalar(rapid.StringN(0, 8, -1).Draw(rt, "scalar"))
		}
		dtype := rapid.SampledFrom([]api.DType{api.DTypeF32, api.DTypeI32})
		shape := rapid.SliceOfN(rapid.Int64Range(1, 1<<20), 1, api.MaxTensorDims)
		for range rapid.IntRange(1, 20).Draw(rt, "tensors") {
			name, dt, sh := rapid.StringN(0, 12, -1).Draw(rt, "tensor"), dtype.Draw(rt, "dtype"), shape.Draw(rt, "shape")
			switch rapid.IntRange(0, 4).Draw(rt, "residency") {
			case 0:
				b.Weight(name, dt, Ptr(rapid.Uint64Min(1).Draw(rt, "addr")), sh...)
			case 1:
				b.KVCache(name, dt, Ptr(rapid.Uint64Min(1).Draw(rt, "addr")), sh...)
			case 2:
				b.Input(name, dt, sh...)
			case 3:
				b.Output(name, dt, sh...)
			default:
				b.Activation(name, dt, sh...)
			}
		}
		for range rapid.IntRange(0, 20).Draw(rt, "ops") {
			var args []GraphArg
			for range rapid.IntRange(0, 12).Draw(rt, "args") {
				switch rapid.IntRange(0, 3).Draw(rt, "kind") {
				case 0:
					args = append(args, Tensor(rapid.Uint32().Draw(rt, "tensor")))
				case 1:
					args = append(args, Int(rapid.Int64().Draw(rt, "int")))
				case 2:
					args = append(args, Float(rapid.Float32().Draw(rt, "float")))
				default:
					s := Scalar(rapid.Uint32().Draw(rt, "scalar"))
					args = append(args, s.Times(rapid.Int64().Draw(rt, "mul")).Plus(rapid.Int64().Draw(rt, "add")))
				}
			}
			b.Op(api.Phase(rapid.IntRange(0, 4).Draw(rt, "phase")), rapid.StringN(1, 16, -1).Draw(rt, "kernel"), args...)
		}
		var back api.GraphDef
		if err := api.Decode(api.Encode(b.Def()), &back); err != nil {
			rt.Fatal(err)
		}
		want := *b.Def()
		if want.Scalars == nil {
			want.Scalars = []string{}
		}
		for i := range want.Ops {
			if want.Ops[i].Args == nil {
				want.Ops[i].Args = []api.OpArg{}
			}
		}
		if want.Ops == nil {
			want.Ops = []api.OpDef{}
		}
		if !reflect.DeepEqual(back, want) {
			rt.Fatalf("after the wire\n%+v\nbuilt\n%+v", back, want)
		}
	})
}
