package accelerator

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator/sim"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

func TestNodeHappyPath(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")

	if c.hello.Version != api.Version || c.hello.Session == 0 || len(c.hello.Devices) != testDevices {
		t.Fatalf("hello reply %+v", c.hello)
	}
	for i, d := range c.hello.Devices {
		if d.Index != uint32(i) || d.Name != fmt.Sprintf("sim%d", i) || d.Memory != testMemory {
			t.Errorf("device %d in hello: %+v", i, d)
		}
	}

	f := c.alloc(0, 3)
	for i := range f {
		if f[i] != f[0]+uint64(i)*FrameSize {
			t.Fatalf("fresh node granted scattered frames %#x", f)
		}
	}

	// Write and read across a frame boundary and over scattered extents.
	across := []api.Extent{ext(f[0], FrameSize-100, 200)}
	c.mustWrite(0, across, pattern(1, 200))
	if got := c.mustRead(0, across...); !bytes.Equal(got, pattern(1, 200)) {
		t.Fatalf("read across frames = %x", got[:16])
	}
	scattered := []api.Extent{ext(f[2], 5000, 300), ext(f[0], 7, 0), ext(f[0], 20, 50)}
	c.mustWrite(0, scattered, pattern(2, 350))
	if got := c.mustRead(0, scattered...); !bytes.Equal(got, pattern(2, 350)) {
		t.Fatal("scattered read differs from scattered write")
	}
	if got := c.mustRead(0, ext(f[0], 20, 50), ext(f[2], 5000, 300)); !bytes.Equal(got, append(pattern(2, 350)[300:], pattern(2, 350)[:300]...)) {
		t.Fatal("extents read in another order differ")
	}

	// Fill.
	if err := c.fill(0, 0xab, ext(f[1], 1010, 20), ext(f[1], 1100, 4)); err != nil {
		t.Fatal(err)
	}
	got := c.mustRead(0, ext(f[1], 1009, 96))
	if got[0] != 0 || !bytes.Equal(got[1:21], bytes.Repeat([]byte{0xab}, 20)) || got[21] != 0 || !bytes.Equal(got[91:95], []byte{0xab, 0xab, 0xab, 0xab}) {
		t.Fatalf("after fill: %x", got)
	}

	// Copy between frames, and an overlapping copy within one (memmove).
	if err := c.copy(0, []api.Extent{ext(f[2], 0, 200)}, across); err != nil {
		t.Fatal(err)
	}
	if got := c.mustRead(0, ext(f[2], 0, 200)); !bytes.Equal(got, pattern(1, 200)) {
		t.Fatal("copy between frames differs")
	}
	if err := c.copy(0, []api.Extent{ext(f[2], 8, 200)}, []api.Extent{ext(f[2], 0, 200)}); err != nil {
		t.Fatal(err)
	}
	if got := c.mustRead(0, ext(f[2], 8, 200)); !bytes.Equal(got, pattern(1, 200)) {
		t.Fatal("overlapping copy forward is not a memmove")
	}
	if err := c.copy(0, []api.Extent{ext(f[2], 0, 100), ext(f[2], 100, 100)}, []api.Extent{ext(f[2], 8, 200)}); err != nil {
		t.Fatal(err)
	}
	if got := c.mustRead(0, ext(f[2], 0, 200)); !bytes.Equal(got, pattern(1, 200)) {
		t.Fatal("overlapping copy back over two extents is not a memmove")
	}

	// fill_f32 on one extent.
	x := ext(f[1], 4096, 16)
	if err := c.launch(0, "fill_f32", bufArg(x), i64Arg(4), f32Arg(1.5)); err != nil {
		t.Fatal(err)
	}
	if got := bytesF32(c.mustRead(0, x)); fmt.Sprint(got) != "[1.5 1.5 1.5 1.5]" {
		t.Fatalf("fill_f32 wrote %v", got)
	}
	// saxpy with y over the end of frame 0 and the start of frame 2 (not
	// adjacent): gathered, computed, scattered back. Then again with x
	// gathered too.
	y := []api.Extent{ext(f[0], FrameSize-8, 8), ext(f[2], 0, 8)}
	c.mustWrite(0, []api.Extent{x}, f32Bytes(1, 2, 3, 4))
	c.mustWrite(0, y, f32Bytes(10, 20, 30, 40))
	if err := c.launch(0, "saxpy", i64Arg(4), f32Arg(2), bufArg(x), bufArg(y...)); err != nil {
		t.Fatal(err)
	}
	if got := bytesF32(c.mustRead(0, y...)); fmt.Sprint(got) != "[12 24 36 48]" {
		t.Fatalf("saxpy over split y: %v", got)
	}
	xs := []api.Extent{ext(f[2], 4096, 8), ext(f[0], 4096, 8)}
	c.mustWrite(0, xs, f32Bytes(-1, -2, -3, -4))
	if err := c.launch(0, "saxpy", i64Arg(4), f32Arg(1), bufArg(xs...), bufArg(y...)); err != nil {
		t.Fatal(err)
	}
	if got := bytesF32(c.mustRead(0, y...)); fmt.Sprint(got) != "[11 22 33 44]" {
		t.Fatalf("saxpy over split x and y: %v", got)
	}
	if got := bytesF32(c.mustRead(0, xs...)); fmt.Sprint(got) != "[-1 -2 -3 -4]" {
		t.Fatalf("saxpy changed its input x: %v", got)
	}
	// The bytes around the split buffer are untouched.
	if got := c.mustRead(0, ext(f[2], 8, 4)); !bytes.Equal(got, pattern(1, 200)[8:12]) {
		t.Fatalf("saxpy wrote past y: %x", got)
	}

	st := c.status()
	if st.Backend != "sim" || st.Connections != 1 || len(st.Devices) != testDevices {
		t.Fatalf("status %+v", st)
	}
	want := api.DeviceStatus{Index: 0, Name: "sim0", Memory: testMemory, Used: 3 * FrameSize, Frames: testFrames, Free: testFrames - 3, Launches: 3}
	if st.Devices[0] != want {
		t.Fatalf("device 0 status %+v, want %+v", st.Devices[0], want)
	}
	if d := st.Devices[1]; d.Used != 0 || d.Free != testFrames || d.Launches != 0 {
		t.Fatalf("device 1 status %+v, want unused", d)
	}

	body, err := c.call(api.OpKernels, nil)
	if err != nil {
		t.Fatal(err)
	}
	var kl api.KernelList
	if err := api.Decode(body, &kl); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, k := range kl.Kernels {
		names = append(names, k.Name)
		if len(k.Params) == 0 || k.Doc == "" {
			t.Errorf("kernel %s has no params or doc", k.Name)
		}
	}
	for _, n := range []string{"embedding_bag_sum", "fill_f32", "reduce_sum_f32", "saxpy", "sgemm"} {
		if !slices.Contains(names, n) {
			t.Errorf("catalog %v lacks %s", names, n)
		}
	}

	if err := c.free(0, f[2], f[0]); err != nil {
		t.Fatal(err)
	}
	if got := c.status().Devices[0]; got.Used != FrameSize || got.Free != testFrames-1 {
		t.Fatalf("after freeing two of three frames: %+v", got)
	}
	if err := c.free(0, f[1]); err != nil {
		t.Fatal(err)
	}
	tn.waitUsed(t, [testDevices]uint64{})
}

