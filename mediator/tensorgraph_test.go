package mediator_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// A tenant of these tests speaks the protocol by hand (raw, roundTrip), so
// that they check the mediator, not the SDK's graph builder.

func tgTensor(t uint32) api.OpArg { return api.OpArg{Kind: api.OpArgTensor, Tensor: t} }
func tgI64(v int64) api.OpArg     { return api.OpArg{Kind: api.OpArgI64, I64: v} }
func tgF32(v float32) api.OpArg   { return api.OpArg{Kind: api.OpArgF32, F32: v} }

// mallocHint allocates size bytes with a hint through a raw connection.
func mallocHint(t *testing.T, c *wire.Conn, size uint64, hint api.Hint) uint64 {
	t.Helper()
	b, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: size, Hint: hint}))
	if err != nil {
		t.Fatal(err)
	}
	var r api.MallocReply
	if err := api.Decode(b, &r); err != nil {
		t.Fatal(err)
	}
	return r.Addr
}

// putRaw writes b at va on the default stream and waits for it.
func putRaw(t *testing.T, c *wire.Conn, va uint64, b []byte) {
	t.Helper()
	if _, err := roundTrip(t, c, api.OpCopyToDevice, api.Encode(&api.CopyToDevice{Dst: va, Payload: b})); err != nil {
		t.Fatal(err)
	}
}

