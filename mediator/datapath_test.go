package mediator_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// socketBytes is what crossed the tenant's socket so far, both ways.
func socketBytes(t *testing.T, c *client.Client) uint64 {
	t.Helper()
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st.SocketIn + st.SocketOut
}

func TestHostMemoryCopiesBypassTheSocket(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := sys.dial(t, "acme", 1)
	const n = 8<<20 + 12345 // not a whole number of chunks
	src, err := c.HostAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := c.HostAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	copy(src, randomBytes(1, n))
	p, err := c.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	before := socketBytes(t, c)
	s := c.Stream()
	s.CopyToDevice(p, src)
	s.CopyFromDevice(dst, p)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("bytes copied through host memory came back different")
	}
	if d := socketBytes(t, c) - before; d > 4096 {
		t.Fatalf("%d bytes crossed the socket for two copies of %d bytes in shared memory", d, n)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.CopiedIn != n || st.CopiedOut != n || st.NetOut < n || st.NetIn < n {
		t.Fatalf("stats after copies of %d bytes each way: %+v", n, st)
	}
	if err := c.HostFree(src); err != nil {
		t.Fatal(err)
	}
	if err := c.HostFree(src); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("second HostFree: %v", err)
	}
}

func TestPageableCopiesAreStagedThroughSharedMemory(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := sys.dial(t, "acme", 1)
	const n = 21<<20 + 7 // more than the staging ring holds
	src := randomBytes(2, n)
	p, err := c.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	before := socketBytes(t, c)
	s := c.Stream()
	s.CopyToDevice(p, src)
	back := make([]byte, n)
	s.CopyFromDevice(back, p)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, back) {
		t.Fatal("staged copies came back different")
	}
	if d := socketBytes(t, c) - before; d > 64<<10 {
		t.Fatalf("%d bytes crossed the socket for staged copies of %d bytes", d, n)
	}
	// Small copies still travel inline, and in order with staged ones.
	small := []byte{1, 2, 3, 4, 5}
	s.CopyToDevice(p.Add(3), small)
	got := make([]byte, 8)
	s.CopyFromDevice(got, p)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if want := append(append([]byte(nil), src[:3]...), small...); !bytes.Equal(got, want) {
		t.Fatalf("small copies: got %v, want %v", got, want)
	}
}

