package accelerator

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// TestNodeDirectWrite: writes to an idle connection land, whole chunks and
// scattered ones; a write whose prefix is refused gets a typed error, its
// payload is skipped, and the connection stays in step.
func TestNodeDirectWrite(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 2)
	o := tn.connect(t, "rival")
	theirs := o.alloc(0, 1)[0]

	chunk := pattern(1, wire.MaxChunk)
	across := []api.Extent{ext(f[0], FrameSize-wire.MaxChunk/2, wire.MaxChunk/2), ext(f[1], 0, wire.MaxChunk/2)}
	c.mustWrite(0, across, chunk)
	if got := c.mustRead(0, across...); !bytes.Equal(got, chunk) {
		t.Fatal("a chunk written across two frames reads back otherwise")
	}
	scattered := []api.Extent{ext(f[1], 5000, 300), ext(f[0], 7, 0), ext(f[0], 20, 50)}
	c.mustWrite(0, scattered, pattern(2, 350))
	if got := c.mustRead(0, scattered...); !bytes.Equal(got, pattern(2, 350)) {
		t.Fatal("scattered write reads back otherwise")
	}
	c.mustWrite(0, nil, nil) // nothing to write is fine

	mine := []api.Extent{ext(f[1], 64, 16)}
	raw := func(b ...[]byte) func() error {
		return func() error { _, err := c.rpc.Call(api.OpNodeWrite, nil, bytes.Join(b, nil)); return err }
	}
	prefix := func(dev, count uint32, xs ...api.Extent) []byte {
		var e wire.Encoder
		e.U32(dev)
		e.U32(count)
		for _, x := range xs {
			e.U64(x.Addr)
			e.U64(x.Len)
		}
		e.U8(0)
		return e.B
	}
	for _, tc := range []badCase{
		{"shorter than a count", raw([]byte{0, 0, 0}), api.ErrProtocol, []string{"node-write"}},
		{"count over the limit", raw(prefix(0, wire.MaxList+1), make([]byte, 100)), api.ErrProtocol, []string{"node-write", strconv.Itoa(wire.MaxList + 1)}},
		{"extents past the body", raw(prefix(0, 3, mine...), make([]byte, 20)), api.ErrProtocol, []string{"node-write", "3 extents"}},
		{"no value byte", raw(prefix(0, 1, mine...)[:24]), api.ErrProtocol, []string{"node-write"}},
		{"unknown device", raw(prefix(7, 1, mine...), chunk[:16]), api.ErrInvalidArgument, []string{"device 7"}},
		{"other's frame, a chunk", raw(prefix(0, 1, ext(theirs, 0, wire.MaxChunk)), chunk), api.ErrPermissionDenied, []string{hex(theirs)}},
		{"outside memory", raw(prefix(0, 1, ext(testMemory, 0, 16)), chunk[:16]), api.ErrInvalidAddress, []string{hex(testMemory)}},
		{"payload longer, a chunk", raw(prefix(0, 1, mine...), chunk), api.ErrInvalidArgument, []string{strconv.Itoa(wire.MaxChunk) + " bytes", "16"}},
		{"payload shorter", raw(prefix(0, 1, ext(f[0], 0, wire.MaxChunk)), chunk[:100]), api.ErrInvalidArgument, []string{"100 bytes", strconv.Itoa(wire.MaxChunk)}},
	} {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.run(), tc.sentinel, tc.names...) })
		c.roundTrip(0, f[0])
		if got := c.mustRead(0, scattered...); !bytes.Equal(got, pattern(2, 350)) {
			t.Fatalf("after %q: earlier data changed", tc.name)
		}
	}
	if got := o.mustRead(0, ext(theirs, 0, 4096)); !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("a refused write changed another connection's frame")
	}

	// Pipelined: a refused write with a chunk of payload, then a good one,
	// then a read, all sent before any answer.
	bad := c.rpc.Go(api.OpNodeWrite, nil, prefix(0, 1, ext(theirs, 0, wire.MaxChunk)), chunk)
	good := c.rpc.Go(api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Extents: mine, Payload: chunk[100:116]}))
	into := make([]byte, 16)
	rd := c.rpc.Go(api.OpNodeRead, into, api.Encode(&api.NodeAccess{Extents: mine}))
	if err := bad.Wait(); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("pipelined write to another's frame: %v", err)
	}
	if err := errors.Join(good.Wait(), rd.Wait()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(into, chunk[100:116]) {
		t.Fatalf("read after a refused write saw %x", into)
	}
}