// TestNodeHandshake: a connection that does not open with a valid mediator
// Hello gets a typed error reply and is closed; the node serves others.
func TestNodeHandshake(t *testing.T) {
	tn := startNode(t)
	other := tn.connect(t, "bystander")
	frame := other.alloc(1, 1)[0]
	hello := func(mod func(h *api.Hello)) []byte {
		h := mediatorHello("acme")
		mod(h)
		return api.Encode(h)
	}
	for _, tc := range []struct {
		name     string
		op       wire.Op
		body     []byte
		sentinel error
		names    []string
	}{
		{"wrong version", api.OpHello, hello(func(h *api.Hello) { h.Version = api.Version + 1 }), api.ErrProtocol, []string{"version " + strconv.Itoa(api.Version+1)}},
		{"bad magic", api.OpHello, hello(func(h *api.Hello) { h.Magic = 0xdeadbeef }), api.ErrProtocol, []string{"0xdeadbeef"}},
		{"tenant role", api.OpHello, hello(func(h *api.Hello) { h.Role = api.RoleTenant }), api.ErrPermissionDenied, []string{"role 1"}},
		{"operator role", api.OpHello, hello(func(h *api.Hello) { h.Role = api.RoleOperator }), api.ErrPermissionDenied, []string{"role 2"}},
		{"unknown role", api.OpHello, hello(func(h *api.Hello) { h.Role = 77 }), api.ErrPermissionDenied, []string{"role 77"}},
		{"first request not hello", api.OpNodeAlloc, api.Encode(&api.NodeAlloc{Count: 1}), api.ErrProtocol, []string{"node-alloc"}},
		{"status before hello", api.OpNodeStatus, nil, api.ErrProtocol, []string{"node-status"}},
		{"truncated hello", api.OpHello, hello(func(*api.Hello) {})[:5], api.ErrProtocol, []string{"hello"}},
		// Whole, with its optional Resume field, so the byte after it is
		// trailing rather than the start of that field.
		{"hello with trailing bytes", api.OpHello, append(hello(func(h *api.Hello) { h.Resumable = true }), 1), api.ErrProtocol, []string{"trailing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := tn.dialRaw(t)
			if err := conn.WriteFrame(tc.op, 0, 1, tc.body); err != nil {
				t.Fatal(err)
			}
			wantErr(t, wantClosed(t, conn), tc.sentinel, tc.names...)
		})
	}
	t.Run("oversized header", func(t *testing.T) {
		conn := tn.dialRaw(t)
		if _, err := conn.NetConn().Write(rawHeader(wire.MaxBody+1, api.OpHello, 0, 1)); err != nil {
			t.Fatal(err)
		}
		if err := wantClosed(t, conn); err != nil {
			t.Fatalf("a frame that cannot be read got a reply: %v", err)
		}
	})
	t.Run("silent", func(t *testing.T) {
		// A peer that connects and leaves before saying anything.
		tn.dialRaw(t).Close()
	})
	other.roundTrip(1, frame)
	tn.waitConnections(t, 1)
}

