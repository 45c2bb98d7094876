package accelerator

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Arguments of a node graph's launches.
func gBuf(xs ...api.Extent) api.NodeGraphArg {
	return api.NodeGraphArg{NodeArg: bufArg(xs...), Scalar: -1}
}
func gI64(v int64) api.NodeGraphArg   { return api.NodeGraphArg{NodeArg: i64Arg(v), Scalar: -1} }
func gF32(v float32) api.NodeGraphArg { return api.NodeGraphArg{NodeArg: f32Arg(v), Scalar: -1} }

// gScalar is mul × scalars[i] + add.
func gScalar(i int32, mul, add int64) api.NodeGraphArg {
	return api.NodeGraphArg{NodeArg: api.NodeArg{Kind: api.ArgI64}, Scalar: i, Mul: mul, Add: add}
}

func gLaunch(phase api.Phase, kernel string, args ...api.NodeGraphArg) api.NodeGraphLaunch {
	return api.NodeGraphLaunch{Kernel: kernel, Phase: phase, Args: args}
}

func (c *client) registerGraph(dev uint32, ls ...api.NodeGraphLaunch) (uint32, error) {
	body, err := c.call(api.OpNodeGraphRegister, &api.NodeGraph{Device: dev, Launches: ls})
	if err != nil {
		return 0, err
	}
	var g api.Graph
	if err := api.Decode(body, &g); err != nil {
		return 0, err
	}
	return g.Graph, nil
}

func (c *client) mustRegister(dev uint32, ls ...api.NodeGraphLaunch) uint32 {
	c.t.Helper()
	id, err := c.registerGraph(dev, ls...)
	if err != nil {
		c.t.Fatalf("register a graph of %d launches: %v", len(ls), err)
	}
	return id
}

func (c *client) runGraph(id uint32, scalars ...int64) error {
	_, err := c.call(api.OpNodeGraphRun, &api.NodeGraphRun{Graph: id, Scalars: scalars})
	return err
}

func (c *client) freeGraph(id uint32) error {
	_, err := c.call(api.OpNodeGraphFree, &api.Graph{Graph: id})
	return err
}

// floats reads the floats at x.
func (c *client) floats(dev uint32, xs ...api.Extent) string {
	c.t.Helper()
	return fmt.Sprint(bytesF32(c.mustRead(dev, xs...)))
}

// TestNodeGraph: a registered graph runs its launches in order with each
// run's scalars, each launch seeing what those before it wrote (in place
// and gathered from several runs of memory), as often as asked, until
// freed; every launch counts.
func TestNodeGraph(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(1, 3)
	// x lies in two frames that are not adjacent: launches gather it.
	x := []api.Extent{ext(f[0], FrameSize-8, 8), ext(f[2], 0, 8)}
	y, sum := ext(f[1], 0, 16), ext(f[1], 64, 4)
	c.mustWrite(1, []api.Extent{y}, f32Bytes(1, 2, 3, 4))
	id := c.mustRegister(1,
		gLaunch(api.PhaseOther, "fill_f32", gBuf(x...), gI64(4), gF32(2)),                  // x = 2
		gLaunch(api.PhasePrefill, "saxpy", gScalar(0, 1, 0), gF32(3), gBuf(x...), gBuf(y)), // y[:n] += 3x
		gLaunch(api.PhaseDecode, "reduce_sum_f32", gScalar(0, 2, -4), gBuf(y), gBuf(sum)),  // sum(y[:2n-4])
	)
	before := c.status()
	if err := c.runGraph(id, 4); err != nil {
		t.Fatal(err)
	}
	if got := c.floats(1, y, sum); got != "[7 8 9 10 34]" {
		t.Fatalf("y, sum after a run with n = 4: %s, want [7 8 9 10 34]", got)
	}
	if err := c.runGraph(id, 3); err != nil {
		t.Fatal(err)
	}
	if got := c.floats(1, y, sum); got != "[13 14 15 10 27]" {
		t.Fatalf("y, sum after a run with n = 3: %s, want [13 14 15 10 27]", got)
	}
	st := c.status()
	if got := st.Devices[1].Launches - before.Devices[1].Launches; got != 6 {
		t.Errorf("two runs of 3 launches counted %d", got)
	}
	if err := c.freeGraph(id); err != nil {
		t.Fatal(err)
	}
	wantErr(t, c.runGraph(id, 4), api.ErrInvalidArgument, fmt.Sprint("graph ", id), "not registered")
	wantErr(t, c.freeGraph(id), api.ErrInvalidArgument, fmt.Sprint("graph ", id), "not registered")
	// Graphs are the connection's own.
	id = c.mustRegister(1, gLaunch(api.PhaseDecode, "fill_f32", gBuf(y), gI64(1), gF32(5)))
	o := tn.connect(t, "acme")
	wantErr(t, o.runGraph(id), api.ErrInvalidArgument, "not registered")
	wantErr(t, o.freeGraph(id), api.ErrInvalidArgument, "not registered")
	if err := c.runGraph(id); err != nil {
		t.Fatal(err)
	}
	if got := c.floats(1, y); got != "[5 14 15 10]" {
		t.Fatalf("y: %s", got)
	}
}