// getRaw reads n bytes at va.
func getRaw(t *testing.T, c *wire.Conn, va uint64, n uint64) []byte {
	t.Helper()
	b, err := roundTrip(t, c, api.OpCopyFromDevice, api.Encode(&api.CopyFromDevice{Src: va, Len: n}))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// weight allocates, uploads and seals a weight of values.
func weight(t *testing.T, c *wire.Conn, values []float32) uint64 {
	t.Helper()
	va := mallocHint(t, c, uint64(4*len(values)), api.HintWeight)
	putRaw(t, c, va, client.Float32Bytes(values))
	if _, err := roundTrip(t, c, api.OpSeal, api.Encode(&api.Seal{Addr: va})); err != nil {
		t.Fatal(err)
	}
	return va
}

func register(t *testing.T, c *wire.Conn, g *api.GraphDef) (uint32, error) {
	t.Helper()
	b, err := roundTrip(t, c, api.OpGraphRegister, api.Encode(g))
	if err != nil {
		return 0, err
	}
	var id api.Graph
	if err := api.Decode(b, &id); err != nil {
		t.Fatal(err)
	}
	return id.Graph, nil
}

func mustRegister(t *testing.T, c *wire.Conn, g *api.GraphDef) uint32 {
	t.Helper()
	id, err := register(t, c, g)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func invoke(t *testing.T, c *wire.Conn, id uint32, scalars []int64, inputs []byte) ([]byte, error) {
	t.Helper()
	return roundTrip(t, c, api.OpGraphInvoke, api.Encode(&api.GraphInvoke{Graph: id, Scalars: scalars, Inputs: inputs}))
}

func release(t *testing.T, c *wire.Conn, id uint32) error {
	t.Helper()
	_, err := roundTrip(t, c, api.OpGraphRelease, api.Encode(&api.Graph{Graph: id}))
	return err
}

func seq(n int, f func(i int) float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = f(i)
	}
	return v
}

// affineGraph is y = 0.5 + 2x + w, s = Σ y, with x an input of n floats
// and w a weight at wAddr.
func affineGraph(n int64, wAddr uint64) *api.GraphDef {
	return &api.GraphDef{
		Name: "affine",
		Tensors: []api.TensorDef{
			{Name: "x", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResInput},
			{Name: "w", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResWeight, Addr: wAddr},
			{Name: "y", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResOutput},
			{Name: "s", DType: api.DTypeF32, Shape: []int64{1}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{
			{Kernel: "fill_f32", Phase: api.PhaseForward, Args: []api.OpArg{tgTensor(2), tgI64(n), tgF32(0.5)}},
			{Kernel: "saxpy", Phase: api.PhaseForward, Args: []api.OpArg{tgI64(n), tgF32(2), tgTensor(0), tgTensor(2)}},
			{Kernel: "saxpy", Phase: api.PhaseForward, Args: []api.OpArg{tgI64(n), tgF32(1), tgTensor(1), tgTensor(2)}},
			{Kernel: "reduce_sum_f32", Phase: api.PhaseForward, Args: []api.OpArg{tgI64(n), tgTensor(2), tgTensor(3)}},
		},
	}
}

// affine is affineGraph's result, computed as its kernels' Docs say.
func affine(x, w []float32) []float32 {
	y := make([]float32, len(x)+1)
	var sum float64
	for i := range x {
		v := float32(2*x[i]) + 0.5
		v = float32(1*w[i]) + v
		y[i] = v
		sum += float64(v)
	}
	y[len(x)] = float32(sum)
	return y
}

// checkAffine invokes an affine graph with inputs from seed and checks
// its outputs.
func checkAffine(t *testing.T, c *wire.Conn, id uint32, w []float32, seed int) {
	t.Helper()
	x := seq(len(w), func(i int) float32 { return float32(i*seed%97) / 8 })
	out, err := invoke(t, c, id, nil, client.Float32Bytes(x))
	if err != nil {
		t.Fatal(err)
	}
	if want := client.Float32Bytes(affine(x, w)); !bytes.Equal(out, want) {
		t.Fatalf("outputs %v, want %v", client.BytesFloat32(out)[:4], affine(x, w)[:4])
	}
}

func TestTensorGraphRegisterInvokeRelease(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	const n = 3000 // more than a page, less than a chunk
	w := seq(n, func(i int) float32 { return float32(i) / 3 })
	wAddr := weight(t, c, w)
	id := mustRegister(t, c, affineGraph(n, wAddr))
	statsBefore := sessionStats(t, c)
	for seed := 1; seed <= 3; seed++ {
		checkAffine(t, c, id, w, seed)
	}
	st := sessionStats(t, c)
	if in, out, l := st.CopiedIn-statsBefore.CopiedIn, st.CopiedOut-statsBefore.CopiedOut, st.Launches-statsBefore.Launches; in != 3*4*n || out != 3*4*(n+1) || l != 3*4 {
		t.Fatalf("three invocations counted %d bytes in, %d out, %d launches; want %d, %d, %d", in, out, l, 3*4*n, 3*4*(n+1), 12)
	}

	// While the graph lives its weight cannot be freed; once released it can.
	_, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: wAddr}))
	wantErr(t, err, api.ErrInvalidArgument, fmt.Sprintf("%#x", wAddr), fmt.Sprintf(`tensor graph %d "affine"`, id), `tensor 1 "w"`)
	checkAffine(t, c, id, w, 4)
	if err := release(t, c, id); err != nil {
		t.Fatal(err)
	}
	_, err = invoke(t, c, id, nil, make([]byte, 4*n))
	wantErr(t, err, api.ErrInvalidArgument, fmt.Sprintf("tensor graph %d does not exist", id))
	wantErr(t, release(t, c, id), api.ErrInvalidArgument, fmt.Sprintf("tensor graph %d", id))
	if _, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: wAddr})); err != nil {
		t.Fatal(err)
	}
	// The arena went with the graph: the session holds nothing now.
	if st := sys.med.Status(); len(st.Tenants) != 1 || st.Tenants[0].Allocations != 0 {
		t.Fatalf("after release and free: %+v", st.Tenants)
	}
}