func rawHeader(n uint32, op wire.Op, flags uint16, id uint64) []byte {
	var e wire.Encoder
	e.U32(n)
	e.U16(uint16(op))
	e.U16(flags)
	e.U64(id)
	return e.B
}

func (tn *testNode) waitConnections(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for tn.node.Status().Connections != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections, want %d", tn.node.Status().Connections, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// badCase is a request the node must refuse with a typed error that names
// the offending value, leaving the connection usable.
type badCase struct {
	name     string
	run      func() error
	sentinel error
	names    []string
}

// accessCases issues every request that touches memory at xs (whose total
// length is small) on device dev; other is owned memory of the same length
// for the far side of a copy.
func accessCases(c *client, prefix string, dev uint32, xs, other []api.Extent, sentinel error, names ...string) []badCase {
	n := api.ExtentsLen(xs)
	ops := []struct {
		name string
		run  func() error
	}{
		{"write", func() error { return c.write(dev, xs, make([]byte, n)) }},
		{"read", func() error { _, err := c.read(dev, xs...); return err }},
		{"fill", func() error { return c.fill(dev, 0xee, xs...) }},
		{"copy to", func() error { return c.copy(dev, xs, other) }},
		{"copy from", func() error { return c.copy(dev, other, xs) }},
		{"launch", func() error { return c.launch(dev, "fill_f32", bufArg(xs...), i64Arg(int64(n/4)), f32Arg(9)) }},
	}
	out := make([]badCase, len(ops))
	for i, op := range ops {
		out[i] = badCase{prefix + " " + op.name, op.run, sentinel, names}
	}
	return out
}

// TestNodeBadRequests: every malformed or forbidden request on an
// established connection gets a typed error naming the offending value;
// the connection goes on working, nothing of another connection changes.
func TestNodeBadRequests(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	own := c.alloc(0, 2)
	o := tn.connect(t, "rival")
	theirs := o.alloc(0, 1)[0]
	secret := pattern(0x5e, 4096)
	o.mustWrite(0, []api.Extent{ext(theirs, 0, 4096)}, secret)
	usedBefore := tn.used()
	free := uint64(20 * FrameSize) // held by no one
	for _, f := range append(slices.Clone(own), theirs) {
		if f == free {
			t.Fatalf("frame %#x unexpectedly held", free)
		}
	}
	mine := []api.Extent{ext(own[1], 64, 16)}
	raw := func(op wire.Op, body []byte) func() error {
		return func() error { _, err := c.rpc.Call(op, nil, body); return err }
	}
	launch := func(kernel string, args ...api.NodeArg) func() error {
		return func() error { return c.launch(0, kernel, args...) }
	}
	cases := []badCase{
		{"unknown op", raw(99, []byte("x")), api.ErrProtocol, []string{"op(99)"}},
		{"tenant op", raw(api.OpMalloc, api.Encode(&api.Malloc{Size: 1})), api.ErrProtocol, []string{"malloc"}},
		{"second hello", raw(api.OpHello, api.Encode(mediatorHello("acme"))), api.ErrProtocol, []string{"hello"}},
		{"alloc truncated", raw(api.OpNodeAlloc, []byte{0, 0, 0}), api.ErrProtocol, []string{"node-alloc"}},
		{"alloc trailing", raw(api.OpNodeAlloc, append(api.Encode(&api.NodeAlloc{Count: 1}), 0)), api.ErrProtocol, []string{"node-alloc", "trailing"}},
		{"free truncated", raw(api.OpNodeFree, api.Encode(&api.NodeFrames{Frames: own})[:12]), api.ErrProtocol, []string{"node-free"}},
		{"write truncated", raw(api.OpNodeWrite, []byte{0, 0, 0, 0, 2, 0, 0, 0}), api.ErrProtocol, []string{"node-write"}},
		{"read empty", raw(api.OpNodeRead, nil), api.ErrProtocol, []string{"node-read"}},
		{"fill no value", raw(api.OpNodeFill, api.Encode(&api.NodeAccess{Extents: mine})[:20]), api.ErrProtocol, []string{"node-fill"}},
		{"copy no source", raw(api.OpNodeCopy, api.Encode(&api.NodeCopy{Dst: mine, Src: mine})[:24]), api.ErrProtocol, []string{"node-copy"}},
		{"launch huge name", raw(api.OpNodeLaunch, []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f}), api.ErrProtocol, []string{"node-launch"}},
		{"alloc none", func() error { _, err := c.tryAlloc(0, 0); return err }, api.ErrInvalidArgument, []string{"0 frames"}},
		{"alloc too many", func() error { _, err := c.tryAlloc(0, testFrames); return err }, api.ErrOutOfMemory, []string{"sim0", strconv.Itoa(testFrames) + " frames"}},
		{"alloc 2^32-1", func() error { _, err := c.tryAlloc(1, 1<<32-1); return err }, api.ErrOutOfMemory, []string{"sim1", "4294967295 frames"}},
		{"free other's frame", func() error { return c.free(0, theirs) }, api.ErrPermissionDenied, []string{hex(theirs)}},
		{"free free frame", func() error { return c.free(0, own[0], free) }, api.ErrPermissionDenied, []string{hex(free)}},
		{"free unaligned", func() error { return c.free(0, own[1], own[0]+4096) }, api.ErrInvalidAddress, []string{hex(own[0] + 4096)}},
		{"free beyond memory", func() error { return c.free(0, own[0], testMemory) }, api.ErrInvalidAddress, []string{hex(testMemory)}},
		{"free named twice", func() error { return c.free(0, own[0], own[1], own[0]) }, api.ErrInvalidArgument, []string{hex(own[0]) + " named twice"}},
		{"free on wrong device", func() error { return c.free(1, own[0]) }, api.ErrPermissionDenied, []string{"sim1", hex(own[0])}},
		{"write short payload", func() error { return c.write(0, mine, make([]byte, 8)) }, api.ErrInvalidArgument, []string{"8 bytes", "16"}},
		{"write long payload", func() error { return c.write(0, mine, make([]byte, 17)) }, api.ErrInvalidArgument, []string{"17 bytes", "16"}},
		{"read over chunk", func() error { _, err := c.read(0, ext(own[0], 0, wire.MaxChunk+1)); return err }, api.ErrInvalidArgument, []string{strconv.Itoa(wire.MaxChunk + 1)}},
		{"read over chunk in pieces", func() error {
			_, err := c.read(0, ext(own[0], 0, wire.MaxChunk), ext(own[1], 0, 1))
			return err
		}, api.ErrInvalidArgument, []string{strconv.Itoa(wire.MaxChunk + 1)}},
		{"read huge length", func() error { _, err := c.read(0, ext(own[0], 0, 1<<63)); return err }, api.ErrInvalidAddress, []string{hex(own[0])}},
		{"copy lengths differ", func() error { return c.copy(0, mine, []api.Extent{ext(own[0], 0, 15)}) }, api.ErrInvalidArgument, []string{"15", "16"}},
		{"unknown kernel", launch("nope", i64Arg(1)), api.ErrUnknownKernel, []string{`"nope"`}},
		{"wrong kind", launch("fill_f32", i64Arg(1), i64Arg(4), f32Arg(1)), api.ErrInvalidArgument, []string{"argument 0 (x)", "i64", "buffer"}},
		{"scalar kind swapped", launch("fill_f32", bufArg(mine...), f32Arg(4), i64Arg(1)), api.ErrInvalidArgument, []string{"argument 1 (n)"}},
		{"unknown kind", launch("fill_f32", bufArg(mine...), api.NodeArg{Kind: 9}, f32Arg(1)), api.ErrInvalidArgument, []string{"kind(9)"}},
		{"too few arguments", launch("fill_f32", bufArg(mine...)), api.ErrInvalidArgument, []string{"takes 3 arguments", "got 1"}},
		{"n past the buffer", launch("fill_f32", bufArg(mine...), i64Arg(5), f32Arg(1)), api.ErrInvalidArgument, []string{"fill_f32", "16 bytes"}},
		{"negative n", launch("fill_f32", bufArg(mine...), i64Arg(-1), f32Arg(1)), api.ErrInvalidArgument, []string{"n = -1"}},
		// Repeated extents adding up to 234 GiB: refused, not allocated.
		{"buffer bigger than the device", launch("fill_f32", bufArg(slices.Repeat([]api.Extent{ext(own[0], 0, 2*FrameSize)}, 60000)...), i64Arg(1), f32Arg(1)), api.ErrInvalidArgument, []string{"60000 extents", "bytes this connection holds"}},
		{"empty extent beyond memory", launch("fill_f32", bufArg(ext(testMemory+FrameSize, 0, 0), ext(own[0], 0, 4)), i64Arg(1), f32Arg(1)), api.ErrInvalidAddress, []string{hex(testMemory + FrameSize)}},
	}
	for _, dev := range []uint32{testDevices, 1 << 31} {
		name := strconv.FormatUint(uint64(dev), 10)
		d := dev
		cases = append(cases,
			badCase{"alloc on device " + name, func() error { _, err := c.tryAlloc(d, 1); return err }, api.ErrInvalidArgument, []string{"device " + name}},
			badCase{"free on device " + name, func() error { return c.free(d, own[0]) }, api.ErrInvalidArgument, []string{"device " + name}})
		cases = append(cases, accessCases(c, "device "+name+":", d, mine, mine, api.ErrInvalidArgument, "device "+name)...)
	}
	theirExt := []api.Extent{ext(own[0], FrameSize-8, 8), ext(theirs, 8, 8)}
	cases = append(cases, accessCases(c, "other's frame:", 0, theirExt, mine, api.ErrPermissionDenied, hex(theirs))...)
	cases = append(cases, accessCases(c, "free frame:", 0, []api.Extent{ext(free, 0, 16)}, mine, api.ErrPermissionDenied, hex(free))...)
	for _, x := range []api.Extent{{Addr: testMemory, Len: 16}, {Addr: testMemory - 8, Len: 16}, {Addr: 1<<64 - 8, Len: 16}} {
		cases = append(cases, accessCases(c, "outside "+hex(x.Addr)+":", 0, []api.Extent{x}, mine, api.ErrInvalidAddress, hex(x.Addr))...)
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.run(), tc.sentinel, tc.names...) })
		// The same connection still works and holds what it held.
		c.roundTrip(0, own[0])
		c.roundTrip(0, own[1])
		if u := tn.used(); u != usedBefore {
			t.Fatalf("after %q: used %v, want %v", tc.name, u, usedBefore)
		}
	}
	// Nothing of the other connection changed; it still works.
	if got := o.mustRead(0, ext(theirs, 0, 4096)); !bytes.Equal(got, secret) {
		t.Fatal("the other connection's frame changed")
	}
	o.roundTrip(0, theirs)
	if got := tn.node.Status().Devices[0].Launches; got != 0 {
		t.Fatalf("refused launches counted: %d", got)
	}
	// Frames still free after all-or-nothing frees.
	if err := c.free(0, own...); err != nil {
		t.Fatal(err)
	}
	tn.waitUsed(t, [testDevices]uint64{FrameSize})
}

