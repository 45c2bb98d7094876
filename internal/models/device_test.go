package models

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/systest"
)

func dial(t *testing.T, socket, tenant string) *client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{Socket: socket, Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func prompt(cfg GPTConfig, n int) []int32 {
	rng := rand.New(rand.NewPCG(cfg.Seed, 99))
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(rng.IntN(cfg.Vocab))
	}
	return p
}

// loaded loads m into a new session of tenant and returns a runner of it.
func loaded(t *testing.T, socket, tenant string, m *GPT, hints bool, o RunOptions) (*client.Client, *GPTRunner) {
	t.Helper()
	c := dial(t, socket, tenant)
	dev, err := m.Load(c, hints)
	if err != nil {
		t.Fatal(err)
	}
	r := dev.Runner(o)
	t.Cleanup(func() { r.Close() })
	return c, r
}

// The decoder run op by op, as stream launches, generates what the
// float64 reference does: every pass's logits within the tolerance and
// every greedy token the same, tied head or not.
func TestGPTOpByOpMatchesReference(t *testing.T) {
	socket := systest.Start(t, 1, 64<<20)
	for _, tied := range []bool{true, false} {
		cfg := tinyGPT
		cfg.TiedHead = tied
		m, err := NewGPT(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, r := loaded(t, socket, "ops", m, false, RunOptions{OpByOp: true, Out: OutLogits | OutNext})
		g, err := Generate(r, m.Reference(), prompt(cfg, 4), cfg.Context-3, DemoTolerance)
		if err != nil {
			t.Fatalf("tied %v: %v", tied, err)
		}
		if g.Passes != cfg.Context-3 || len(g.Tokens) != g.Passes || !(g.MaxDiff < 1e-4) {
			t.Errorf("tied %v: %+v", tied, g)
		}
		t.Logf("tied %v: %d passes, max |Δlogit| %.2g, tokens %v", tied, g.Passes, g.MaxDiff, g.Tokens)
	}
}

// A check against the reference is real: a weight changed on the device's
// side only is caught at the first pass.
func TestGenerateCatchesAWrongModel(t *testing.T) {
	socket := systest.Start(t, 1, 64<<20)
	m, err := NewGPT(tinyGPT)
	if err != nil {
		t.Fatal(err)
	}
	wrong, _ := NewGPT(tinyGPT)
	wrong.weights = slices.Clone(wrong.weights)
	lnf := wrong.index["ln_f.b"]
	wrong.weights[lnf].Data = slices.Clone(wrong.weights[lnf].Data)
	wrong.weights[lnf].Data[3] += 0.01
	_, r := loaded(t, socket, "ops", wrong, false, RunOptions{OpByOp: true, Out: OutLogits})
	if _, err := Generate(r, m.Reference(), prompt(tinyGPT, 3), 2, DemoTolerance); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "pass 0") {
		t.Fatalf("err %v, want a mismatch at pass 0", err)
	}
}

// Registered graphs compute bit for bit what the same kernels launched op
// by op do, each pass in one request on the tenant's socket (op by op: the
// batch of launches, then a copy back per output).
func TestGPTGraphEqualsOpByOp(t *testing.T) {
	socket := systest.Start(t, 1, 64<<20)
	m, err := NewGPT(tinyGPT)
	if err != nil {
		t.Fatal(err)
	}
	out := OutLogits | OutNext
	gc, graph := loaded(t, socket, "graph", m, true, RunOptions{Out: out})
	oc, ops := loaded(t, socket, "ops", m, false, RunOptions{OpByOp: true, Out: out})
	if err := errors.Join(graph.Prepare(1, 5), ops.Prepare(1, 5)); err != nil {
		t.Fatal(err)
	}
	ref := m.Reference()
	in, pos := prompt(tinyGPT, 5), 0
	for pass := 0; pos+len(in) <= tinyGPT.Context; pass++ {
		g0, o0 := gc.Requests(), oc.Requests()
		gs, err := graph.Forward(pos, in)
		if err != nil {
			t.Fatalf("pass %d, graph: %v", pass, err)
		}
		os, err := ops.Forward(pos, in)
		if err != nil {
			t.Fatalf("pass %d, op by op: %v", pass, err)
		}
		if g, o := gc.Requests()-g0, oc.Requests()-o0; g != 1 || o != 3 {
			t.Errorf("pass %d: %d requests for the graph, %d op by op; want 1 and 3", pass, g, o)
		}
		if !slices.Equal(gs.Logits, os.Logits) || gs.Next != os.Next {
			t.Fatalf("pass %d: graph and op by op differ: next %d and %d", pass, gs.Next, os.Next)
		}
		want, err := ref.Forward(in)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := CheckStep(gs, want, out, DemoTolerance); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		pos += len(in)
		in = []int32{gs.Next}
	}
}

// An invocation refused by a kernel's checks leaves the KV caches as they
// were: the error names the op, and the same pass with a good token then
// gives the reference's logits.
func TestGPTBadTokenLeavesTheCache(t *testing.T) {
	socket := systest.Start(t, 1, 64<<20)
	m, err := NewGPT(tinyGPT)
	if err != nil {
		t.Fatal(err)
	}
	_, r := loaded(t, socket, "graph", m, true, RunOptions{Out: OutLogits})
	ref := m.Reference()
	p := prompt(tinyGPT, 4)
	if _, err := r.Forward(0, p); err != nil {
		t.Fatal(err)
	}
	if _, err := ref.Forward(p); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		pos int
		tok int32
		msg string
	}{
		{4, int32(tinyGPT.Vocab), "embedding"},
		{4, -1, "embedding"},
		{tinyGPT.Context, 1, "start + len = 12 + 1"},
	} {
		_, err := r.Forward(bad.pos, []int32{bad.tok})
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("token %d at %d: err %v, want invalid argument naming %q", bad.tok, bad.pos, err, bad.msg)
		}
	}
	st, err := r.Forward(4, []int32{3})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ref.Forward([]int32{3})
	if _, _, err := CheckStep(st, want, OutLogits, DemoTolerance); err != nil {
		t.Fatalf("after the refused passes: %v", err)
	}
}

// The DLRM step as a graph of phase forward gives the bench's outputs bit
// for bit, in one request per step.
func TestDLRMGraph(t *testing.T) {
	socket := systest.Start(t, 1, 64<<20)
	sh := DLRMShape{TableBytes: 1 << 20, Dim: 16, Batch: 8, Pooling: 4, Hidden: 16, Out: 8}
	sh.Defaults(1 << 30)
	m := NewDLRM(sh, 3)
	c := dial(t, socket, "dlrm")
	ptrs, err := Upload(c, m.Weights(), true)
	if err != nil {
		t.Fatal(err)
	}
	g, err := c.RegisterGraph(m.Graph(ptrs[0], ptrs[1], ptrs[2]))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	for k, b := range m.Batches {
		before := c.Requests()
		out, err := g.Invoke(nil, client.Int32Bytes(b.Indices), client.Int32Bytes(b.Offsets))
		if err != nil {
			t.Fatalf("batch %d: %v", k, err)
		}
		if n := c.Requests() - before; n != 1 {
			t.Errorf("batch %d: %d requests", k, n)
		}
		if err := m.Check(k, out[0]); err != nil {
			t.Error(err)
		}
	}
	bad := slices.Clone(m.Batches[0].Indices)
	bad[5] = int32(m.Rows)
	if _, err := g.Invoke(nil, client.Int32Bytes(bad), client.Int32Bytes(m.Batches[0].Offsets)); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("an index past the table: %v", err)
	}
}
