package mediator_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
)

// victim checks that an innocent tenant is served correctly.
func victim(t *testing.T, c *client.Client) {
	t.Helper()
	p, err := c.Malloc(0, 1<<20)
	if err != nil {
		t.Fatalf("victim malloc: %v", err)
	}
	data := randomBytes(7, 1<<20)
	got := make([]byte, len(data))
	st := c.Stream()
	st.CopyToDevice(p, data)
	st.CopyFromDevice(got, p)
	if err := st.Synchronize(); err != nil {
		t.Fatalf("victim: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("victim read back different bytes")
	}
	if err := c.Free(p); err != nil {
		t.Fatalf("victim free: %v", err)
	}
}

func TestBadRequestsFailAlone(t *testing.T) {
	s := start(t, 1, 1, 256<<20, 0)
	good := s.dial(t, "good", 1)
	bad := s.dial(t, "bad", 1)
	buf, err := bad.Malloc(0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	small, err := bad.Malloc(0, 64)
	if err != nil {
		t.Fatal(err)
	}
	freed, err := bad.Malloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Free(freed); err != nil {
		t.Fatal(err)
	}
	st := bad.Stream()
	sync := func() error { return st.Synchronize() }
	cases := []struct {
		name     string
		do       func() error
		sentinel error
		names    []string
	}{
		{"malloc zero", func() error { _, err := bad.Malloc(0, 0); return err }, api.ErrInvalidArgument, []string{"0"}},
		{"malloc absurd", func() error { _, err := bad.Malloc(0, 1<<62); return err }, api.ErrInvalidArgument, []string{"4611686018427387904"}},
		{"malloc beyond device", func() error { _, err := bad.Malloc(0, 300<<20); return err }, api.ErrOutOfMemory, nil},
		{"malloc bad device", func() error { _, err := bad.Malloc(3, 4096); return err }, api.ErrInvalidArgument, []string{"device 3"}},
		{"free unknown", func() error { return bad.Free(0x1234) }, api.ErrInvalidAddress, []string{"0x1234"}},
		{"double free", func() error { return bad.Free(freed) }, api.ErrInvalidAddress, []string{hex(freed)}},
		{"free interior", func() error { return bad.Free(buf.Add(8)) }, api.ErrInvalidAddress, []string{hex(buf.Add(8))}},
		{"copy past end", func() error { st.CopyToDevice(buf.Add(64<<10-2), make([]byte, 4)); return sync() }, api.ErrInvalidAddress, []string{hex(buf.Add(64<<10 - 2))}},
		{"copy from freed", func() error { st.CopyFromDevice(make([]byte, 4), freed); return sync() }, api.ErrInvalidAddress, []string{hex(freed)}},
		{"copy from null", func() error { st.CopyFromDevice(make([]byte, 4), 0); return sync() }, api.ErrInvalidAddress, []string{"0x0"}},
		{"device copy overrun", func() error { st.CopyDevice(small, buf, 4096); return sync() }, api.ErrInvalidAddress, []string{hex(small)}},
		{"memset zero", func() error { st.Memset(buf, 1, 0); return sync() }, api.ErrInvalidArgument, []string{"0 bytes"}},
		{"unknown kernel", func() error { st.Launch("nosuch", client.I64(1)); return sync() }, api.ErrUnknownKernel, []string{"nosuch"}},
		{"wrong argument count", func() error { st.Launch("saxpy", client.I64(1)); return sync() }, api.ErrInvalidArgument, []string{"saxpy", "4", "1"}},
		{"wrong argument type", func() error {
			st.Launch("saxpy", client.I64(1), client.F32(1), client.F32(2), client.Buf(buf))
			return sync()
		}, api.ErrInvalidArgument, []string{"saxpy", "argument 2", "f32", "buffer"}},
		{"forged buffer address", func() error {
			st.Launch("saxpy", client.I64(1), client.F32(1), client.Buf(0xdead0000), client.Buf(buf))
			return sync()
		}, api.ErrInvalidAddress, []string{"0xdead0000"}},
		{"sgemm larger than buffers", func() error {
			st.Launch("sgemm", client.I64(256), client.I64(256), client.I64(256), client.F32(1),
				client.Buf(buf), client.Buf(buf), client.F32(0), client.Buf(buf))
			return sync()
		}, api.ErrInvalidArgument, []string{"sgemm", "65536"}},
		{"saxpy n beyond buffer", func() error {
			st.Launch("saxpy", client.I64(1<<20), client.F32(1), client.Buf(buf), client.Buf(buf))
			return sync()
		}, api.ErrInvalidArgument, []string{"saxpy"}},
		{"embedding index out of range", func() error {
			st.CopyToDevice(small, client.Int32Bytes([]int32{0, 99}))
			st.Launch("embedding_bag_sum", client.Buf(buf), client.I64(4), client.I64(4), client.Buf(small), client.I64(2),
				client.Buf(small), client.I64(1), client.Buf(buf.Add(4096)))
			return sync()
		}, api.ErrInvalidArgument, []string{"99"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, tc.do(), tc.sentinel, tc.names...)
			victim(t, good)
			victim(t, bad) // the offender's session goes on too
		})
	}
}

func hex(p client.Ptr) string { return fmt.Sprintf("%#x", uint64(p)) }

// raw opens a connection and speaks frames by hand.
func raw(t *testing.T, s *system) *wire.Conn {
	t.Helper()
	nc, err := net.Dial("unix", s.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return wire.NewConn(nc)
}

// roundTrip sends one request and reads its reply; err is the decoded error
// reply, io.EOF if the mediator closed the connection.
func roundTrip(t *testing.T, c *wire.Conn, op wire.Op, body ...[]byte) ([]byte, error) {
	t.Helper()
	if err := c.WriteFrame(op, 0, 42, body...); err != nil {
		t.Fatal(err)
	}
	_ = c.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
	h, err := c.ReadHeader()
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return nil, io.EOF
		}
		t.Fatalf("read reply: %v", err)
	}
	b := make([]byte, h.Len)
	if err := c.ReadBody(b); err != nil {
		t.Fatal(err)
	}
	if h.ID != 42 || h.Flags&wire.FlagReply == 0 {
		t.Fatalf("reply header %+v", h)
	}
	if h.Flags&wire.FlagError != 0 {
		return nil, wire.DecodeError(b)
	}
	return b, nil
}