// TestNodeDropsBrokenFraming: a frame that cannot be read in step ends the
// connection; its frames are scrubbed and freed, others go on.
func TestNodeDropsBrokenFraming(t *testing.T) {
	tn := startNode(t)
	other := tn.connect(t, "bystander")
	keep := other.alloc(1, 1)[0]
	for _, tc := range []struct {
		name  string
		bytes []byte
	}{
		{"oversized header", rawHeader(wire.MaxBody+1, api.OpNodeWrite, 0, 100)},
		{"maximal header", rawHeader(1<<32-1, api.OpNodeRead, 0, 100)},
		{"reply flag", append(rawHeader(2, api.OpNodeStatus, wire.FlagReply, 100), 0, 0)},
		{"body cut short", append(rawHeader(100, api.OpNodeWrite, 0, 100), make([]byte, 50)...)},
		{"header cut short", rawHeader(0, api.OpNodeStatus, 0, 100)[:9]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tn.connect(t, "acme")
			c.alloc(0, 4)
			c.alloc(1, 2)
			tn.waitUsed(t, [testDevices]uint64{4 * FrameSize, 3 * FrameSize})
			nc := c.conn.NetConn()
			if _, err := nc.Write(tc.bytes); err != nil {
				t.Fatal(err)
			}
			nc.(*net.TCPConn).CloseWrite()
			select {
			case <-c.rpc.Closed():
			case <-time.After(5 * time.Second):
				t.Fatal("connection not dropped")
			}
			tn.waitUsed(t, [testDevices]uint64{0, FrameSize})
			tn.waitConnections(t, 1)
		})
	}
	other.roundTrip(1, keep)
}