// session is a tenant of a fresh system with one buffer of size bytes.
func session(t *testing.T, size uint64) (*client.Client, client.Ptr) {
	t.Helper()
	sys := start(t, 1, 1, 16<<20, 0)
	c := sys.dial(t, "acme", 1)
	p, err := c.Malloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func TestBatchedLaunchesOneRoundTrip(t *testing.T) {
	c, p := session(t, 4)
	s := c.Stream()
	before := socketBytes(t, c)
	const n = 5000
	for i := range n {
		s.Launch("fill_f32", client.Buf(p), client.I64(1), client.F32(float32(i)))
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	s.CopyFromDevice(got, p)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if v := client.BytesFloat32(got)[0]; v != n-1 {
		t.Fatalf("after %d launches: %g", n, v)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Launches != n {
		t.Fatalf("%d launches counted, %d made", st.Launches, n)
	}
	// A launch is about 50 bytes of batch; replies are 16 bytes per batch.
	if d := socketBytes(t, c) - before; d > n*60 {
		t.Fatalf("%d socket bytes for %d launches", d, n)
	}
}

func TestBatchReportsItsFirstFailingCommand(t *testing.T) {
	c, p := session(t, 64)
	s := c.Stream()
	s.Memset(p, 7, 64)
	s.Launch("no_such_kernel")
	s.Memset(p+1<<40, 1, 1) // bad address, after the first failure
	s.Memset(p, 9, 32)      // still runs
	err := s.Synchronize()
	wantErr(t, err, api.ErrUnknownKernel, "command 1", "no_such_kernel")
	got := make([]byte, 64)
	s.CopyFromDevice(got, p)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if got[0] != 9 || got[40] != 7 {
		t.Fatalf("commands around failing ones did not run: %v", got)
	}
}

func TestCaptureAndReplay(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	c := sys.dial(t, "acme", 1)
	const n = 1024
	host, err := c.HostAlloc(8 * n)
	if err != nil {
		t.Fatal(err)
	}
	in, out := host[:4*n], host[4*n:]
	x, err := c.Malloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	y, err := c.Malloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	s.CopyToDevice(x, in)
	s.Memset(y, 0, 4*n)
	s.Launch("saxpy", client.I64(n), client.F32(2), client.Buf(x), client.Buf(y))
	s.CopyFromDevice(out, y)
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	z, err := c.Malloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		// Batches between replays recycle their command lists; the
		// graph's, decoded the same way, must not be among them.
		for i := range 2 * 1024 {
			s.Launch("fill_f32", client.Buf(z), client.I64(n), client.F32(float32(i)))
		}
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = float32(i*round) + 0.5
		}
		copy(in, client.Float32Bytes(xs))
		s.Replay(g)
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		for i, v := range client.BytesFloat32(out) {
			if v != 2*xs[i] {
				t.Fatalf("round %d: y[%d] = %g, want %g", round, i, v, 2*xs[i])
			}
		}
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	s.Replay(g)
	wantErr(t, s.Synchronize(), api.ErrInvalidArgument, "graph")

	// Pageable memory is read at capture time by nobody: refused.
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	s.CopyToDevice(x, make([]byte, 4*n))
	_, err = s.EndCapture()
	wantErr(t, err, api.ErrInvalidArgument, "HostAlloc")
}

func TestSealedBuffersRefuseWrites(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	c := sys.dial(t, "acme", 1)
	w, err := c.MallocWith(0, 4<<20, client.AllocOptions{Hint: api.HintWeight})
	if err != nil {
		t.Fatal(err)
	}
	y, err := c.Malloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	s.Memset(w, 3, 4<<20)
	if err := c.Seal(w); err != nil {
		t.Fatal(err)
	}
	for name, write := range map[string]func(){
		"copy":   func() { s.CopyToDevice(w, []byte{1}) },
		"memset": func() { s.Memset(w.Add(5), 0, 1) },
		"device": func() { s.CopyDevice(w, y, 16) },
		"kernel": func() { s.Launch("fill_f32", client.Buf(w), client.I64(4), client.F32(1)) },
	} {
		write()
		if err := s.Synchronize(); !errors.Is(err, api.ErrPermissionDenied) || !strings.Contains(err.Error(), "sealed") {
			t.Errorf("%s into a sealed buffer: %v", name, err)
		}
	}
	// Reads go on, and the contents are intact.
	s.CopyDevice(y, w, 4096)
	got := make([]byte, 4096)
	s.CopyFromDevice(got, y)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{3}, 4096)) {
		t.Fatal("sealed contents changed")
	}
	wantErr(t, c.Seal(w.Add(4096)), api.ErrInvalidAddress)
}

func TestAllocationOptions(t *testing.T) {
	sys := start(t, 1, 2, 16<<20, 0)
	c := sys.dial(t, "acme", 2)
	_, err := c.MallocWith(0, 4096, client.AllocOptions{Hint: api.Hint(9)})
	wantErr(t, err, api.ErrInvalidArgument, "hint(9)")

	// A KV cache placed near a buffer on device 1 can be used with it.
	w, err := c.Malloc(1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := c.MallocWith(0, 4096, client.AllocOptions{Hint: api.HintKVCache, Near: w})
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	s.Launch("saxpy", client.I64(8), client.F32(1), client.Buf(w), client.Buf(kv))
	if err := s.Synchronize(); err != nil {
		t.Fatalf("kv cache placed near device 1: %v", err)
	}
	_, err = c.MallocWith(0, 4096, client.AllocOptions{Near: client.Ptr(0x1234)})
	wantErr(t, err, api.ErrInvalidAddress)

	// An activation freed with its stream.
	st, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.MallocWith(0, 1<<20, client.AllocOptions{Hint: api.HintActivation, FreeWith: st})
	if err != nil {
		t.Fatal(err)
	}
	st.Memset(a, 1, 1<<20)
	if err := st.Destroy(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, c.Free(a), api.ErrInvalidAddress)
	_, err = c.MallocWith(0, 4096, client.AllocOptions{FreeWith: c.Stream()})
	wantErr(t, err, api.ErrInvalidArgument, "default stream")
}

// rawTenant is a tenant connection without the SDK, for requests the SDK
// never sends.
func rawTenant(t *testing.T, sys *system) *wire.RPC {
	t.Helper()
	nc, err := net.Dial("unix", sys.socket)
	if err != nil {
		t.Fatal(err)
	}
	r := wire.NewRPC(wire.NewConn(nc), "mediator")
	t.Cleanup(func() { r.Close() })
	if _, err := r.Call(api.OpHello, nil, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleTenant, Tenant: "acme"})); err != nil {
		t.Fatal(err)
	}
	return r
}