// TestNodeGraphBadRegistration: a graph with a bad launch is refused with
// a typed error naming the launch, its kernel and the offending value; the
// connection goes on, and nothing is registered.
func TestNodeGraphBadRegistration(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 2)
	sealed := f[1]
	if err := c.seal(0, sealed); err != nil {
		t.Fatal(err)
	}
	theirs := tn.connect(t, "rival").alloc(0, 1)[0]
	good := gLaunch(api.PhaseOther, "fill_f32", gBuf(ext(f[0], 0, 16)), gI64(4), gF32(1))
	withArg := func(i int, a api.NodeGraphArg) api.NodeGraphLaunch {
		l := good
		l.Args = append([]api.NodeGraphArg(nil), good.Args...)
		l.Args[i] = a
		return l
	}
	for _, tc := range []struct {
		name     string
		dev      uint32
		launch   api.NodeGraphLaunch
		sentinel error
		names    []string
	}{
		{"unknown kernel", 0, gLaunch(api.PhaseDecode, "fused_everything"), api.ErrUnknownKernel, []string{"fused_everything"}},
		{"no such phase", 0, func() api.NodeGraphLaunch { l := good; l.Phase = 9; return l }(), api.ErrInvalidArgument, []string{"fill_f32", "phase(9)"}},
		{"argument kinds", 0, withArg(1, gF32(4)), api.ErrInvalidArgument, []string{"fill_f32", "argument 1 (n)"}},
		{"too few arguments", 0, gLaunch(api.PhaseOther, "fill_f32", gBuf(ext(f[0], 0, 4))), api.ErrInvalidArgument, []string{"fill_f32", "takes 3 arguments"}},
		{"a scalar for an f32", 0, withArg(2, api.NodeGraphArg{NodeArg: api.NodeArg{Kind: api.ArgF32}, Scalar: 0}), api.ErrInvalidArgument,
			[]string{"fill_f32", "argument 2 (value)", "scalar 0", "only i64"}},
		{"a scalar past the limit", 0, withArg(1, gScalar(api.MaxGraphScalars, 1, 0)), api.ErrInvalidArgument,
			[]string{"fill_f32", "argument 1 (n)", fmt.Sprint("scalar ", api.MaxGraphScalars)}},
		{"another connection's frame", 0, withArg(0, gBuf(ext(theirs, 0, 16))), api.ErrPermissionDenied,
			[]string{"fill_f32 argument 0 (x)", hex(theirs), "not held"}},
		{"past the device's memory", 0, withArg(0, gBuf(ext(testMemory, 0, 16))), api.ErrInvalidAddress,
			[]string{"fill_f32 argument 0 (x)", "outside device memory"}},
		{"written into a sealed frame", 0, withArg(0, gBuf(ext(sealed, 0, 16))), api.ErrPermissionDenied,
			[]string{"fill_f32 argument 0 (x)", hex(sealed), "sealed"}},
		{"unknown device", 7, good, api.ErrInvalidArgument, []string{"device 7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.registerGraph(tc.dev, good, tc.launch)
			names := tc.names
			if tc.dev == 0 {
				names = append(names, "command 1 (node-launch)") // the launch's index
			}
			wantErr(t, err, tc.sentinel, names...)
			c.roundTrip(0, f[0])
		})
	}
	// A sealed frame may be read. The graph is the connection's first:
	// none of the refused ones was kept.
	id := c.mustRegister(0, gLaunch(api.PhaseOther, "saxpy", gI64(1), gF32(1), gBuf(ext(sealed, 0, 4)), gBuf(ext(f[0], 0, 4))))
	if id != 1 {
		t.Fatalf("first graph registered got id %d, want 1", id)
	}
	if err := c.runGraph(id); err != nil {
		t.Fatal(err)
	}
}