// TestNodeScrubsBetweenOwners: memory a connection wrote reads as zeros to
// the next owner, whether the first freed it or went away.
func TestNodeScrubsBetweenOwners(t *testing.T) {
	for _, leave := range []string{"free", "disconnect", "free scattered"} {
		t.Run(leave, func(t *testing.T) {
			tn := startNode(t)
			a := tn.connect(t, "alice")
			var frames []uint64
			if leave == "free scattered" {
				// Allocate every frame one at a time, so the free below
				// names frames out of order and scrubs many runs.
				for range testFrames {
					frames = append(frames, a.alloc(1, 1)[0])
				}
				slices.Reverse(frames)
			} else {
				frames = a.alloc(1, testFrames)
			}
			var all []api.Extent
			for _, f := range frames {
				all = append(all, ext(f, 0, FrameSize))
			}
			if err := a.fill(1, 0x5a, all...); err != nil {
				t.Fatal(err)
			}
			a.mustWrite(1, []api.Extent{ext(frames[3], 12345, 4096)}, pattern(0x77, 4096))
			if err := a.launch(1, "fill_f32", bufArg(ext(frames[7], 0, FrameSize)), i64Arg(FrameSize/4), f32Arg(3)); err != nil {
				t.Fatal(err)
			}
			switch leave {
			case "disconnect":
				a.rpc.Close()
			default:
				if err := a.free(1, frames...); err != nil {
					t.Fatal(err)
				}
			}
			tn.waitUsed(t, [testDevices]uint64{})
			b := tn.connect(t, "bob")
			got := b.alloc(1, testFrames)
			slices.Sort(got)
			slices.Sort(frames)
			if !slices.Equal(got, frames) {
				t.Fatalf("second owner got %#x, want every frame", got)
			}
			// Read all of the device back, pipelined, a chunk per request.
			zero := make([]byte, wire.MaxChunk)
			var calls []*wire.Call
			var bufs [][]byte
			for addr := uint64(0); addr < testMemory; addr += wire.MaxChunk {
				buf := make([]byte, wire.MaxChunk)
				bufs = append(bufs, buf)
				calls = append(calls, b.rpc.Go(api.OpNodeRead, buf,
					api.Encode(&api.NodeAccess{Device: 1, Extents: []api.Extent{{Addr: addr, Len: wire.MaxChunk}}})))
			}
			for i, call := range calls {
				if err := call.Wait(); err != nil {
					t.Fatalf("read chunk %d: %v", i, err)
				}
				if !bytes.Equal(bufs[i], zero) {
					t.Fatalf("chunk %d at %#x holds the previous owner's data", i, i*wire.MaxChunk)
				}
			}
		})
	}
}