// TestNodeDirectWriteCutShort: a payload that stops part way is a broken
// connection: it is dropped and its frames freed; others go on.
func TestNodeDirectWriteCutShort(t *testing.T) {
	tn := startNode(t)
	other := tn.connect(t, "bystander")
	keep := other.alloc(1, 1)[0]
	c := tn.connect(t, "acme")
	f := c.alloc(0, 1)[0]
	body := api.Encode(&api.NodeAccess{Extents: []api.Extent{ext(f, 0, wire.MaxChunk)}, Payload: pattern(5, wire.MaxChunk)})
	nc := c.conn.NetConn()
	if _, err := nc.Write(append(rawHeader(uint32(len(body)), api.OpNodeWrite, 0, 100), body[:len(body)/2]...)); err != nil {
		t.Fatal(err)
	}
	nc.(*net.TCPConn).CloseWrite()
	select {
	case <-c.rpc.Closed():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not dropped")
	}
	tn.waitUsed(t, [testDevices]uint64{0, FrameSize})
	other.roundTrip(1, keep)
}

// TestNodeWriteBehindLaunch: a write that arrives while a launch of its
// connection is queued or running waits for it (it is buffered, not written
// straight away), so the order of requests holds.
func TestNodeWriteBehindLaunch(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	const frames = 8
	f := c.alloc(0, frames)
	all := ext(f[0], 0, frames*FrameSize)
	const n = wire.MaxChunk / 2
	p := pattern(9, n)
	x := []api.Extent{ext(f[frames-1], 0, n)}
	for round := range 3 {
		fill := c.rpc.Go(api.OpNodeLaunch, nil, api.Encode(&api.NodeLaunch{Kernel: "fill_f32", Args: []api.NodeArg{
			bufArg(all), i64Arg(frames * FrameSize / 4), f32Arg(float32(round))}}))
		w := c.rpc.Go(api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Extents: x, Payload: p}))
		got := make([]byte, n+4)
		rd := c.rpc.Go(api.OpNodeRead, got, api.Encode(&api.NodeAccess{Extents: append(slices.Clone(x), ext(f[frames-1], n, 4))}))
		if err := errors.Join(fill.Wait(), w.Wait(), rd.Wait()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:n], p) {
			t.Fatalf("round %d: the launch before the write overwrote it", round)
		}
		if v := bytesF32(got[n:]); v[0] != float32(round) {
			t.Fatalf("round %d: the launch wrote %v past the write", round, v[0])
		}
	}
}

// FuzzWritePrefix: the reader of a write's prefix agrees with api.Decode of
// the whole body on every input: same fields, the payload's length, and
// refusals as protocol errors; it reads exactly the prefix.
func FuzzWritePrefix(f *testing.F) {
	f.Add(api.Encode(&api.NodeAccess{Device: 1, Extents: []api.Extent{{Addr: 4096, Len: 3}}, Payload: []byte("abc")}))
	f.Add(api.Encode(&api.NodeAccess{Extents: []api.Extent{{Addr: 1, Len: 2}, {Addr: 3, Len: 4}}}))
	f.Add([]byte{0, 0, 0, 0, 2, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0})
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		m, n, err := readWritePrefix(r, uint32(len(b)))
		var want api.NodeAccess
		werr := api.Decode(b, &want)
		switch {
		case (err == nil) != (werr == nil):
			t.Fatalf("readWritePrefix: %v; api.Decode: %v", err, werr)
		case err != nil:
			if !errors.Is(err, api.ErrProtocol) {
				t.Fatalf("refusal %v is not a protocol error", err)
			}
			return
		}
		if m.Device != want.Device || m.Value != want.Value || !slices.Equal(m.Extents, want.Extents) || n != len(want.Payload) {
			t.Fatalf("prefix %+v with %d payload bytes, want %+v with %d", m, n, want, len(want.Payload))
		}
		if r.Len() != n {
			t.Fatalf("read %d bytes of a %d-byte prefix", len(b)-r.Len(), len(b)-n)
		}
	})
}