// TestNodeGraphBadRun: a run with the wrong count of scalars, a scalar
// that overflows an argument, or a frame that is no longer the
// connection's fails with a typed error naming the value, and writes
// nothing; the graph and the connection go on.
func TestNodeGraphBadRun(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 2)
	x, y := ext(f[0], 0, 16), ext(f[1], 0, 16)
	c.mustWrite(0, []api.Extent{x, y}, f32Bytes(1, 2, 3, 4, 10, 20, 30, 40))
	id := c.mustRegister(0,
		gLaunch(api.PhaseDecode, "fill_f32", gBuf(x), gI64(4), gF32(2)),
		gLaunch(api.PhaseDecode, "saxpy", gScalar(1, 2, 0), gF32(1), gBuf(x), gBuf(y)), // n = 2·scalars[1]
	)
	const unchanged = "[1 2 3 4 10 20 30 40]"
	for _, tc := range []struct {
		name     string
		scalars  []int64
		sentinel error
		names    []string
	}{
		{"no scalars", nil, api.ErrInvalidArgument, []string{fmt.Sprint("graph ", id), "takes 2 scalars", "gives 0"}},
		{"too many scalars", []int64{0, 1, 2}, api.ErrInvalidArgument, []string{"takes 2 scalars", "gives 3"}},
		{"overflow", []int64{0, math.MaxInt64/2 + 1}, api.ErrInvalidArgument,
			[]string{"command 1 (node-launch)", "saxpy", "argument 0 (n)", fmt.Sprint(int64(math.MaxInt64/2 + 1)), "overflows"}},
		{"past the buffers", []int64{0, 3}, api.ErrInvalidArgument, []string{"command 1 (node-launch)", "saxpy", "n = 6"}},
		{"negative", []int64{0, -1}, api.ErrInvalidArgument, []string{"command 1 (node-launch)", "saxpy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, c.runGraph(id, tc.scalars...), tc.sentinel, tc.names...)
			if got := c.floats(0, x, y); got != unchanged {
				t.Fatalf("after a failed run: %s, want %s", got, unchanged)
			}
		})
	}
	if err := c.runGraph(id, 99, 2); err != nil {
		t.Fatal(err)
	}
	if got := c.floats(0, x, y); got != "[2 2 2 2 12 22 32 42]" {
		t.Fatalf("after a run: %s", got)
	}
	// A frame freed since the registration, then another connection's:
	// the run fails and touches neither the frame nor anything else.
	if err := c.free(0, f[1]); err != nil {
		t.Fatal(err)
	}
	c.mustWrite(0, []api.Extent{x}, f32Bytes(1, 2, 3, 4))
	wantErr(t, c.runGraph(id, 0, 1), api.ErrPermissionDenied, "command 1 (node-launch)", "saxpy argument 3 (y)", hex(f[1]), "not held")
	o := tn.connect(t, "rival")
	theirs := o.alloc(0, testFrames-1) // every frame left, f[1] among them
	if !slices.Contains(theirs, f[1]) {
		t.Fatalf("the other connection did not get frame %#x: %#x", f[1], theirs)
	}
	o.mustWrite(0, []api.Extent{y}, f32Bytes(5, 5, 5, 5))
	wantErr(t, c.runGraph(id, 0, 1), api.ErrPermissionDenied, "command 1 (node-launch)", "saxpy argument 3 (y)")
	if got := o.floats(0, y); got != "[5 5 5 5]" {
		t.Fatalf("another connection's frame, once the graph's: %s", got)
	}
	if got := c.floats(0, x); got != "[1 2 3 4]" {
		t.Fatalf("x after runs that failed: %s", got)
	}
	// A frame sealed since: not written through the graph either.
	if err := c.seal(0, f[0]); err != nil {
		t.Fatal(err)
	}
	wantErr(t, c.runGraph(id, 0, 1), api.ErrPermissionDenied, "command 0 (node-launch)", "fill_f32 argument 0 (x)", "sealed")
	if got := c.floats(0, x); got != "[1 2 3 4]" { // and the connection serves on
		t.Fatalf("x after runs that failed: %s", got)
	}
}