// TestNodeDisconnectReleases: a connection that goes away, even with
// requests in flight, leaves no frame held on any device.
func TestNodeDisconnectReleases(t *testing.T) {
	tn := startNode(t)
	other := tn.connect(t, "bystander")
	keep := other.alloc(0, 1)[0]
	for round := range 3 {
		c := tn.connect(t, "acme")
		f0 := c.alloc(0, 5)
		c.alloc(1, 3)
		for range 4 {
			c.alloc(1, 1)
		}
		tn.waitUsed(t, [testDevices]uint64{6 * FrameSize, 7 * FrameSize})
		// Pipeline writes and close without waiting for them.
		p := pattern(byte(round), 64<<10)
		for i := range 16 {
			c.rpc.Go(api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Extents: []api.Extent{ext(f0[i%5], 0, uint64(len(p)))}, Payload: p}))
		}
		c.rpc.Close()
		tn.waitUsed(t, [testDevices]uint64{FrameSize, 0})
		tn.waitConnections(t, 1)
	}
	other.roundTrip(0, keep)
}

// TestNodeRequestOrder: pipelined requests of one connection execute in
// the order sent, so a read sees every write before it.
func TestNodeRequestOrder(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 1)[0]
	x := []api.Extent{ext(f, 0, 8)}
	var reads []*wire.Call
	var bufs [][]byte
	for i := range 50 {
		p := []byte(fmt.Sprintf("%08d", i))
		c.rpc.Go(api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Extents: x, Payload: p}))
		bufs = append(bufs, make([]byte, 8))
		reads = append(reads, c.rpc.Go(api.OpNodeRead, bufs[i], api.Encode(&api.NodeAccess{Extents: x})))
	}
	for i, r := range reads {
		if err := r.Wait(); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%08d", i); string(bufs[i]) != want {
			t.Fatalf("read %d saw %q, want %q", i, bufs[i], want)
		}
	}
}

