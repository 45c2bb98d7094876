package api

import (
	"errors"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// graphCatalog has the signatures of some of the node's kernels, written
// out here since api imports nothing of ours.
var graphCatalog = map[string]KernelInfo{
	"fill_f32": {Name: "fill_f32", Params: []Param{
		{Name: "x", Kind: ArgBuffer, Access: AccessWrite, Elem: 4, Dims: []string{"n"}},
		{Name: "n", Kind: ArgI64}, {Name: "value", Kind: ArgF32}}},
	"saxpy": {Name: "saxpy", Params: []Param{
		{Name: "n", Kind: ArgI64}, {Name: "a", Kind: ArgF32},
		{Name: "x", Kind: ArgBuffer, Access: AccessRead, Elem: 4, Dims: []string{"n"}},
		{Name: "y", Kind: ArgBuffer, Access: AccessReadWrite, Elem: 4, Dims: []string{"n"}}}},
	"reduce_sum_f32": {Name: "reduce_sum_f32", Params: []Param{
		{Name: "n", Kind: ArgI64},
		{Name: "x", Kind: ArgBuffer, Access: AccessRead, Elem: 4, Dims: []string{"n"}},
		{Name: "out", Kind: ArgBuffer, Access: AccessWrite, Elem: 4}}},
	"kv_append": {Name: "kv_append", Params: []Param{
		{Name: "outer", Kind: ArgI64}, {Name: "cap", Kind: ArgI64}, {Name: "len", Kind: ArgI64},
		{Name: "inner", Kind: ArgI64}, {Name: "pos", Kind: ArgI64},
		{Name: "src", Kind: ArgBuffer, Access: AccessRead, Elem: 4, Dims: []string{"outer", "len", "inner"}},
		{Name: "cache", Kind: ArgBuffer, Access: AccessReadWrite, Elem: 4, Dims: []string{"outer", "cap", "inner"}}}},
	"embedding": {Name: "embedding", Params: []Param{
		{Name: "n", Kind: ArgI64}, {Name: "vocab", Kind: ArgI64}, {Name: "dim", Kind: ArgI64},
		{Name: "ids", Kind: ArgBuffer, Access: AccessRead, Elem: 4, Dims: []string{"n"}, DType: DTypeI32},
		{Name: "table", Kind: ArgBuffer, Access: AccessRead, Elem: 4, Dims: []string{"vocab", "dim"}},
		{Name: "out", Kind: ArgBuffer, Access: AccessWrite, Elem: 4, Dims: []string{"n", "dim"}}}},
	"opaque": {Name: "opaque", Params: []Param{{Name: "p", Kind: ArgBuffer, Access: AccessRead}}},
	"typo":   {Name: "typo", Params: []Param{{Name: "p", Kind: ArgBuffer, Access: AccessRead, Elem: 4, Dims: []string{"m"}}}},
}

func tensorArg(t uint32) OpArg    { return OpArg{Kind: OpArgTensor, Tensor: t} }
func i64Arg(v int64) OpArg        { return OpArg{Kind: OpArgI64, I64: v} }
func f32Arg(v float32) OpArg      { return OpArg{Kind: OpArgF32, F32: v} }
func scalarArg(s uint32) OpArg    { return OpArg{Kind: OpArgScalar, Scalar: s, Mul: 1} }
func shape(dims ...int64) []int64 { return dims }

// validGraph embeds token ids, adds a weight, appends the result to a KV
// cache at the position given by a scalar and sums the cache.
func validGraph() *GraphDef {
	return &GraphDef{
		Name:    "step",
		Scalars: []string{"pos"},
		Tensors: []TensorDef{
			{Name: "ids", DType: DTypeI32, Shape: shape(2), Residency: ResInput},
			{Name: "table", DType: DTypeF32, Shape: shape(5, 2), Residency: ResWeight, Addr: 0x10000},
			{Name: "h", DType: DTypeF32, Shape: shape(2, 2), Residency: ResActivation},
			{Name: "bias", DType: DTypeF32, Shape: shape(4), Residency: ResWeight, Addr: 0x20000},
			{Name: "cache", DType: DTypeF32, Shape: shape(1, 8, 2), Residency: ResKVCache, Addr: 0x30000},
			{Name: "sum", DType: DTypeF32, Shape: shape(1), Residency: ResOutput},
			{Name: "unused", DType: DTypeF32, Shape: shape(3), Residency: ResActivation},
		},
		Ops: []OpDef{
			{Kernel: "embedding", Phase: PhaseDecode, Args: []OpArg{i64Arg(2), i64Arg(5), i64Arg(2), tensorArg(0), tensorArg(1), tensorArg(2)}},
			{Kernel: "saxpy", Phase: PhaseDecode, Args: []OpArg{i64Arg(4), f32Arg(1), tensorArg(3), tensorArg(2)}},
			{Kernel: "kv_append", Phase: PhaseDecode, Args: []OpArg{i64Arg(1), i64Arg(8), i64Arg(2), i64Arg(2), scalarArg(0), tensorArg(2), tensorArg(4)}},
			{Kernel: "reduce_sum_f32", Args: []OpArg{i64Arg(16), tensorArg(4), tensorArg(5)}},
		},
	}
}

func TestCheckGraphAcceptsAValidGraph(t *testing.T) {
	c, err := CheckGraph(validGraph(), graphCatalog)
	if err != nil {
		t.Fatal(err)
	}
	wantBytes := []uint64{8, 40, 16, 16, 64, 4, 12}
	wantFirst := []int{0, 0, 0, 1, 2, 3, -1}
	wantLast := []int{0, 0, 2, 1, 3, 3, -1}
	for i := range wantBytes {
		if c.Bytes[i] != wantBytes[i] || c.First[i] != wantFirst[i] || c.Last[i] != wantLast[i] {
			t.Errorf("tensor %d: bytes %d, ops %d..%d; want %d, %d..%d", i, c.Bytes[i], c.First[i], c.Last[i], wantBytes[i], wantFirst[i], wantLast[i])
		}
	}
}

func TestCheckGraphRefusesBadGraphs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		edit     func(g *GraphDef)
		sentinel error
		names    []string // what the message must mention
	}{
		{"unknown kernel", func(g *GraphDef) { g.Ops[1].Kernel = "saxpyy" }, ErrUnknownKernel, []string{"op 1", `"saxpyy"`}},
		{"element type", func(g *GraphDef) { g.Tensors[2].DType = 9 }, ErrInvalidArgument, []string{`tensor 2 "h"`, "dtype(9)"}},
		{"residency", func(g *GraphDef) { g.Tensors[2].Residency = 0 }, ErrInvalidArgument, []string{`tensor 2 "h"`, "residency(0)"}},
		{"no dimensions", func(g *GraphDef) { g.Tensors[6].Shape = nil }, ErrInvalidArgument, []string{`tensor 6 "unused"`, "0 dimensions"}},
		{"too many dimensions", func(g *GraphDef) { g.Tensors[6].Shape = shape(1, 1, 1, 1, 3) }, ErrInvalidArgument, []string{`tensor 6`, "5 dimensions"}},
		{"empty dimension", func(g *GraphDef) { g.Tensors[6].Shape = shape(3, 0) }, ErrInvalidArgument, []string{`tensor 6`, "dimension 1", "is 0"}},
		{"negative dimension", func(g *GraphDef) { g.Tensors[6].Shape = shape(-3) }, ErrInvalidArgument, []string{`tensor 6`, "is -3"}},
		{"huge tensor overflows", func(g *GraphDef) { g.Tensors[6].Shape = shape(1<<31, 1<<31, 1<<2) }, ErrInvalidArgument, []string{`tensor 6 "unused"`, "2^64"}},
		{"bound tensor without address", func(g *GraphDef) { g.Tensors[1].Addr = 0 }, ErrInvalidArgument, []string{`tensor 1 "table"`, "weight", "address is 0"}},
		{"bound tensor between elements", func(g *GraphDef) { g.Tensors[4].Addr = 0x30002 }, ErrInvalidArgument, []string{`tensor 4 "cache"`, "0x30002", "f32 elements' 4 bytes"}},
		{"arena tensor with address", func(g *GraphDef) { g.Tensors[0].Addr = 0x4000 }, ErrInvalidArgument, []string{`tensor 0 "ids"`, "0x4000"}},
		{"phase", func(g *GraphDef) { g.Ops[3].Phase = 17 }, ErrInvalidArgument, []string{"op 3 (reduce_sum_f32)", "phase(17)"}},
		{"argument count", func(g *GraphDef) { g.Ops[1].Args = g.Ops[1].Args[:3] }, ErrInvalidArgument, []string{"op 1 (saxpy)", "takes 4 arguments (n, a, x, y), 3 given"}},
		{"tensor for an i64", func(g *GraphDef) { g.Ops[1].Args[0] = tensorArg(0) }, ErrInvalidArgument, []string{"op 1 (saxpy)", "parameter 0 (n)", "a tensor given"}},
		{"constant for a tensor", func(g *GraphDef) { g.Ops[1].Args[2] = i64Arg(0x20000) }, ErrInvalidArgument, []string{"op 1 (saxpy)", "parameter 2 (x)", "an i64 constant given"}},
		{"i64 for an f32", func(g *GraphDef) { g.Ops[1].Args[1] = i64Arg(1) }, ErrInvalidArgument, []string{"parameter 1 (a)", "takes an f32 constant"}},
		{"tensor index", func(g *GraphDef) { g.Ops[1].Args[2] = tensorArg(7) }, ErrInvalidArgument, []string{"op 1 (saxpy) parameter 2 (x)", "tensor 7", "has 7"}},
		{"scalar index", func(g *GraphDef) { g.Ops[2].Args[4] = scalarArg(1) }, ErrInvalidArgument, []string{"op 2 (kv_append)", "parameter 4 (pos)", "scalar 1"}},
		{"element type mismatch", func(g *GraphDef) { g.Tensors[0].DType = DTypeF32 }, ErrInvalidArgument, []string{"op 0 (embedding) parameter 3 (ids)", `tensor 0 "ids" is f32`, "takes i32"}},
		{"shape mismatch", func(g *GraphDef) { g.Tensors[3].Shape = shape(5) }, ErrInvalidArgument,
			[]string{"op 1 (saxpy) parameter 2 (x)", `tensor 3 "bias" holds 5 elements`, "extent n is 4"}},
		{"shape mismatch of a product", func(g *GraphDef) { g.Ops[2].Args[1] = i64Arg(7) }, ErrInvalidArgument,
			[]string{"op 2 (kv_append) parameter 6 (cache)", `tensor 4 "cache" holds 16 elements`, "outer·cap·inner is 14"}},
		{"dimension from a scalar", func(g *GraphDef) { g.Ops[1].Args[0] = scalarArg(0) }, ErrInvalidArgument, []string{"op 1 (saxpy) parameter 2 (x)", "n (parameter 0) from a scalar"}},
		{"negative extent", func(g *GraphDef) { g.Ops[1].Args[0] = i64Arg(-4) }, ErrInvalidArgument, []string{"op 1 (saxpy) parameter 2 (x)", "n = -4"}},
		{"overflowing extent", func(g *GraphDef) { g.Ops[2].Args[0], g.Ops[2].Args[2] = i64Arg(math.MaxInt64), i64Arg(math.MaxInt64) }, ErrInvalidArgument,
			[]string{"op 2 (kv_append) parameter 5 (src)", "outer·len·inner overflows"}},
		{"no extent", func(g *GraphDef) { g.Ops = append(g.Ops, OpDef{Kernel: "opaque", Args: []OpArg{tensorArg(3)}}) }, ErrInvalidArgument, []string{"op 4 (opaque) parameter 0 (p)", "no extent"}},
		{"extent names no parameter", func(g *GraphDef) { g.Ops = append(g.Ops, OpDef{Kernel: "typo", Args: []OpArg{tensorArg(3)}}) }, ErrInvalidArgument, []string{"op 4 (typo)", `"m"`}},
		{"used before it is produced", func(g *GraphDef) { g.Ops = g.Ops[1:] }, ErrInvalidArgument,
			[]string{"op 0 (saxpy) parameter 3 (y)", `tensor 2 "h"`, "used before it is produced"}},
		{"output read before written", func(g *GraphDef) {
			g.Ops = append(g.Ops[:3:3], OpDef{Kernel: "saxpy", Args: []OpArg{i64Arg(1), f32Arg(1), tensorArg(5), tensorArg(5)}})
		}, ErrInvalidArgument, []string{"op 3 (saxpy) parameter 2 (x)", `tensor 5 "sum"`, "before any earlier op writes it"}},
		{"cycle", func(g *GraphDef) {
			// a = f(b); b = f(a): whichever runs first reads what the
			// other has not yet written.
			g.Tensors[6].Shape = shape(4)
			g.Ops = append(g.Ops,
				OpDef{Kernel: "saxpy", Args: []OpArg{i64Arg(4), f32Arg(1), tensorArg(6), tensorArg(2)}},
				OpDef{Kernel: "saxpy", Args: []OpArg{i64Arg(4), f32Arg(1), tensorArg(2), tensorArg(6)}})
		}, ErrInvalidArgument, []string{"op 4 (saxpy) parameter 2 (x)", `tensor 6 "unused"`, "cycle"}},
		{"output never written", func(g *GraphDef) { g.Tensors[6].Residency = ResOutput }, ErrInvalidArgument, []string{`output tensor 6 "unused"`, "never written"}},
		{"weight written", func(g *GraphDef) { g.Ops[1].Args[3] = tensorArg(3) }, ErrInvalidArgument, []string{"op 1 (saxpy)", `writes tensor 3 "bias"`, "read-only"}},
		{"too many scalars", func(g *GraphDef) { g.Scalars = make([]string, MaxGraphScalars+1) }, ErrInvalidArgument, []string{"17 scalars"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := validGraph()
			tc.edit(g)
			_, err := CheckGraph(g, graphCatalog)
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("error %v: want %v", err, tc.sentinel)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not say %q", err, n)
				}
			}
		})
	}
}