// TestNodeGraphFailedRunWritesNothing: every launch of a run is checked,
// its contents too, before the first writes, so a run whose third launch
// fails leaves what the first two would have written untouched.
func TestNodeGraphFailedRunWritesNothing(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 1)[0]
	x, y := ext(f, 0, 16), ext(f, 16, 16)
	const rows, dim = 4, 2
	table := ext(f, 64, 4*rows*dim)
	idx, offsets, out := ext(f, 128, 8), ext(f, 136, 4), ext(f, 144, 4*dim)
	c.mustWrite(0, []api.Extent{table}, f32Bytes(0, 1, 10, 11, 20, 21, 30, 31))
	first := []api.NodeGraphLaunch{
		gLaunch(api.PhasePrefill, "fill_f32", gBuf(x), gI64(4), gF32(7)),                  // x = 7
		gLaunch(api.PhasePrefill, "saxpy", gI64(4), gF32(2), gBuf(x), gBuf(y)),            // y += 2x: reads what launch 0 wrote
		gLaunch(api.PhasePrefill, "saxpy", gScalar(0, 1, 0), gF32(1), gBuf(x), gBuf(out)), // out += x: n a scalar
	}
	bag := gLaunch(api.PhaseDecode, "embedding_bag_sum", gBuf(table), gI64(rows), gI64(dim), gBuf(idx), gI64(2), gBuf(offsets), gI64(1), gBuf(out))
	bySize := c.mustRegister(0, first...)
	byIndex := c.mustRegister(0, append(first[:2:2], bag)...)
	reset := func() {
		c.mustWrite(0, []api.Extent{x, y, out}, f32Bytes(1, 2, 3, 4, 0, 0, 0, 0, 0, 0))
		c.mustWrite(0, []api.Extent{idx, offsets}, []byte{1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0}) // indices 1, 3; offset 0
	}
	const untouched = "[1 2 3 4 0 0 0 0]"
	reset()
	wantErr(t, c.runGraph(bySize, 3), api.ErrInvalidArgument, "command 2 (node-launch)", "saxpy")
	if got := c.floats(0, x, y); got != untouched {
		t.Fatalf("x, y after a run whose 3rd launch's n was past its buffer: %s, want %s", got, untouched)
	}
	if err := c.runGraph(bySize, 2); err != nil {
		t.Fatal(err)
	}
	if got := c.floats(0, x, y, out); got != "[7 7 7 7 14 14 14 14 7 7]" {
		t.Fatalf("x, y, out after a good run: %s", got)
	}
	// An index out of range, which only the buffer's contents show.
	reset()
	c.mustWrite(0, []api.Extent{ext(idx.Addr+4, 0, 4)}, []byte{rows, 0, 0, 0})
	wantErr(t, c.runGraph(byIndex), api.ErrInvalidArgument, "command 2 (node-launch)", "embedding_bag_sum", "indices[1] = 4")
	if got := c.floats(0, x, y); got != untouched {
		t.Fatalf("x, y after a run whose 3rd launch's index was out of range: %s, want %s", got, untouched)
	}
	reset()
	if err := c.runGraph(byIndex); err != nil {
		t.Fatal(err)
	}
	if got := c.floats(0, x, y, out); got != "[7 7 7 7 14 14 14 14 40 42]" {
		t.Fatalf("x, y, out after a good run: %s", got)
	}
	// The same, where the launch reading the indices also reads what an
	// earlier one writes: its plan before the run, a check of them, is
	// made at every run, the frame table unchanged or not.
	tableFill := gLaunch(api.PhaseDecode, "fill_f32", gBuf(table), gI64(rows*dim), gF32(5))
	afterTable := c.mustRegister(0, tableFill, bag)
	reset()
	if err := c.runGraph(afterTable); err != nil {
		t.Fatal(err)
	}
	c.mustWrite(0, []api.Extent{table}, f32Bytes(0, 1, 10, 11, 20, 21, 30, 31))
	c.mustWrite(0, []api.Extent{ext(idx.Addr+4, 0, 4)}, []byte{rows, 0, 0, 0})
	wantErr(t, c.runGraph(afterTable), api.ErrInvalidArgument, "command 1 (node-launch)", "embedding_bag_sum", "indices[1] = 4")
	if got := c.floats(0, table); got != "[0 1 10 11 20 21 30 31]" {
		t.Fatalf("table after a run whose 2nd launch's index was out of range: %s, want it untouched", got)
	}
	// Indices an earlier launch of the run writes are checked at their
	// launch's turn (the limit in graph.go): the launches before it ran.
	reset()
	late := c.mustRegister(0, first[0], gLaunch(api.PhasePrefill, "fill_f32", gBuf(idx), gI64(2), gF32(1)), bag)
	wantErr(t, c.runGraph(late), api.ErrInvalidArgument, "command 2 (node-launch)", "embedding_bag_sum")
	if got := c.floats(0, x); got != "[7 7 7 7]" {
		t.Fatalf("x after a run whose launch 2 read bad indices launch 1 wrote: %s, want launch 0's", got)
	}
}

