package e2e

import (
	"errors"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// TestGraphsSurviveMediatorKill: a tenant captures a graph and registers a
// tensor graph, the mediator is SIGKILLed and started again on the same
// state directory, and after the session resumes the same graph and
// tensor graph run with correct results — the restarted mediator rebuilt
// them from the session's journal, the tensor graph's launches registered
// anew with the node, which forgot them with the dropped connection. A
// graph that copies host memory cannot be rebuilt (the restart lost the
// memory's registration): its launch fails unavailable, saying so, and
// its id is destroyed as any other's.
func TestGraphsSurviveMediatorKill(t *testing.T) {
	r := newRestartable(t)
	r.start()
	c := r.dial(0)
	const n = 1024
	xs, ws := make([]float32, n), make([]float32, n)
	for i := range xs {
		xs[i], ws[i] = float32(i)+0.5, float32(3*i)-7
	}
	x, y, w := mallocF32(t, c, n), mallocF32(t, c, n), mallocF32(t, c, n)
	s := c.Stream()
	s.CopyToDevice(x, client.Float32Bytes(xs))
	s.CopyToDevice(w, client.Float32Bytes(ws))
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Seal(w); err != nil {
		t.Fatal(err)
	}

	// y = 2x, as a captured graph.
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	s.Memset(y, 0, 4*n)
	s.Launch("saxpy", client.I64(n), client.F32(2), client.Buf(x), client.Buf(y))
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	// A graph that copies into host memory.
	host, err := c.HostAlloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	s.CopyFromDevice(host, y)
	hg, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	// out = in + 3w, as a tensor graph binding the sealed weight w.
	b := client.NewGraphDef("affine")
	wt := b.Weight("w", api.DTypeF32, w, n)
	in := b.Input("in", api.DTypeF32, n)
	out := b.Output("out", api.DTypeF32, n)
	b.Op(api.PhaseForward, "fill_f32", out, client.Int(n), client.Float(0))
	b.Op(api.PhaseForward, "saxpy", client.Int(n), client.Float(1), in, out)
	b.Op(api.PhaseForward, "saxpy", client.Int(n), client.Float(3), wt, out)
	tg, err := c.RegisterGraph(b)
	if err != nil {
		t.Fatal(err)
	}
	checkGraphs := func(when string, k float32) {
		t.Helper()
		s.Replay(g)
		got := make([]byte, 4*n)
		s.CopyFromDevice(got, y)
		if err := s.Synchronize(); err != nil {
			t.Fatalf("graph launch %s: %v\nmediator log:\n%s", when, err, r.med.out.String())
		}
		for i, v := range client.BytesFloat32(got) {
			if v != 2*xs[i] {
				t.Fatalf("graph %s: y[%d] = %g, want %g", when, i, v, 2*xs[i])
			}
		}
		ins := make([]float32, n)
		for i := range ins {
			ins[i] = k * float32(i)
		}
		outs, err := tg.Invoke(nil, client.Float32Bytes(ins))
		if err != nil {
			t.Fatalf("tensor graph invoke %s: %v\nmediator log:\n%s", when, err, r.med.out.String())
		}
		for i, v := range client.BytesFloat32(outs[0]) {
			if want := ins[i] + 3*ws[i]; v != want {
				t.Fatalf("tensor graph %s: out[%d] = %g, want %g", when, i, v, want)
			}
		}
	}
	checkGraphs("before the kill", 1)
	session := c.Session()

	r.kill()
	r.start()
	// A read, safe to send again, finds the connection broken and resumes
	// the session; a graph's launch that found it so would fail
	// interrupted (client/reconnect.go), as a launch may not be sent twice.
	before := make([]byte, 4*n)
	s.CopyFromDevice(before, x)
	if err := s.Synchronize(); err != nil {
		t.Fatalf("read after the restart: %v\nmediator log:\n%s", err, r.med.out.String())
	}
	checkGraphs("after the restart", -2)
	if c.Session() != session {
		t.Fatalf("session %d after the restart, want %d resumed", c.Session(), session)
	}
	r.med.out.waitLog(t, "the mediator's log does not say it restored and resumed the session", "session restored", "session resumed")
	s.Replay(hg)
	if err := s.Synchronize(); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "host memory") {
		t.Fatalf("launch of the graph that copies host memory after the restart: %v, want unavailable naming host memory", err)
	}
	if err := hg.Destroy(); err != nil {
		t.Fatal(err)
	}

	// Both go on as any graph: released and destroyed, what they held is
	// free again, and a second restart rebuilds none of them.
	if err := tg.Release(); err != nil {
		t.Fatal(err)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	r.kill()
	r.start()
	s.CopyFromDevice(before, x)
	if err := s.Synchronize(); err != nil {
		t.Fatalf("read after the second restart: %v\nmediator log:\n%s", err, r.med.out.String())
	}
	s.Replay(g)
	if err := s.Synchronize(); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("launch of the destroyed graph after a second restart: %v, want invalid argument", err)
	}
	if _, err := tg.Invoke(nil, make([]byte, 4*n)); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("invoke of the released tensor graph after a second restart: %v, want invalid argument", err)
	}
	for _, p := range []client.Ptr{x, y, w} {
		if err := c.Free(p); err != nil {
			t.Fatal(err)
		}
	}
}

// mallocF32 allocates n float32s on device 0 of c.
func mallocF32(t *testing.T, c *client.Client, n int) client.Ptr {
	t.Helper()
	p, err := c.Malloc(0, uint64(4*n))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