// sparseMemfd is a memfd of size bytes with no memory behind them: all of
// it is a hole.
func sparseMemfd(t *testing.T, size int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	return fd
}

// memfd is a memfd of size bytes, each page written (as client.HostAlloc
// does), with seals added.
func memfd(t *testing.T, size int, seals int) int {
	t.Helper()
	fd := sparseMemfd(t, size)
	if _, err := unix.Pwrite(fd, make([]byte, size), 0); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

func TestHostRegistrationRefusesUnsafeMemory(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	r := rawTenant(t, sys)
	reg := func(fd int, size uint64) error {
		_, err := r.CallFD(api.OpHostRegister, fd, api.Encode(&api.HostRegister{Size: size}))
		return err
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	wantErr(t, reg(int(f.Fd()), 1<<20), api.ErrInvalidArgument, "memfd")
	wantErr(t, reg(memfd(t, 4096, unix.F_SEAL_SEAL), 4096), api.ErrInvalidArgument, "shrinking")
	wantErr(t, reg(memfd(t, 4096, unix.F_SEAL_FUTURE_WRITE), 4096), api.ErrInvalidArgument, "sealed against writing")
	wantErr(t, reg(memfd(t, 4096, 0), 8192), api.ErrInvalidArgument, "holds 4096")
	wantErr(t, reg(memfd(t, 4096, 0), 0), api.ErrInvalidArgument)

	// An unsealed memfd is sealed by the mediator: the tenant can no
	// longer shrink it under the mediator's mapping.
	fd := memfd(t, 1<<20, 0)
	if err := reg(fd, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, 4096); !errors.Is(err, unix.EPERM) {
		t.Fatalf("shrinking a registered memfd: %v", err)
	}
	// Copies must stay inside their region.
	body, err := r.Call(api.OpMalloc, nil, api.Encode(&api.Malloc{Size: 1 << 20}))
	if err != nil {
		t.Fatal(err)
	}
	var m api.MallocReply
	if err := api.Decode(body, &m); err != nil {
		t.Fatal(err)
	}
	for _, c := range []api.CopyHost{
		{Addr: m.Addr, Region: 1, Off: 1 << 20, Len: 1},
		{Addr: m.Addr, Region: 1, Off: 1<<64 - 1, Len: 2},
		{Addr: m.Addr, Region: 1, Off: 0, Len: 0},
		{Addr: m.Addr, Region: 7, Off: 0, Len: 1},
	} {
		_, err := r.Call(api.OpCopyToDeviceHost, nil, api.Encode(&c))
		wantErr(t, err, api.ErrInvalidArgument)
	}
	ok := api.CopyHost{Addr: m.Addr, Region: 1, Len: 1 << 20}
	if _, err := r.Call(api.OpCopyFromDeviceHost, nil, api.Encode(&ok)); err != nil {
		t.Fatal(err)
	}
	// A register request without a descriptor breaks the protocol.
	_, err = r.Call(api.OpHostRegister, nil, api.Encode(&api.HostRegister{Size: 4096}))
	wantErr(t, err, api.ErrProtocol, "file descriptor")
}

func TestBatchesRefuseWhatCannotBeBatched(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	r := rawTenant(t, sys)
	batch := func(stream uint32, cmds ...api.Cmd) error {
		_, err := r.Call(api.OpBatch, nil, api.Encode(&api.Batch{Stream: stream, Cmds: cmds}))
		return err
	}
	memset := api.Encode(&api.Memset{Dst: 1, Len: 1})
	wantErr(t, batch(0, api.Cmd{Op: api.OpCopyFromDevice, Body: api.Encode(&api.CopyFromDevice{Len: 4})}), api.ErrInvalidArgument, "may not be batched")
	wantErr(t, batch(0, api.Cmd{Op: api.OpMalloc, Body: api.Encode(&api.Malloc{Size: 4})}), api.ErrInvalidArgument, "may not be batched")
	wantErr(t, batch(3, api.Cmd{Op: api.OpMemset, Body: memset}), api.ErrInvalidArgument, "stream 0 in a batch of stream 3")
	wantErr(t, batch(0, api.Cmd{Op: api.OpMemset, Body: memset[:5]}), api.ErrProtocol)
	if err := batch(0); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
	// Graphs do not nest.
	body, err := r.Call(api.OpGraphCreate, nil, api.Encode(&api.Batch{}))
	if err != nil {
		t.Fatal(err)
	}
	var g api.Graph
	if err := api.Decode(body, &g); err != nil {
		t.Fatal(err)
	}
	_, err = r.Call(api.OpGraphCreate, nil, api.Encode(&api.Batch{Cmds: []api.Cmd{{Op: api.OpGraphLaunch, Body: api.Encode(&api.GraphLaunch{Graph: g.Graph})}}}))
	wantErr(t, err, api.ErrInvalidArgument, "do not nest")
}

// upload copies data into a new weight buffer of c from shared memory and
// returns it and the bytes the session sent to the node meanwhile.
func upload(t testing.TB, c *client.Client, data []byte) (client.Ptr, uint64) {
	t.Helper()
	host, err := c.HostAlloc(len(data))
	if err != nil {
		t.Fatal(err)
	}
	copy(host, data)
	w, err := c.MallocWith(0, uint64(len(data)), client.AllocOptions{Hint: api.HintWeight})
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	s.CopyToDevice(w, host)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	after, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(data))
	s.CopyFromDevice(back, w)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, data) {
		t.Fatal("uploaded weights read back different")
	}
	if err := c.HostFree(host); err != nil {
		t.Fatal(err)
	}
	return w, after.NetOut - before.NetOut
}