func hello(tenant string, version uint16) []byte {
	return api.Encode(&api.Hello{Magic: api.Magic, Version: version, Role: api.RoleTenant, Tenant: tenant})
}

// closed reports whether the peer has closed c.
func closed(c *wire.Conn) bool {
	_ = c.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.ReadHeader()
	return err != nil
}

func TestBadHandshakes(t *testing.T) {
	s := start(t, 1, 1, 64<<20, 0)
	good := s.dial(t, "good", 1)
	cases := []struct {
		name     string
		op       wire.Op
		body     []byte
		sentinel error
		names    []string
	}{
		{"wrong version", api.OpHello, hello("x", api.Version+7), api.ErrProtocol, []string{fmt.Sprint(api.Version + 7)}},
		{"not hello first", api.OpMalloc, api.Encode(&api.Malloc{Size: 4096}), api.ErrProtocol, []string{"malloc"}},
		{"bad magic", api.OpHello, api.Encode(&api.Hello{Magic: 1, Version: api.Version, Role: api.RoleTenant, Tenant: "x"}), api.ErrProtocol, []string{"0x1"}},
		{"truncated hello", api.OpHello, hello("x", api.Version)[:5], api.ErrProtocol, nil},
		{"bad tenant name", api.OpHello, hello("../etc", api.Version), api.ErrInvalidArgument, []string{"../etc"}},
		{"node role", api.OpHello, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator}), api.ErrPermissionDenied, nil},
		{"too many devices", api.OpHello, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleTenant, Tenant: "x", Devices: 1000}), api.ErrInvalidArgument, []string{"1000"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := raw(t, s)
			_, err := roundTrip(t, c, tc.op, tc.body)
			wantErr(t, err, tc.sentinel, tc.names...)
			if !closed(c) {
				t.Fatal("connection still open after a refused handshake")
			}
			victim(t, good)
		})
	}
}

func TestBadFrames(t *testing.T) {
	s := start(t, 1, 1, 64<<20, 0)
	good := s.dial(t, "good", 1)
	open := func(t *testing.T) *wire.Conn {
		c := raw(t, s)
		if _, err := roundTrip(t, c, api.OpHello, hello("rude", api.Version)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Run("unknown op answered, session goes on", func(t *testing.T) {
		c := open(t)
		_, err := roundTrip(t, c, wire.Op(999))
		wantErr(t, err, api.ErrProtocol, "op(999)")
		if _, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: 4096})); err != nil {
			t.Fatalf("malloc after unknown op: %v", err)
		}
		_, err = roundTrip(t, c, api.OpSynchronize, api.Encode(&api.StreamReq{Stream: 77}))
		wantErr(t, err, api.ErrInvalidArgument, "stream 77")
		_, err = roundTrip(t, c, api.OpStreamDestroy, api.Encode(&api.StreamReq{Stream: 0}))
		wantErr(t, err, api.ErrInvalidArgument, "default stream")
	})
	t.Run("malformed body answered, session goes on", func(t *testing.T) {
		c := open(t)
		_, err := roundTrip(t, c, api.OpMalloc, []byte{1, 2, 3})
		wantErr(t, err, api.ErrProtocol)
		_, err = roundTrip(t, c, api.OpFree, api.Encode(&api.Free{Addr: 1}), []byte{0})
		wantErr(t, err, api.ErrProtocol, "trailing")
		_, err = roundTrip(t, c, api.OpLaunch, api.Encode(&api.Launch{Kernel: "saxpy"})[:9])
		wantErr(t, err, api.ErrProtocol)
		if _, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: 4096})); err != nil {
			t.Fatalf("malloc after malformed bodies: %v", err)
		}
	})
	t.Run("oversized frame drops the connection", func(t *testing.T) {
		c := open(t)
		if _, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: 1 << 20})); err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, wire.HeaderSize)
		hdr[0], hdr[1], hdr[2], hdr[3] = 0xff, 0xff, 0xff, 0x7f
		if _, err := c.NetConn().Write(hdr); err != nil {
			t.Fatal(err)
		}
		if !closed(c) {
			t.Fatal("connection open after an oversized header")
		}
		s.waitIdleExcept(t, 1)
		victim(t, good)
	})
	t.Run("frame cut short releases the session", func(t *testing.T) {
		c := open(t)
		if _, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: 1 << 20})); err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, wire.HeaderSize)
		hdr[0], hdr[4] = 100, byte(api.OpMalloc)
		c.NetConn().Write(hdr)
		c.NetConn().Write([]byte{1, 2, 3})
		c.Close()
		s.waitIdleExcept(t, 1)
		victim(t, good)
	})
	t.Run("operator cannot allocate, tenant cannot see status", func(t *testing.T) {
		c := raw(t, s)
		if _, err := roundTrip(t, c, api.OpHello, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleOperator})); err != nil {
			t.Fatal(err)
		}
		_, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: 4096}))
		wantErr(t, err, api.ErrPermissionDenied, "malloc")
		tc := open(t)
		_, err = roundTrip(t, tc, api.OpStatus)
		wantErr(t, err, api.ErrPermissionDenied, "status")
	})
}
