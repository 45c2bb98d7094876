package accelerator

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/vgpu/vgpu/api"
)

func launchCmd(dev uint32, kernel string, args ...api.NodeArg) api.Cmd {
	return cmd(api.OpNodeLaunch, &api.NodeLaunch{Device: dev, Kernel: kernel, Args: args})
}

// TestNodeBatch: a batch's commands run in order, each seeing the results
// of those before it, launches included: a launch's gathered buffer is
// gathered after the launch before it wrote it.
func TestNodeBatch(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 3)
	g := c.alloc(1, 1)[0]
	// x over two frames that are not adjacent, so launches gather it.
	x := []api.Extent{ext(f[0], FrameSize-8, 8), ext(f[2], 0, 8)}
	y := ext(f[1], 0, 16)
	z := ext(g, 64, 16)
	before := c.status()
	err := c.batch(
		cmd(api.OpNodeWrite, &api.NodeAccess{Extents: x, Payload: f32Bytes(1, 2, 3, 4)}),
		cmd(api.OpNodeFill, &api.NodeAccess{Extents: []api.Extent{y}, Value: 0}),
		launchCmd(0, "saxpy", i64Arg(4), f32Arg(10), bufArg(x...), bufArg(y)),             // y = 10x
		launchCmd(0, "saxpy", i64Arg(4), f32Arg(1), bufArg(y), bufArg(x...)),              // x = y + x = 11x
		launchCmd(0, "saxpy", i64Arg(4), f32Arg(-1), bufArg(x...), bufArg(y)),             // y = y - x
		launchCmd(1, "fill_f32", bufArg(z), i64Arg(4), f32Arg(0.5)),                       // the other device
		launchCmd(0, "saxpy", i64Arg(2), f32Arg(2), bufArg(y), bufArg(x[1])),              // x[2:] += 2y[:2]
		cmd(api.OpNodeCopy, &api.NodeCopy{Dst: []api.Extent{ext(f[1], 100, 16)}, Src: x}), // copy of x
		cmd(api.OpNodeFill, &api.NodeAccess{Extents: []api.Extent{ext(f[1], 100, 1)}, Value: 0x7f}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(bytesF32(c.mustRead(0, x...))); got != "[11 22 31 40]" {
		t.Fatalf("x = %s, want [11 22 31 40]", got)
	}
	if got := fmt.Sprint(bytesF32(c.mustRead(0, y))); got != "[-1 -2 -3 -4]" {
		t.Fatalf("y = %s, want [-1 -2 -3 -4]", got)
	}
	if got := fmt.Sprint(bytesF32(c.mustRead(1, z))); got != "[0.5 0.5 0.5 0.5]" {
		t.Fatalf("z = %s", got)
	}
	want := f32Bytes(11, 22, 31, 40)
	want[0] = 0x7f
	if got := c.mustRead(0, ext(f[1], 100, 16)); !bytes.Equal(got, want) {
		t.Fatalf("copy then fill: %x, want %x", got, want)
	}
	// Every launch counts, on its device and for the tenant.
	after := c.status()
	for dev, n := range []uint64{4, 1} {
		if got := after.Devices[dev].Launches - before.Devices[dev].Launches; got != n {
			t.Errorf("device %d counted %d launches, want %d", dev, got, n)
		}
		if len(after.Shares) != 2 || after.Shares[dev].Launches != n {
			t.Errorf("shares %+v, want %d launches on device %d", after.Shares, n, dev)
		}
	}
	if err := c.batch(); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
}

// TestNodeBatchErrors: every command of a batch runs even after one failed;
// the reply names the first that failed, by index and op, with its typed
// error; the connection goes on.
func TestNodeBatchErrors(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 1)[0]
	o := tn.connect(t, "rival")
	theirs := o.alloc(0, 1)[0]
	at := func(i uint64) api.Extent { return ext(f, 4*i, 4) }
	fill := func(i uint64, v float32) api.Cmd {
		return launchCmd(0, "fill_f32", bufArg(at(i)), i64Arg(1), f32Arg(v))
	}
	for _, tc := range []struct {
		name     string
		cmds     []api.Cmd
		sentinel error
		names    []string
	}{
		{"write to another's frame", []api.Cmd{
			fill(0, 1),
			cmd(api.OpNodeWrite, &api.NodeAccess{Extents: []api.Extent{ext(theirs, 0, 4)}, Payload: f32Bytes(9)}),
			fill(1, 2),
		}, api.ErrPermissionDenied, []string{"command 1 (node-write)", hex(theirs)}},
		{"launch refused by its kernel, mid run", []api.Cmd{
			fill(0, 1),
			launchCmd(0, "fill_f32", bufArg(at(2)), i64Arg(2), f32Arg(5)), // n past the buffer
			fill(1, 2),
		}, api.ErrInvalidArgument, []string{"command 1 (node-launch)", "fill_f32"}},
		{"the first failure is named, not the first found", []api.Cmd{
			fill(0, 1),
			launchCmd(0, "fill_f32", bufArg(at(2)), i64Arg(2), f32Arg(5)), // fails when run
			launchCmd(0, "nope"), // fails when checked, before the run
			fill(1, 2),
		}, api.ErrInvalidArgument, []string{"command 1 (node-launch)"}},
		{"disallowed op", []api.Cmd{
			fill(0, 1),
			cmd(api.OpNodeRead, &api.NodeAccess{Extents: []api.Extent{at(0)}}),
			cmd(api.OpNodeFree, &api.NodeFrames{Frames: []uint64{f}}),
			fill(1, 2),
		}, api.ErrInvalidArgument, []string{"command 1 (node-read)", "node-read cannot be batched"}},
		{"nested batch", []api.Cmd{
			cmd(api.OpNodeBatch, &api.Batch{Cmds: []api.Cmd{fill(2, 7)}}),
			fill(0, 1),
			fill(1, 2),
		}, api.ErrInvalidArgument, []string{"command 0 (node-batch)"}},
		{"malformed command", []api.Cmd{
			fill(0, 1),
			fill(1, 2),
			{Op: api.OpNodeFill, Body: []byte{1, 2}},
		}, api.ErrProtocol, []string{"command 2 (node-fill)"}},
		{"unknown device", []api.Cmd{
			fill(0, 1),
			launchCmd(5, "fill_f32", bufArg(at(0)), i64Arg(1), f32Arg(1)),
			fill(1, 2),
		}, api.ErrInvalidArgument, []string{"command 1 (node-launch)", "device 5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.fill(0, 0, ext(f, 0, 64)); err != nil {
				t.Fatal(err)
			}
			wantErr(t, c.batch(tc.cmds...), tc.sentinel, tc.names...)
			if got := fmt.Sprint(bytesF32(c.mustRead(0, ext(f, 0, 12)))); got != "[1 2 0]" {
				t.Fatalf("after the batch: %s, want [1 2 0]: every other command ran, nothing else", got)
			}
		})
		c.roundTrip(0, f)
	}
	if got := o.mustRead(0, ext(theirs, 0, 4)); !bytes.Equal(got, make([]byte, 4)) {
		t.Fatal("another connection's frame changed")
	}
	raw := func(body []byte) error { _, err := c.rpc.Call(api.OpNodeBatch, nil, body); return err }
	wantErr(t, raw([]byte{0, 0, 0}), api.ErrProtocol, "node-batch")
	wantErr(t, raw(append(api.Encode(&api.Batch{Cmds: []api.Cmd{fill(0, 1)}}), 0)), api.ErrProtocol, "node-batch", "trailing")
	c.roundTrip(0, f)
}

// TestNodeBatchRunSharesDevice: a batch's run of many tiny launches is one
// job of the scheduler, cut into several slices (so other tenants' slices
// can run between them), and counts every launch.
func TestNodeBatchRunSharesDevice(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 1)[0]
	const n = 512
	cmds := make([]api.Cmd, n)
	for i := range cmds {
		cmds[i] = launchCmd(0, "fill_f32", bufArg(ext(f, 4*uint64(i), 4)), i64Arg(1), f32Arg(float32(i)))
	}
	if err := c.batch(cmds...); err != nil {
		t.Fatal(err)
	}
	for i, v := range bytesF32(c.mustRead(0, ext(f, 0, 4*n))) {
		if v != float32(i) {
			t.Fatalf("float %d is %v", i, v)
		}
	}
	st := c.status()
	if len(st.Shares) != 1 || st.Shares[0].Launches != n || st.Shares[0].Slices < 2 || st.Devices[0].Launches != n {
		t.Fatalf("after a batch of %d launches: devices %+v, shares %+v; want every launch counted, in several slices", n, st.Devices, st.Shares)
	}
}