func sessionStats(t *testing.T, c *wire.Conn) api.SessionStats {
	t.Helper()
	b, err := roundTrip(t, c, api.OpSessionStats)
	if err != nil {
		t.Fatal(err)
	}
	var st api.SessionStats
	if err := api.Decode(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestTensorGraphsShareAKVCache has two graphs bind one KV cache: one
// accumulates its input into the cache, the other reads the cache; the
// cache keeps its contents between invocations and across the graphs.
func TestTensorGraphsShareAKVCache(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	const n = 256
	cache := mallocHint(t, c, 4*n, api.HintKVCache)
	kv := api.TensorDef{Name: "cache", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResKVCache, Addr: cache}
	appendG := &api.GraphDef{
		Name: "append",
		Tensors: []api.TensorDef{
			{Name: "x", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResInput}, kv,
		},
		Ops: []api.OpDef{{Kernel: "saxpy", Phase: api.PhasePrefill, Args: []api.OpArg{tgI64(n), tgF32(1), tgTensor(0), tgTensor(1)}}},
	}
	readG := &api.GraphDef{
		Name: "read",
		Tensors: []api.TensorDef{
			kv, {Name: "sum", DType: api.DTypeF32, Shape: []int64{1}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{{Kernel: "reduce_sum_f32", Phase: api.PhaseDecode, Args: []api.OpArg{tgI64(n), tgTensor(0), tgTensor(1)}}},
	}
	a, r := mustRegister(t, c, appendG), mustRegister(t, c, readG)
	want := make([]float32, n)
	for step := range 3 {
		x := seq(n, func(i int) float32 { return float32(i + step) })
		if _, err := invoke(t, c, a, nil, client.Float32Bytes(x)); err != nil {
			t.Fatal(err)
		}
		var sum float64
		for i := range want {
			want[i] += x[i]
			sum += float64(want[i])
		}
		out, err := invoke(t, c, r, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := client.BytesFloat32(out); len(got) != 1 || got[0] != float32(sum) {
			t.Fatalf("step %d: sum %v, want %v", step, got, float32(sum))
		}
	}
	if got := getRaw(t, c, cache, 4*n); !bytes.Equal(got, client.Float32Bytes(want)) {
		t.Fatal("the KV cache read with a copy differs from what the graphs accumulated")
	}
	// A cache the graphs write cannot be sealed, exported or freed.
	wantWritten(t, c, cache, `tensor graph`, `tensor`, `"cache"`)
	if err := release(t, c, a); err != nil {
		t.Fatal(err)
	}
	_, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: cache}))
	wantErr(t, err, api.ErrInvalidArgument, fmt.Sprintf(`tensor graph %d "read"`, r))
	if err := release(t, c, r); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: cache})); err != nil {
		t.Fatal(err)
	}
}

// wantWritten checks that the allocation at va, which a tensor graph
// writes, can be neither sealed, exported nor freed, each refusal naming
// it, names and the way out.
func wantWritten(t *testing.T, c *wire.Conn, va uint64, names ...string) {
	t.Helper()
	for _, tc := range []struct {
		op   wire.Op
		body []byte
	}{
		{api.OpSeal, api.Encode(&api.Seal{Addr: va})},
		{api.OpExport, api.Encode(&api.Export{Addr: va, Mode: api.ModeCoherent, Grants: []api.Grant{{Tenant: "b"}}})},
		{api.OpFree, api.Encode(&api.Free{Addr: va})},
	} {
		_, err := roundTrip(t, c, tc.op, tc.body)
		wantErr(t, err, api.ErrInvalidArgument, append([]string{fmt.Sprintf("%#x", va), "release the graph first"}, names...)...)
	}
}