func TestSealedWeightsAreNotSentTwice(t *testing.T) {
	for _, dedup := range []bool{true, false} {
		sys := startWith(t, 64<<20, func(c *mediator.Config) { c.NoDedup = !dedup })
		// A freed sealed copy left on the node: TestRetainedWeightsOutliveTheirSession.
		sys.nodes[0].SetRetention(false)
		const n = 8<<20 + 4096 // four whole pieces and a tail
		weights := randomBytes(7, n)
		a := sys.dial(t, "alpha", 1)
		wa, sentA := upload(t, a, weights)
		if sentA < n {
			t.Fatalf("first upload sent %d bytes of %d", sentA, n)
		}
		if err := a.Seal(wa); err != nil {
			t.Fatal(err)
		}
		b := sys.dial(t, "beta", 1)
		_, sentB := upload(t, b, weights)
		st, err := b.Stats()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case dedup && (st.DedupHits != 4 || sentB > 1<<20):
			t.Fatalf("second upload of sealed weights: %d hits, %d bytes sent", st.DedupHits, sentB)
		case !dedup && (st.DedupHits != 0 || sentB < n):
			t.Fatalf("with dedup off: %d hits, %d bytes sent", st.DedupHits, sentB)
		}
		// Other contents are sent; once the owner frees its sealed copy,
		// nothing is left to share.
		_, sent := upload(t, b, randomBytes(8, n))
		if sent < n {
			t.Fatalf("different weights sent %d bytes of %d", sent, n)
		}
		if err := a.Free(wa); err != nil {
			t.Fatal(err)
		}
		_, sent = upload(t, b, weights)
		if sent < n {
			t.Fatalf("after the sealed copy was freed, %d bytes sent of %d", sent, n)
		}
	}
}

// A tenant that restarts and loads the weights it sealed before is not sent
// them again while the node retains them; on a node that retains nothing,
// it is.
func TestRetainedWeightsOutliveTheirSession(t *testing.T) {
	for _, retain := range []bool{true, false} {
		sys := startWith(t, 64<<20, nil)
		node := sys.nodes[0]
		node.SetRetention(retain)
		const n = 8<<20 + 4096 // four whole pieces and a tail
		weights := randomBytes(9, n)
		a := sys.dial(t, "alpha", 1)
		wa, _ := upload(t, a, weights)
		if err := a.Seal(wa); err != nil {
			t.Fatal(err)
		}
		a.Close()
		sys.waitIdle(t)
		if st := node.ContentStats(); retain && st.Retained != 4 || !retain && st.Sealed != 0 {
			t.Fatalf("retain %v: content after the session ended: %+v", retain, st)
		}
		again := sys.dial(t, "alpha", 1)
		w, sent := upload(t, again, weights)
		st, err := again.Stats()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case retain && (st.DedupHits != 4 || sent > 1<<20):
			t.Fatalf("reload after a restart: %d hits, %d bytes sent", st.DedupHits, sent)
		case !retain && (st.DedupHits != 0 || sent < n):
			t.Fatalf("reload with retention off: %d hits, %d bytes sent", st.DedupHits, sent)
		}
		got := make([]byte, n)
		again.Stream().CopyFromDevice(got, w)
		if err := again.Stream().Synchronize(); err != nil || !bytes.Equal(got, weights) {
			t.Fatalf("retain %v: the reloaded weights read back otherwise (%v)", retain, err)
		}
	}
}