// TestNodeGraphLimits: a connection keeps at most so many graphs, launches
// and extents; past them a registration is refused as over quota, naming
// the counts, and a free makes room again. Other connections have their
// own.
func TestNodeGraphLimits(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 1)[0]
	fill := gLaunch(api.PhaseOther, "fill_f32", gBuf(ext(f, 0, 4)), gI64(1), gF32(1))
	var ids []uint32
	for range MaxNodeGraphs {
		ids = append(ids, c.mustRegister(0, fill))
	}
	_, err := c.registerGraph(0, fill)
	wantErr(t, err, api.ErrQuotaExceeded, fmt.Sprint(MaxNodeGraphs, " graphs"))
	if err := c.freeGraph(ids[7]); err != nil {
		t.Fatal(err)
	}
	c.mustRegister(0, fill)
	o := tn.connect(t, "acme")
	o.mustRegister(0, gLaunch(api.PhaseOther, "fill_f32", gBuf(ext(o.alloc(0, 1)[0], 0, 4)), gI64(1), gF32(1)))

	tn = startNode(t)
	tn.node.graphLimits = graphLimits{graphs: 10, launches: 5, extents: 8}
	c = tn.connect(t, "acme")
	f = c.alloc(0, 1)[0]
	launches := func(n, extents int) []api.NodeGraphLaunch {
		ls := make([]api.NodeGraphLaunch, n)
		for i := range ls {
			xs := make([]api.Extent, extents)
			for j := range xs {
				xs[j] = ext(f, uint64(8*j), 4)
			}
			ls[i] = gLaunch(api.PhaseOther, "fill_f32", gBuf(xs...), gI64(1), gF32(1))
		}
		return ls
	}
	id := c.mustRegister(0, launches(3, 2)...)
	_, err = c.registerGraph(0, launches(3, 1)...)
	wantErr(t, err, api.ErrQuotaExceeded, "3 launches", "have 3", "at most 5")
	_, err = c.registerGraph(0, launches(1, 3)...)
	wantErr(t, err, api.ErrQuotaExceeded, "3 extents", "have 6", "at most 8")
	c.mustRegister(0, launches(2, 1)...)
	if err := c.freeGraph(id); err != nil {
		t.Fatal(err)
	}
	c.mustRegister(0, launches(3, 2)...)
}

// TestNodeGraphEndsWithConnection: a connection's graphs go with it, and
// its frames are freed as always.
func TestNodeGraphEndsWithConnection(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 2)
	c.mustRegister(0, gLaunch(api.PhaseDecode, "fill_f32", gBuf(ext(f[0], 0, FrameSize)), gI64(FrameSize/4), gF32(1)))
	c.rpc.Close()
	tn.waitUsed(t, [testDevices]uint64{})
	if n := tn.node.Status().Connections; n != 0 {
		t.Fatalf("%d connections after the only one ended", n)
	}
}