// TestTensorGraphsOverPackedAllocations binds tensors anywhere in their
// allocations, as a model's weights packed into one sealed allocation
// are: each graph computes over exactly its tensor's bytes (what it
// computes over an allocation of its own; a KV cache's neighbours stay as
// they were), and while any graph binds a tensor in an allocation, the
// allocation keeps the protections of one bound whole.
func TestTensorGraphsOverPackedAllocations(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	const n = 64
	all := seq(3*n, func(i int) float32 { return float32(i)/4 - 7 })
	wBase := weight(t, c, all)
	// At the start, at 256 bytes, and one element past that: any
	// element-aligned address of the allocation.
	offs := []uint64{0, 4 * n, 4*n + 4}
	ids := make([]uint32, len(offs))
	for k, off := range offs {
		ids[k] = mustRegister(t, c, affineGraph(n, wBase+off))
		checkAffine(t, c, ids[k], all[off/4:off/4+n], k+1)
	}
	alone := mustRegister(t, c, affineGraph(n, weight(t, c, all[n+1:2*n+1])))
	x := client.Float32Bytes(seq(n, func(i int) float32 { return float32(i % 7) }))
	packed, err := invoke(t, c, ids[2], nil, x)
	if err != nil {
		t.Fatal(err)
	}
	if own, err := invoke(t, c, alone, nil, x); err != nil || !bytes.Equal(packed, own) {
		t.Fatalf("a weight packed at offset %d and the same weight alone give different outputs (%v)", offs[2], err)
	}
	// The weights' allocation cannot be freed while any graph binds a
	// tensor in it; at an inner address there is no allocation to free.
	for _, id := range ids {
		_, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: wBase}))
		wantErr(t, err, api.ErrInvalidArgument, fmt.Sprintf("free %#x", wBase), "tensor graph", `tensor 1 "w"`, "release the graph first")
		if err := release(t, c, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: wBase})); err != nil {
		t.Fatal(err)
	}

	// Three caches in one allocation; a graph accumulates into the middle one.
	cache := mallocHint(t, c, 3*4*n, api.HintKVCache)
	before := seq(3*n, func(i int) float32 { return float32(i) + 0.5 })
	putRaw(t, c, cache, client.Float32Bytes(before))
	acc := mustRegister(t, c, &api.GraphDef{
		Name: "accumulate",
		Tensors: []api.TensorDef{
			{Name: "x", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResInput},
			{Name: "cache", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResKVCache, Addr: cache + 4*n},
		},
		Ops: []api.OpDef{{Kernel: "saxpy", Phase: api.PhaseDecode, Args: []api.OpArg{tgI64(n), tgF32(1), tgTensor(0), tgTensor(1)}}},
	})
	in := seq(n, func(i int) float32 { return float32(3 * i) })
	for range 2 {
		if _, err := invoke(t, c, acc, nil, client.Float32Bytes(in)); err != nil {
			t.Fatal(err)
		}
	}
	want := append([]float32(nil), before...)
	for i := range in {
		want[n+i] = float32(1*in[i]) + want[n+i]
		want[n+i] = float32(1*in[i]) + want[n+i]
	}
	if got := getRaw(t, c, cache, 3*4*n); !bytes.Equal(got, client.Float32Bytes(want)) {
		t.Fatalf("the packed caches read %v…, want %v…", client.BytesFloat32(got)[n-2:n+2], want[n-2:n+2])
	}
	wantWritten(t, c, cache, fmt.Sprintf(`tensor graph %d "accumulate"`, acc), `tensor 1 "cache"`)
	_, err = roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: cache + 4*n}))
	wantErr(t, err, api.ErrInvalidAddress, fmt.Sprintf("%#x", cache+4*n), "not the start of an allocation")
	if err := release(t, c, acc); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: cache})); err != nil {
		t.Fatal(err)
	}
}