// A copy into host memory and a copy out of the same memory, queued one
// after the other, happen in that order, though the first lands only when
// its reply arrives.
func TestHostMemoryCopiesKeepStreamOrder(t *testing.T) {
	c, a := session(t, 4<<20)
	b, err := c.Malloc(0, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.HostAlloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(11, 4<<20)
	s := c.Stream()
	s.CopyToDevice(a, data)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		clear(h)
		s.CopyFromDevice(h, a) // lands in h later
		s.CopyToDevice(b, h)   // must read what landed
		got := make([]byte, 4<<20)
		s.CopyFromDevice(got, b)
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("round %d: a copy out of host memory overtook the copy into it", round)
		}
	}
}

// A session's graphs hold at most MaxGraphCommands commands together (a
// decoded command costs the mediator far more than its bytes on the wire):
// one more is refused with quota-exceeded naming the bound, and destroying
// a graph makes room.
func TestGraphCommandsAreBounded(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	c := sys.dial(t, "acme", 1)
	x, err := c.Malloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	capture := func(n int) (*client.Graph, error) {
		t.Helper()
		if err := s.BeginCapture(); err != nil {
			t.Fatal(err)
		}
		for range n {
			s.Memset(x, 1, 1)
		}
		return s.EndCapture()
	}
	big, err := capture(mediator.MaxGraphCommands - 1)
	if err != nil {
		t.Fatal(err)
	}
	small, err := capture(1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = capture(1)
	wantErr(t, err, api.ErrQuotaExceeded, strconv.Itoa(mediator.MaxGraphCommands))
	if err := big.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := capture(2); err != nil {
		t.Fatalf("after a graph was destroyed: %v", err)
	}
	s.Replay(small)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// A graph keeps no copy payloads: an inline copy (whose bytes a graph would
// keep for its life, a mebibyte each) is refused, naming it and what to use
// instead; copies from host memory are kept.
func TestGraphsRefuseInlineCopies(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	r := rawTenant(t, sys)
	body, err := r.Call(api.OpMalloc, nil, api.Encode(&api.Malloc{Size: 1 << 20}))
	if err != nil {
		t.Fatal(err)
	}
	var m api.MallocReply
	if err := api.Decode(body, &m); err != nil {
		t.Fatal(err)
	}
	create := func(cmds ...api.Cmd) error {
		_, err := r.Call(api.OpGraphCreate, nil, api.Encode(&api.Batch{Cmds: cmds}))
		return err
	}
	memset := api.Cmd{Op: api.OpMemset, Body: api.Encode(&api.Memset{Dst: m.Addr, Len: 1})}
	inline := api.Cmd{Op: api.OpCopyToDevice, Body: api.Encode(&api.CopyToDevice{Dst: m.Addr, Payload: make([]byte, wire.MaxChunk)})}
	wantErr(t, create(memset, inline), api.ErrInvalidArgument, "command 1", "copy-to-device", "host memory")
	if err := create(memset); err != nil {
		t.Fatalf("a graph without copies: %v", err)
	}
}

// A graph's launches are checked against the catalog when it is created,
// so a graph keeps no argument lists or kernel names longer than the
// catalog's: an unknown kernel, or a launch with the wrong number of
// arguments, is refused then, naming it.
func TestGraphsCheckLaunchesWhenCreated(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	r := rawTenant(t, sys)
	create := func(l api.Launch) error {
		_, err := r.Call(api.OpGraphCreate, nil, api.Encode(&api.Batch{Cmds: []api.Cmd{{Op: api.OpLaunch, Body: api.Encode(&l)}}}))
		return err
	}
	wantErr(t, create(api.Launch{Kernel: strings.Repeat("k", wire.MaxString)}), api.ErrUnknownKernel, "kkkk")
	many := make([]api.Arg, 1<<16)
	for i := range many {
		many[i] = api.Arg{Kind: api.ArgI64}
	}
	wantErr(t, create(api.Launch{Kernel: "fill_f32", Args: many}), api.ErrInvalidArgument, "fill_f32", "65536", "takes 3")
	if err := create(api.Launch{Kernel: "fill_f32", Args: []api.Arg{{Kind: api.ArgBuffer, Bits: 1 << 32}, {Kind: api.ArgI64, Bits: 4}, {Kind: api.ArgF32}}}); err != nil {
		t.Fatalf("a graph of a good launch: %v", err)
	}
}
