package mediator_test

import (
	"bytes"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Tensor graphs over the kernels for real models (docs/graphs.md).

// kvGraph appends a row of width inner to a KV cache of cap rows at the
// position its scalar "pos" gives, then gathers rows of a weight table
// by the ids it is given (an embedding, whose ids the node checks before
// it writes anything).
func kvGraph(cache, table uint64, capacity, inner, vocab int64) *api.GraphDef {
	return &api.GraphDef{
		Name:    "decode",
		Scalars: []string{"pos"},
		Tensors: []api.TensorDef{
			{Name: "row", DType: api.DTypeF32, Shape: []int64{1, 1, inner}, Residency: api.ResInput},
			{Name: "ids", DType: api.DTypeI32, Shape: []int64{2}, Residency: api.ResInput},
			{Name: "cache", DType: api.DTypeF32, Shape: []int64{1, capacity, inner}, Residency: api.ResKVCache, Addr: cache},
			{Name: "table", DType: api.DTypeF32, Shape: []int64{vocab, inner}, Residency: api.ResWeight, Addr: table},
			{Name: "rows", DType: api.DTypeF32, Shape: []int64{2, inner}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{
			{Kernel: "kv_append", Phase: api.PhaseDecode, Args: []api.OpArg{tgI64(1), tgI64(capacity), tgI64(1), tgI64(inner),
				{Kind: api.OpArgScalar, Scalar: 0, Mul: 1}, tgTensor(0), tgTensor(2)}},
			{Kernel: "embedding", Phase: api.PhaseDecode, Args: []api.OpArg{tgI64(2), tgI64(vocab), tgI64(inner), tgTensor(1), tgTensor(3), tgTensor(4)}},
		},
	}
}

// TestTensorGraphKVCacheGrowsByScalarPosition drives one decode graph over
// every position of its KV cache, then makes it fail in every way a
// growing cache can: past its capacity (the node's check), at a negative
// position (the mediator's), by a bad id in a later op (the node plans
// every op before it runs one), and as a larger cache past the tenant's
// quota. No failure changes the cache.
func TestTensorGraphKVCacheGrowsByScalarPosition(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 8<<20)
	c := hostile(t, sys, "acme")
	other := sys.dial(t, "other", 1)
	const capacity, inner, vocab = 8, 4, 5
	cache := mallocHint(t, c, 4*capacity*inner, api.HintKVCache)
	tableV := seq(vocab*inner, func(i int) float32 { return float32(i) * 1.5 })
	table := weight(t, c, tableV)
	id := mustRegister(t, c, kvGraph(cache, table, capacity, inner, vocab))
	want := make([]float32, capacity*inner)
	ids := client.Int32Bytes([]int32{3, 1})
	for pos := range capacity {
		row := seq(inner, func(i int) float32 { return float32(100*pos + i) })
		copy(want[pos*inner:], row)
		out, err := invoke(t, c, id, []int64{int64(pos)}, append(client.Float32Bytes(row), ids...))
		if err != nil {
			t.Fatalf("pos %d: %v", pos, err)
		}
		if rows := append(append([]float32(nil), tableV[3*inner:4*inner]...), tableV[1*inner:2*inner]...); !bytes.Equal(out, client.Float32Bytes(rows)) {
			t.Fatalf("pos %d: gathered rows %v, want %v", pos, client.BytesFloat32(out), rows)
		}
	}
	full := client.Float32Bytes(want)
	if got := getRaw(t, c, cache, 4*capacity*inner); !bytes.Equal(got, full) {
		t.Fatalf("cache %v, want %v", client.BytesFloat32(got), want)
	}

	row := client.Float32Bytes(seq(inner, func(i int) float32 { return -1 }))
	for _, tc := range []struct {
		name     string
		pos      int64
		ids      []int32
		sentinel error
		names    []string
	}{
		{"past the capacity", capacity, []int32{0, 0}, api.ErrInvalidArgument, []string{`tensor graph 1 "decode"`, "op 0 (kv_append, decode)", "exceeds cap"}},
		{"negative position", -1, []int32{0, 0}, api.ErrInvalidArgument, []string{"op 0 (kv_append) parameter 4", "pos (-1)", "negative"}},
		{"bad id after the append", 2, []int32{0, vocab}, api.ErrInvalidArgument, []string{"op 1 (embedding, decode)", "5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := invoke(t, c, id, []int64{tc.pos}, append(append([]byte(nil), row...), client.Int32Bytes(tc.ids)...))
			wantErr(t, err, tc.sentinel, tc.names...)
			if got := getRaw(t, c, cache, 4*capacity*inner); !bytes.Equal(got, full) {
				t.Fatalf("a failed invocation changed the cache: %v", client.BytesFloat32(got))
			}
			victim(t, other)
		})
	}
	// A cache of twice the positions does not fit the tenant's 8 MiB.
	_, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: 16 << 20, Hint: api.HintKVCache}))
	wantErr(t, err, api.ErrQuotaExceeded, "16777216", "memory limit of 8388608")
	if _, err := invoke(t, c, id, []int64{0}, append(append([]byte(nil), row...), ids...)); err != nil {
		t.Fatalf("the session no longer invokes its graph: %v", err)
	}
}

// TestTensorGraphMatmulAdd runs a linear layer, x·W + b, as a graph and
// checks it bit for bit against the kernels' documented arithmetic.
func TestTensorGraphMatmulAdd(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	const m, k, n = 3, 5, 4
	wv := seq(k*n, func(i int) float32 { return float32(i%7) - 2.25 })
	bv := seq(n, func(i int) float32 { return float32(i) / 4 })
	g := &api.GraphDef{
		Name: "linear",
		Tensors: []api.TensorDef{
			{Name: "x", DType: api.DTypeF32, Shape: []int64{m, k}, Residency: api.ResInput},
			{Name: "w", DType: api.DTypeF32, Shape: []int64{k, n}, Residency: api.ResWeight, Addr: weight(t, c, wv)},
			{Name: "b", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResWeight, Addr: weight(t, c, bv)},
			{Name: "h", DType: api.DTypeF32, Shape: []int64{m, n}, Residency: api.ResActivation},
			{Name: "y", DType: api.DTypeF32, Shape: []int64{m, n}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{
			{Kernel: "matmul", Phase: api.PhaseForward, Args: []api.OpArg{tgI64(1), tgI64(m), tgI64(n), tgI64(k), tgI64(0), tgI64(0), tgI64(1), tgTensor(0), tgTensor(1), tgTensor(3)}},
			{Kernel: "add", Phase: api.PhaseForward, Args: []api.OpArg{tgI64(m), tgI64(n), tgI64(1), tgTensor(3), tgTensor(2), tgTensor(4)}},
		},
	}
	id := mustRegister(t, c, g)
	for seed := range 3 {
		x := seq(m*k, func(i int) float32 { return float32((i*(seed+3))%11) / 3 })
		want := make([]float32, m*n)
		for i := range m {
			for j := range n {
				var s float32
				for p := range k {
					s = s + float32(x[i*k+p]*wv[p*n+j])
				}
				want[i*n+j] = s + bv[j]
			}
		}
		out, err := invoke(t, c, id, nil, client.Float32Bytes(x))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, client.Float32Bytes(want)) {
			t.Fatalf("x·W + b = %v, want %v", client.BytesFloat32(out), want)
		}
	}
}