// TestTensorGraphBadInputFailsAlone sends every kind of bad graph and bad
// invocation: each gets a typed error naming what is wrong, and the
// session's good graph and another tenant's session keep working.
func TestTensorGraphBadInputFailsAlone(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 16<<20)
	c := hostile(t, sys, "acme")
	other := sys.dial(t, "other", 1)
	const n = 64
	w := seq(n, func(i int) float32 { return float32(i) })
	wAddr := weight(t, c, w)
	good := mustRegister(t, c, affineGraph(n, wAddr))
	unsealed := mallocHint(t, c, 4*n+4*8, api.HintWeight)
	small := mallocHint(t, c, 4*n-4, api.HintKVCache)
	gone := mallocHint(t, c, 4*n, api.HintWeight)
	if _, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: gone})); err != nil {
		t.Fatal(err)
	}
	// Two caches of a page each, side by side in their chunk.
	left, right := mallocHint(t, c, 4096, api.HintKVCache), mallocHint(t, c, 4096, api.HintKVCache)
	if right != left+4096 {
		t.Fatalf("caches at %#x and %#x are not adjacent", left, right)
	}
	kv := func(addr uint64) func(g *api.GraphDef) {
		return func(g *api.GraphDef) {
			g.Tensors = append(g.Tensors, api.TensorDef{Name: "kv", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResKVCache, Addr: addr})
			g.Ops = append(g.Ops, api.OpDef{Kernel: "saxpy", Args: []api.OpArg{tgI64(n), tgF32(1), tgTensor(0), tgTensor(4)}})
		}
	}

	for _, tc := range []struct {
		name     string
		edit     func(g *api.GraphDef)
		sentinel error
		names    []string
	}{
		{"shape mismatch", func(g *api.GraphDef) { g.Tensors[0].Shape = []int64{n + 1} }, api.ErrInvalidArgument,
			[]string{`graph "affine"`, "op 1 (saxpy) parameter 2 (x)", `tensor 0 "x" holds 65 elements`, "extent n is 64"}},
		{"unknown kernel", func(g *api.GraphDef) { g.Ops[2].Kernel = "matmul_f64" }, api.ErrUnknownKernel, []string{"op 2", `"matmul_f64"`}},
		{"used before it is produced", func(g *api.GraphDef) { g.Ops = g.Ops[1:] }, api.ErrInvalidArgument,
			[]string{"op 0 (saxpy) parameter 3 (y)", `tensor 2 "y"`, "used before it is produced"}},
		{"cycle", func(g *api.GraphDef) {
			g.Tensors = append(g.Tensors, api.TensorDef{Name: "z", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResActivation})
			g.Ops[0] = api.OpDef{Kernel: "saxpy", Args: []api.OpArg{tgI64(n), tgF32(1), tgTensor(4), tgTensor(2)}}
			g.Ops = append(g.Ops, api.OpDef{Kernel: "saxpy", Args: []api.OpArg{tgI64(n), tgF32(1), tgTensor(2), tgTensor(4)}})
		}, api.ErrInvalidArgument, []string{"op 0 (saxpy) parameter 2 (x)", `tensor 4 "z"`, "cycle"}},
		{"huge declared tensor", func(g *api.GraphDef) {
			g.Tensors = append(g.Tensors, api.TensorDef{Name: "huge", DType: api.DTypeF32, Shape: []int64{1 << 20, 1 << 20}, Residency: api.ResActivation})
		}, api.ErrOutOfMemory, []string{`tensor 4 "huge" takes 4398046511104 bytes`, "device 0"}},
		{"tensor past the quota", func(g *api.GraphDef) {
			g.Tensors = append(g.Tensors, api.TensorDef{Name: "big", DType: api.DTypeF32, Shape: []int64{8 << 20}, Residency: api.ResActivation})
			g.Ops = append(g.Ops, api.OpDef{Kernel: "fill_f32", Args: []api.OpArg{tgTensor(4), tgI64(8 << 20), tgF32(0)}})
		}, api.ErrQuotaExceeded, []string{`graph "affine"`, `tensor 4 "big"`, "33554432"}},
		{"overflowing tensor", func(g *api.GraphDef) { g.Tensors[0].Shape = []int64{math.MaxInt64, 4} }, api.ErrInvalidArgument, []string{`tensor 0 "x"`, "2^64"}},
		{"unsealed weight", func(g *api.GraphDef) { g.Tensors[1].Addr = unsealed + 4*8 }, api.ErrInvalidArgument,
			[]string{`tensor 1 "w" at ` + fmt.Sprintf("%#x", unsealed+4*8), fmt.Sprintf("allocation at %#x is not sealed", unsealed)}},
		{"bound tensor in no allocation", func(g *api.GraphDef) { g.Tensors[1].Addr = gone }, api.ErrInvalidAddress, []string{`tensor 1 "w"`, fmt.Sprintf("%#x", gone)}},
		{"bound tensor between elements", func(g *api.GraphDef) { g.Tensors[1].Addr = wAddr + 2 }, api.ErrInvalidArgument,
			[]string{`tensor 1 "w"`, fmt.Sprintf("%#x", wAddr+2), "f32 elements' 4 bytes"}},
		{"tensor past its allocation's end", func(g *api.GraphDef) { g.Tensors[1].Addr = wAddr + 4 }, api.ErrInvalidArgument,
			[]string{fmt.Sprintf(`tensor 1 "w" of 256 bytes at %#x, 4 bytes into the 256-byte allocation at %#x, runs past its end %#x`, wAddr+4, wAddr, wAddr+256)}},
		{"allocation too small", kv(small), api.ErrInvalidArgument, []string{fmt.Sprintf(`tensor 4 "kv" of 256 bytes at %#x, 0 bytes into the 252-byte allocation`, small)}},
		{"tensor across two allocations", kv(left + 4096 - 128), api.ErrInvalidArgument,
			[]string{`tensor 4 "kv" of 256 bytes`, fmt.Sprintf("the 4096-byte allocation at %#x, runs past its end %#x into the allocation at %#x", left, right, right)}},
		{"weight written", func(g *api.GraphDef) { g.Ops[1].Args[3] = tgTensor(1) }, api.ErrInvalidArgument, []string{`writes tensor 1 "w"`, "read-only"}},
		{"inputs too large", func(g *api.GraphDef) {
			g.Tensors = append(g.Tensors, api.TensorDef{Name: "in2", DType: api.DTypeF32, Shape: []int64{wire.MaxChunk / 4}, Residency: api.ResInput})
		}, api.ErrInvalidArgument, []string{`tensor 4 "in2"`, "1048576 bytes an invocation carries"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := affineGraph(n, wAddr)
			tc.edit(g)
			_, err := register(t, c, g)
			wantErr(t, err, tc.sentinel, tc.names...)
			checkAffine(t, c, good, w, 5)
			victim(t, other)
		})
	}

	for _, tc := range []struct {
		name     string
		inv      api.GraphInvoke
		names    []string
		sentinel error
	}{
		{"short inputs", api.GraphInvoke{Graph: good, Inputs: make([]byte, 4*n-1)}, []string{"255 input bytes given", `tensor 0 "x": 256`}, api.ErrInvalidArgument},
		{"long inputs", api.GraphInvoke{Graph: good, Inputs: make([]byte, 4*n+4)}, []string{"260 input bytes given", "takes 256"}, api.ErrInvalidArgument},
		{"scalars", api.GraphInvoke{Graph: good, Scalars: []int64{1}, Inputs: make([]byte, 4*n)}, []string{"1 scalars given", "takes 0"}, api.ErrInvalidArgument},
		{"unknown graph", api.GraphInvoke{Graph: good + 100, Inputs: make([]byte, 4*n)}, []string{fmt.Sprintf("tensor graph %d does not exist", good+100)}, api.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := roundTrip(t, c, api.OpGraphInvoke, api.Encode(&tc.inv))
			wantErr(t, err, tc.sentinel, tc.names...)
			checkAffine(t, c, good, w, 6)
			victim(t, other)
		})
	}
}