// TestNodeConcurrentConnections: connections on both devices write, copy
// and read their own frames at once; each sees only its own data.
func TestNodeConcurrentConnections(t *testing.T) {
	tn := startNode(t)
	const conns, rounds = 6, 20
	clients := make([]*client, conns)
	frames := make([][]uint64, conns)
	for i := range clients {
		clients[i] = tn.connect(t, fmt.Sprintf("tenant-%d", i))
		frames[i] = clients[i].alloc(uint32(i%testDevices), 2)
	}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- exercise(c, uint32(i%testDevices), frames[i], byte(i), rounds)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		return
	}
	// Each still holds its last pattern.
	for i, c := range clients {
		want := pattern(byte(i)+rounds-1, 8192)
		if got := c.mustRead(uint32(i%testDevices), ext(frames[i][1], 0, 8192)); !bytes.Equal(got, want) {
			t.Errorf("connection %d: final data differs", i)
		}
	}
	per := uint64(conns / testDevices * 2 * FrameSize)
	tn.waitUsed(t, [testDevices]uint64{per, per})
	for _, c := range clients {
		c.rpc.Close()
	}
	tn.waitUsed(t, [testDevices]uint64{})
}

// exercise writes, copies and reads back patterns in frames (two, owned by
// c) for rounds rounds; it runs on its own goroutine and reports by error.
func exercise(c *client, dev uint32, frames []uint64, seed byte, rounds int) error {
	const n = 8192
	for r := range rounds {
		p := pattern(seed+byte(r), n)
		across := []api.Extent{ext(frames[0], FrameSize-n/2, n)} // may cross into a scattered frame
		if frames[1] != frames[0]+FrameSize {
			across = []api.Extent{ext(frames[0], FrameSize-n/2, n/2), ext(frames[1], FrameSize/2, n/2)}
		}
		w := c.rpc.Go(api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Device: dev, Extents: across, Payload: p}))
		cp := c.rpc.Go(api.OpNodeCopy, nil, api.Encode(&api.NodeCopy{Device: dev, Dst: []api.Extent{ext(frames[1], 0, n)}, Src: across}))
		into := make([]byte, n)
		rd := c.rpc.Go(api.OpNodeRead, into, api.Encode(&api.NodeAccess{Device: dev, Extents: []api.Extent{ext(frames[1], 0, n)}}))
		for _, call := range []*wire.Call{w, cp, rd} {
			if err := call.Wait(); err != nil {
				return fmt.Errorf("seed %d round %d: %v: %w", seed, r, call.Op, err)
			}
		}
		if !bytes.Equal(into, p) {
			return fmt.Errorf("seed %d round %d: read back other data", seed, r)
		}
	}
	return nil
}