// TestMulAdd: mulAdd agrees with exact arithmetic, and says false exactly
// TestWrittenBefore: the segment tree agrees with comparing every read
// with every write.
func TestWrittenBefore(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		launches := rapid.IntRange(1, 8).Draw(t, "launches")
		gen := func(label string) []byteRange {
			return rapid.SliceOfN(rapid.Custom(func(t *rapid.T) byteRange {
				lo := rapid.Uint64Range(0, 64).Draw(t, "lo")
				return byteRange{lo, lo + rapid.Uint64Range(1, 24).Draw(t, "len"), rapid.IntRange(0, launches-1).Draw(t, "launch")}
			}), 0, 12).Draw(t, label)
		}
		writes, reads := gen("writes"), gen("reads")
		got := writtenBefore(writes, reads)
		for i, r := range reads {
			want := false
			for _, w := range writes {
				want = want || w.launch < r.launch && w.lo < r.hi && r.lo < w.hi
			}
			if got[i] != want {
				t.Fatalf("read %d %+v: written before %v, want %v", i, r, got[i], want)
			}
		}
	})
}

// FuzzNodeGraph: whatever a mediator registers and runs, the node answers
// (a graph id, or a typed error) and goes on serving; a run touches only
// the connection's frames.
func FuzzNodeGraph(f *testing.F) {
	tn := startSim(f, 1, 16<<20)
	c := tn.connect(f, "fuzz")
	mine := c.alloc(0, 2)
	o := tn.connect(f, "other")
	theirs := o.alloc(0, 1)[0]
	o.mustWrite(0, []api.Extent{ext(theirs, 0, 64)}, pattern(3, 64))
	seed := func(scalars []int64, ls ...api.NodeGraphLaunch) {
		var e wire.Encoder
		for _, s := range scalars {
			e.I64(s)
		}
		f.Add(api.Encode(&api.NodeGraph{Device: 0, Launches: ls}), e.B)
	}
	x := ext(mine[0], 0, 64)
	seed([]int64{4}, gLaunch(api.PhaseDecode, "fill_f32", gBuf(x), gScalar(0, 1, 0), gF32(1)))
	seed(nil, gLaunch(api.PhasePrefill, "saxpy", gI64(16), gF32(2), gBuf(x), gBuf(ext(mine[1], 0, 64))),
		gLaunch(api.PhaseOther, "reduce_sum_f32", gI64(16), gBuf(x), gBuf(ext(mine[1], 128, 4))))
	seed([]int64{1, 2}, gLaunch(api.PhaseDecode, "sgemm", gScalar(1, 1, 0), gI64(1), gI64(1), gF32(1), gBuf(x), gBuf(x), gF32(0), gBuf(ext(mine[1], 0, 4))))
	seed(nil, gLaunch(api.PhaseDecode, "fill_f32", gBuf(ext(theirs, 0, 64)), gI64(16), gF32(1)))
	f.Fuzz(func(t *testing.T, graph, scalars []byte) {
		body, err := c.rpc.Call(api.OpNodeGraphRegister, nil, graph)
		if err != nil {
			if code := api.CodeOf(err); code == 0 || strings.Contains(err.Error(), "panic") {
				t.Fatalf("registration refused without a typed error: %v", err)
			}
			return
		}
		var g api.Graph
		if err := api.Decode(body, &g); err != nil {
			t.Fatal(err)
		}
		d := wire.NewDecoder(scalars)
		var run api.NodeGraphRun
		run.Graph = g.Graph
		for range min(len(scalars)/8, api.MaxGraphScalars) {
			run.Scalars = append(run.Scalars, d.I64())
		}
		if _, err := c.call(api.OpNodeGraphRun, &run); err != nil && api.CodeOf(err) == 0 {
			t.Fatalf("run refused without a typed error: %v", err)
		}
		if err := c.freeGraph(g.Graph); err != nil {
			t.Fatal(err)
		}
		if got, err := o.read(0, ext(theirs, 0, 64)); err != nil || !bytes.Equal(got, pattern(3, 64)) {
			t.Fatalf("another connection's frame reads %x, %v: a graph changed it", got, err)
		}
	})
}