// TestCheckGraphOrderProperty builds chains of saxpy over activations in a
// random order of first writes: the graph is valid exactly when every
// activation an op reads was filled by an earlier op.
func TestCheckGraphOrderProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "tensors")
		g := &GraphDef{Tensors: make([]TensorDef, n)}
		for i := range g.Tensors {
			g.Tensors[i] = TensorDef{Name: string(rune('a' + i)), DType: DTypeF32, Shape: shape(3), Residency: ResActivation}
		}
		filled := make([]bool, n)
		valid := true
		for range rapid.IntRange(1, 12).Draw(t, "ops") {
			if x := rapid.IntRange(0, n-1).Draw(t, "fill"); rapid.Bool().Draw(t, "is fill") {
				g.Ops = append(g.Ops, OpDef{Kernel: "fill_f32", Args: []OpArg{tensorArg(uint32(x)), i64Arg(3), f32Arg(1)}})
				filled[x] = true
				continue
			}
			x, y := rapid.IntRange(0, n-1).Draw(t, "x"), rapid.IntRange(0, n-1).Draw(t, "y")
			g.Ops = append(g.Ops, OpDef{Kernel: "saxpy", Args: []OpArg{i64Arg(3), f32Arg(2), tensorArg(uint32(x)), tensorArg(uint32(y))}})
			valid = valid && filled[x] && filled[y]
		}
		_, err := CheckGraph(g, graphCatalog)
		if valid != (err == nil) {
			t.Fatalf("valid %v, CheckGraph: %v", valid, err)
		}
		if err != nil && !strings.Contains(err.Error(), "used before it is produced") {
			t.Fatalf("error %v", err)
		}
	})
}

// FuzzGraph decodes arbitrary bytes as a graph and checks what decodes:
// neither panics, and every refusal is typed.
func FuzzGraph(f *testing.F) {
	f.Add(Encode(validGraph()))
	g := validGraph()
	g.Ops = g.Ops[1:]
	f.Add(Encode(g))
	g = validGraph()
	g.Tensors[3].Shape = shape(1<<40, 1<<40)
	f.Add(Encode(g))
	f.Fuzz(func(t *testing.T, b []byte) {
		var g GraphDef
		if err := Decode(b, &g); err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("decode error %v is not a protocol error", err)
			}
			return
		}
		c, err := CheckGraph(&g, graphCatalog)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrUnknownKernel) {
				t.Fatalf("check error %v is neither invalid argument nor unknown kernel", err)
			}
			return
		}
		for i, tn := range g.Tensors {
			if c.Bytes[i] < tn.DType.Size() || (c.First[i] < 0) != (c.Last[i] < 0) || c.First[i] > c.Last[i] {
				t.Fatalf("tensor %d: bytes %d, ops %d..%d", i, c.Bytes[i], c.First[i], c.Last[i])
			}
		}
	})
}