func TestNodeNew(t *testing.T) {
	mk := func(index uint32, size uint64) Device {
		d, err := sim.New(index, size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	for _, tc := range []struct {
		name  string
		devs  []Device
		names string
	}{
		{"index out of order", []Device{mk(1, FrameSize)}, "index 1"},
		{"smaller than a frame", []Device{mk(0, FrameSize/2)}, strconv.Itoa(FrameSize / 2)},
		{"not a frame multiple", []Device{mk(0, FrameSize), mk(1, 3*FrameSize/2)}, strconv.Itoa(3 * FrameSize / 2)},
	} {
		_, err := New("sim", tc.devs, quietLog())
		wantLocalErr(t, err, api.ErrInvalidArgument, tc.names)
	}
	_, _, err := StartSim("127.0.0.1:0", 0, testMemory, quietLog())
	wantLocalErr(t, err, api.ErrInvalidArgument)
	_, _, err = StartSim("127.0.0.1:0", 1, FrameSize+1, quietLog())
	wantLocalErr(t, err, api.ErrInvalidArgument)
}

// TestNodeClose: Close ends every connection, frees every frame and stops
// accepting.
func TestNodeClose(t *testing.T) {
	n, addr, err := StartSim("127.0.0.1:0", 1, testMemory, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{node: n, addr: addr.String()}
	c := tn.connect(t, "acme")
	c.alloc(0, 3)
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-c.rpc.Closed():
	case <-time.After(5 * time.Second):
		t.Fatal("connection survived Close")
	}
	if st := n.Status(); st.Connections != 0 || st.Devices[0].Used != 0 {
		t.Fatalf("status after Close: %+v", st)
	}
	if nc, err := net.DialTimeout("tcp", tn.addr, time.Second); err == nil {
		nc.Close()
		t.Fatal("node still accepts after Close")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := n.Serve(l); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("Serve after Close: %v, want unavailable", err)
	}
}