// directConn is a connection of tenant to tn's node without a socket, so
// that a test can call its graph requests and see what each run checked.
func directConn(t *testing.T, tn *testNode, tenant string) *conn {
	t.Helper()
	n := tn.node
	c := &conn{node: n, owner: owner(n.nextOwner.Add(1)), tenant: tenant}
	limits, _ := n.joinTenant(tenant, c.owner, limit{weight: 1})
	c.share = tenantShare{name: tenant, limits: limits, waiting: func() bool { return false }}
	t.Cleanup(func() { n.leaveTenant(tenant, c.owner) })
	return c
}

// TestNodeGraphRecheck: a run checks again only the launches whose values
// changed, while the frame table has not changed since the last run that
// planned the whole graph; any change of it (another connection's too)
// has every launch checked again, so a frame freed, sealed or shared
// since fails the run naming the launch, as at the first run.
func TestNodeGraphRecheck(t *testing.T) {
	tn := startNode(t)
	c := directConn(t, tn, "acme")
	other := directConn(t, tn, "rival")
	d := tn.node.devs[0]
	for _, tc := range []struct {
		name     string
		change   func(x, y api.Extent)
		scalars  []int64
		rechecks int      // launches checked in full by the second run
		sentinel error    // of the second run
		names    []string // in its error
	}{
		{"nothing changed", func(x, y api.Extent) {}, []int64{2}, 0, nil, nil},
		{"a value changed", func(x, y api.Extent) {}, []int64{3}, 1, nil, nil},
		{"another connection allocated", func(x, y api.Extent) {
			if _, err := d.frames.alloc(other.owner, 1); err != nil {
				t.Fatal(err)
			}
		}, []int64{2}, 2, nil, nil},
		{"a frame freed", func(x, y api.Extent) { d.frames.release([]uint64{y.Addr}) }, []int64{2}, 2,
			api.ErrPermissionDenied, []string{"command 1 (node-launch)", "saxpy argument 3 (y)", "not held"}},
		{"a frame sealed", func(x, y api.Extent) { d.frames.seal(x.Addr) }, []int64{2}, 1,
			api.ErrPermissionDenied, []string{"command 0 (node-launch)", "fill_f32 argument 0 (x)", "sealed"}},
		{"a frame shared", func(x, y api.Extent) {
			if err := d.frames.share([]api.Extent{y}); err != nil {
				t.Fatal(err)
			}
		}, []int64{2}, 2, api.ErrPermissionDenied, []string{"command 1 (node-launch)", "saxpy argument 3 (y)", "shared object"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := d.frames.alloc(c.owner, 2)
			if err != nil {
				t.Fatal(err)
			}
			x, y := ext(f[0], 0, 16), ext(f[1], 0, 16)
			id, err := c.registerGraph(&api.NodeGraph{Launches: []api.NodeGraphLaunch{
				gLaunch(api.PhaseDecode, "fill_f32", gBuf(x), gI64(4), gF32(2)),
				gLaunch(api.PhaseDecode, "saxpy", gScalar(0, 1, 0), gF32(1), gBuf(x), gBuf(y)), // reads what fill_f32 wrote
			}})
			if err != nil {
				t.Fatal(err)
			}
			g := c.graphs.byID[id]
			if err := c.runGraph(&api.NodeGraphRun{Graph: id, Scalars: []int64{2}}); err != nil || g.rechecks != 2 {
				t.Fatalf("first run: err %v, %d launches checked, want 2", err, g.rechecks)
			}
			tc.change(x, y)
			err = c.runGraph(&api.NodeGraphRun{Graph: id, Scalars: tc.scalars})
			if got := g.rechecks - 2; got != tc.rechecks {
				t.Errorf("second run checked %d launches, want %d", got, tc.rechecks)
			}
			if tc.sentinel == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("second run: %v, want %v", err, tc.sentinel)
			}
			for _, s := range tc.names {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
		})
	}
}