// TestTensorGraphsNeedMemoryThatStays: an oversubscribing session may move
// its memory, so it cannot register graphs, and says why.
func TestTensorGraphsNeedMemoryThatStays(t *testing.T) {
	sys := startWith(t, 64<<20, func(c *mediator.Config) { c.TenantMemory, c.Oversubscribe = 16<<20, 2 })
	c := hostile(t, sys, "acme")
	_, err := register(t, c, affineGraph(4, weight(t, c, []float32{1, 2, 3, 4})))
	wantErr(t, err, api.ErrInvalidArgument, `graph "affine"`, "oversubscribes")
	if errors.Is(err, api.ErrUnknownKernel) {
		t.Fatal(err)
	}
}

// TestTensorGraphLimits fills a session's tensor graphs to their bounds:
// past them a registration fails, naming the bound, and a release makes
// room again.
func TestTensorGraphLimits(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	tiny := &api.GraphDef{
		Name:    "tiny",
		Tensors: []api.TensorDef{{Name: "y", DType: api.DTypeF32, Shape: []int64{1}, Residency: api.ResOutput}},
		Ops:     []api.OpDef{{Kernel: "fill_f32", Args: []api.OpArg{tgTensor(0), tgI64(1), tgF32(2)}}},
	}
	ids := make([]uint32, mediator.MaxTensorGraphs)
	for i := range ids {
		ids[i] = mustRegister(t, c, tiny)
	}
	_, err := register(t, c, tiny)
	wantErr(t, err, api.ErrInvalidArgument, fmt.Sprintf("%d tensor graphs, the limit", mediator.MaxTensorGraphs))
	for _, id := range ids[1:] {
		if err := release(t, c, id); err != nil {
			t.Fatal(err)
		}
	}
	// Graphs of the most ops a graph may have, up to the session's bound.
	long := &api.GraphDef{Name: "long", Tensors: tiny.Tensors, Ops: make([]api.OpDef, api.MaxGraphOps)}
	for i := range long.Ops {
		long.Ops[i] = api.OpDef{Kernel: "fill_f32", Args: []api.OpArg{tgTensor(0), tgI64(1), tgF32(float32(i))}}
	}
	for range mediator.MaxTensorGraphOps/api.MaxGraphOps - 1 {
		mustRegister(t, c, long)
	}
	_, err = register(t, c, long)
	wantErr(t, err, api.ErrQuotaExceeded, `graph "long" of 4096 ops`, fmt.Sprintf("may hold %d in all", mediator.MaxTensorGraphOps))
	if err := release(t, c, ids[0]); err != nil {
		t.Fatal(err)
	}
	id := mustRegister(t, c, long)
	out, err := invoke(t, c, id, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := client.BytesFloat32(out); len(got) != 1 || got[0] != api.MaxGraphOps-1 {
		t.Fatalf("a graph of %d fills left %v", api.MaxGraphOps, got)
	}
}

// TestTensorGraphArenaOfManyChunks has an activation that spans several
// 2 MiB chunks, each a frame of its own, which its extents cover.
func TestTensorGraphArenaOfManyChunks(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	const n = 3 << 18 // 3 MiB of floats
	g := &api.GraphDef{
		Name: "wide",
		Tensors: []api.TensorDef{
			{Name: "a", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResActivation},
			{Name: "s", DType: api.DTypeF32, Shape: []int64{1}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{
			{Kernel: "fill_f32", Args: []api.OpArg{tgTensor(0), tgI64(n), tgF32(0.25)}},
			{Kernel: "reduce_sum_f32", Args: []api.OpArg{tgI64(n), tgTensor(0), tgTensor(1)}},
		},
	}
	id := mustRegister(t, c, g)
	out, err := invoke(t, c, id, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := client.BytesFloat32(out); got[0] != n/4 {
		t.Fatalf("sum of %d quarters is %v", n, got)
	}
	if st := sys.med.Status(); st.Tenants[0].Allocated < n*4 {
		t.Fatalf("session's allocations %d bytes, less than its arena", st.Tenants[0].Allocated)
	}
}

// TestTensorGraphsEndWithTheirSession: a session that ends with graphs
// registered leaves nothing behind, on the mediator or the node.
func TestTensorGraphsEndWithTheirSession(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	w := seq(1000, func(i int) float32 { return float32(i) })
	id := mustRegister(t, c, affineGraph(1000, weight(t, c, w)))
	checkAffine(t, c, id, w, 2)
	mustRegister(t, c, affineGraph(1000, weight(t, c, w)))
	c.NetConn().Close()
	sys.waitIdle(t)
}

// A graph's arena is its own: another graph may not bind it (as a KV
// cache, say), since releasing its graph frees it. Its address is learnt
// as a tenant would: a freed allocation of the arena's size is where the
// arena goes next, which the free check confirms.
func TestTensorGraphArenaIsNotBound(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	const n = 1024
	probe := mallocHint(t, c, 4*n, api.HintActivation)
	if _, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: probe})); err != nil {
		t.Fatal(err)
	}
	fill := &api.GraphDef{
		Name:    "fill",
		Tensors: []api.TensorDef{{Name: "y", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResOutput}},
		Ops:     []api.OpDef{{Kernel: "fill_f32", Args: []api.OpArg{tgTensor(0), tgI64(n), tgF32(1)}}},
	}
	a := mustRegister(t, c, fill)
	_, err := roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: probe}))
	wantErr(t, err, api.ErrInvalidArgument, "has it as its arena")
	reader := &api.GraphDef{
		Name: "reader",
		Tensors: []api.TensorDef{
			{Name: "stolen", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResKVCache, Addr: probe},
			{Name: "sum", DType: api.DTypeF32, Shape: []int64{1}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{{Kernel: "reduce_sum_f32", Args: []api.OpArg{tgI64(n), tgTensor(0), tgTensor(1)}}},
	}
	_, err = roundTrip(t, c, api.OpGraphRegister, api.Encode(reader))
	wantErr(t, err, api.ErrInvalidArgument, `"stolen"`, fmt.Sprintf("%#x", probe), "the arena of", `"fill"`)
	if err := release(t, c, a); err != nil {
		t.Fatal(err)
	}
}

// TestTensorGraphInvocationFollowsQueuedWork: an invocation sent right
// behind a copy that is still queued on a stream (too large to run on
// arrival) reads what the copy wrote, and one behind a stream with nothing
// pending reads what is there: an invocation waits for exactly the work
// queued before it.
func TestTensorGraphInvocationFollowsQueuedWork(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	const n = 1 << 17 // 512 KiB: a copy of it is handed to the stream's executor
	cache := mallocHint(t, c, 4*n, api.HintKVCache)
	id := mustRegister(t, c, &api.GraphDef{
		Name: "sum",
		Tensors: []api.TensorDef{
			{Name: "cache", DType: api.DTypeF32, Shape: []int64{n}, Residency: api.ResKVCache, Addr: cache},
			{Name: "sum", DType: api.DTypeF32, Shape: []int64{1}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{{Kernel: "reduce_sum_f32", Phase: api.PhaseDecode, Args: []api.OpArg{tgI64(n), tgTensor(0), tgTensor(1)}}},
	})
	reply := func(id uint64) []byte {
		t.Helper()
		_ = c.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
		h, err := c.ReadHeader()
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, h.Len)
		if err := c.ReadBody(b); err != nil {
			t.Fatal(err)
		}
		if h.ID != id || h.Flags&wire.FlagError != 0 {
			t.Fatalf("reply %+v, want a good one to request %d", h, id)
		}
		return b
	}
	var copied float32 // the value every float of the cache has
	for k := range uint64(4) {
		busy := k%2 == 1 // a stream busy with a copy; else idle
		if busy {
			copied = float32(k)
			v := client.Float32Bytes(seq(n, func(int) float32 { return copied }))
			if err := c.WriteFrame(api.OpCopyToDevice, 0, 100+k, api.Encode(&api.CopyToDevice{Dst: cache, Payload: v})); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.WriteFrame(api.OpGraphInvoke, 0, 200+k, api.Encode(&api.GraphInvoke{Graph: id})); err != nil {
			t.Fatal(err)
		}
		if busy {
			reply(100 + k) // answered before the invocation ran
		}
		if got, want := client.BytesFloat32(reply(200 + k))[0], copied*n; got != want {
			t.Fatalf("invocation %d: sum %v, want %v", k, got, want)
		}
	}
}
