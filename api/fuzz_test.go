package api

import (
	"bytes"
	"errors"
	"net"
	"reflect"
	"testing"
	"time"
)

// Fuzz targets for every decoder of untrusted bytes. Seed corpora live in
// testdata/fuzz/<FuzzName>/; plain `go test` runs them, and
// `go test -run xxx -fuzz FuzzName ./api/` explores from them.

// samples holds a filled-in value of every message type, for seeds.
func samples() []Message {
	ext := []Extent{{Addr: 0x200000, Len: 4096}, {Addr: 0x600000, Len: 1 << 21}}
	return []Message{
		&Hello{Magic: Magic, Version: Version, Role: RoleTenant, Tenant: "acme", Devices: 2},
		&HelloReply{Version: Version, Session: 42, Devices: []DeviceInfo{
			{Index: 0, Name: "sim0", Node: "n1:7000", Memory: 16 << 30},
			{Index: 1, Name: "sim1", Node: "n2:7000", Memory: 8 << 30},
		}},
		&Malloc{Device: 1, Size: 64 << 20, Hint: HintWeight, Flags: MallocNear, Near: 0x7f0000000000},
		&MallocReply{Addr: 0x7f0000000000},
		&Free{Addr: 0x7f0000000000},
		&StreamReq{Stream: 3},
		&CopyToDevice{Stream: 1, Dst: 0x1000, Payload: []byte("some bytes")},
		&CopyFromDevice{Stream: 1, Src: 0x1000, Len: 10},
		&CopyDevice{Stream: 2, Dst: 0x2000, Src: 0x1000, Len: 10},
		&Memset{Stream: 0, Dst: 0x3000, Value: 0xff, Len: 1 << 20},
		&Launch{Stream: 1, Kernel: "saxpy", Args: []Arg{{ArgBuffer, 0x1000}, {ArgBuffer, 0x2000}, {ArgF32, 0x40000000}, {ArgI64, 1024}}},
		&KernelList{Kernels: []KernelInfo{
			{Name: "saxpy", Doc: "y = a*x + y", Params: []Param{
				{Name: "x", Kind: ArgBuffer, Access: AccessRead, Elem: 4, Dims: []string{"n"}},
				{Name: "y", Kind: ArgBuffer, Access: AccessReadWrite, Elem: 4, Dims: []string{"n"}},
				{Name: "a", Kind: ArgF32}, {Name: "n", Kind: ArgI64}}},
			{Name: "fill", Doc: "", Params: nil},
		}},
		&NodeAlloc{Device: 0, Count: 8},
		&NodeFrames{Device: 0, Frames: []uint64{0, 1 << 21, 2 << 21}},
		&NodeAccess{Device: 0, Extents: ext, Value: 7, Payload: []byte("payload")},
		&NodeCopy{Device: 0, Dst: ext, Src: ext[:1]},
		&NodeLaunch{Device: 0, Kernel: "saxpy", Args: []NodeArg{{Kind: ArgBuffer, Extents: ext}, {Kind: ArgF32, Bits: 0x40000000}, {Kind: ArgI64, Bits: 7}}},
		&HostRegister{Size: 64 << 20},
		&HostRegion{Region: 3},
		&CopyHost{Stream: 1, Addr: 0x1000, Region: 1, Off: 4096, Len: 1 << 20},
		&Batch{Stream: 2, Cmds: []Cmd{{Op: OpMemset, Body: Encode(&Memset{Stream: 2, Dst: 0x3000, Len: 8})}, {Op: OpLaunch, Body: []byte{1, 2}}}},
		&Seal{Addr: 0x7f0000000000},
		&Graph{Graph: 5},
		&GraphLaunch{Stream: 1, Graph: 5},
		&SessionStats{CopiedIn: 1, CopiedOut: 2, Launches: 3, NetOut: 4, NetIn: 5, DedupHits: 6, DedupBytes: 7, SocketIn: 8, SocketOut: 9, SharedHits: 10, SharedMisses: 11},
		&NodeDedup{Device: 0, Dst: ext[1:], Hashes: [][32]byte{{1, 2, 3}}},
		&NodeDedupReply{Hit: []bool{true, false}},
		&NodeSealReply{StoredOnce: []bool{false, true, true}},
		&Export{Addr: 0x1000, Mode: ModeCoherent, Grants: []Grant{{Tenant: "b", Write: true}, {Tenant: "c"}}},
		&Shared{Node: "10.0.0.1:7070", Object: 9},
		&ImportReply{Addr: 1 << 47, Size: 4096, Mode: ModeImmutable},
		&Revoke{Addr: 0x1000, Tenant: "c"},
		&NodeExport{Device: 1, Extents: ext, Mode: ModeVersioned, Grants: []Grant{{Tenant: "b"}}},
		&NodeObject{Object: 9},
		&NodeImportReply{Size: 4096, Mode: ModeCoherent, Write: true, PageSize: 65536, LeaseNs: 1e8},
		&NodeRevoke{Object: 9, Tenant: "b"},
		&NodeObjAccess{Object: 9, Version: 2, Off: 64, Len: 8, Payload: []byte("data")},
		&NodeGrant{Version: 3, LeaseNs: 1e8, Sealed: true},
		&BufVersion{Version: 2},
		&NodeVersion{Object: 9, Version: 2},
		&At{Addr: 1 << 47},
		&NodeInval{Object: 9, Page: 3, Version: 4},
	}
}

// FuzzDecode decodes arbitrary bytes as every message type. Decoding never
// panics, fails only with ErrProtocol, allocates no more list elements than
// there are input bytes, and what it accepts re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, m := range samples() {
		f.Add(Encode(m))
	}
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 0x40, 0x42, 0x0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) // 1e6 frames in 20 bytes
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, name := range messageNames() {
			m := messages[name].new()
			err := Decode(data, m)
			if n := listElems(reflect.ValueOf(m)); n > len(data) {
				t.Fatalf("%s: %d bytes decoded into %d list elements", name, len(data), n)
			}
			if err != nil {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("%s: %v, want ErrProtocol", name, err)
				}
				continue
			}
			if again := Encode(m); !bytes.Equal(again, data) {
				t.Fatalf("%s: accepted %x but re-encodes as %x", name, data, again)
			}
		}
	})
}

// FuzzDecodeError: an error reply body decodes to a RemoteError of a known
// code, or to a protocol error; a RemoteError of a real code re-encodes to
// the same bytes.
func FuzzDecodeError(f *testing.F) {
	enc := func(code Code, msg string) []byte {
		e := Encoder{}
		e.U16(uint16(code))
		e.String(msg)
		return e.B
	}
	f.Add(enc(CodeOutOfMemory, "node n1: no frames left"))
	f.Add(enc(CodeOK, "ok?"))
	f.Add(enc(999, "from the future"))
	f.Add(enc(CodeProtocol, "")[:3])
	f.Fuzz(func(t *testing.T, data []byte) {
		err := DecodeError(data)
		var re *RemoteError
		switch {
		case err == nil:
			t.Fatal("DecodeError returned nil")
		case errors.As(err, &re):
			if !re.Code.Known() {
				t.Fatalf("RemoteError with code %d", re.Code)
			}
			if !errors.Is(err, re.Code.Sentinel()) || CodeOf(err) != re.Code {
				t.Fatalf("RemoteError %v does not match its sentinel", re.Code)
			}
			if len(re.Msg) > MaxString+100 {
				t.Fatalf("message of %d bytes", len(re.Msg))
			}
			if re.Code != CodeProtocol {
				if again := enc(re.Code, re.Msg); !bytes.Equal(again, data) {
					t.Fatalf("accepted %x but re-encodes as %x", data, again)
				}
			}
		case !errors.Is(err, ErrProtocol):
			t.Fatalf("DecodeError: %v, want a RemoteError or ErrProtocol", err)
		}
	})
}

// FuzzFrameReader feeds arbitrary bytes to Conn.ReadHeader/ReadBody over a
// net.Pipe. The reader never panics, never accepts a body over MaxBody, and
// the frames it returns are exactly the bytes it read.
func FuzzFrameReader(f *testing.F) {
	two := append(rawHeader(3, OpMalloc, 0, 1), 'a', 'b', 'c')
	two = append(two, rawHeader(0, OpStatus, FlagReply, 2)...)
	f.Add(two)
	f.Add(rawHeader(MaxBody+1, OpNodeWrite, 0, 1))
	f.Add(append(rawHeader(100, OpNodeWrite, 0, 1), 1, 2, 3))
	f.Add(rawHeader(1, OpHello, 0, 1)[:10])
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.Write(data) // fails once the reader gives up and closes b
			a.Close()
		}()
		c := NewConn(b)
		var got []byte
		for {
			h, err := c.ReadHeader()
			if err != nil {
				if errors.Is(err, ErrProtocol) && h.Len <= MaxBody {
					t.Fatalf("header %+v refused: %v", h, err)
				}
				break
			}
			if h.Len > MaxBody {
				t.Fatalf("accepted a header of %d bytes", h.Len)
			}
			body := make([]byte, h.Len)
			if err := c.ReadBody(body); err != nil {
				break
			}
			got = append(got, rawHeader(h.Len, h.Op, h.Flags, h.ID)...)
			got = append(got, body...)
		}
		c.Close()
		<-done
		if !bytes.HasPrefix(data, got) {
			t.Fatalf("frames read do not match the input")
		}
		if tail := len(data) - len(got); tail >= HeaderSize {
			// What stopped the reader must have been a bad or cut frame.
			h := rawHeaderLen(data[len(got):])
			if h <= MaxBody && uint32(tail-HeaderSize) >= h {
				t.Fatalf("reader stopped before a complete frame of %d bytes", h)
			}
		}
	})
}

// rawHeaderLen returns the body length a raw header announces.
func rawHeaderLen(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// FuzzRPCReplies plays an arbitrary byte stream as the server's side of an
// RPC with n calls in flight. Every call completes, and every failure is
// typed: nothing a peer sends can produce an untyped error or a hang.
func FuzzRPCReplies(f *testing.F) {
	reply := func(n int, flags uint16, id uint64, body ...byte) []byte {
		return append(rawHeader(uint32(n), OpNodeRead, flags, id), body...)
	}
	var ok []byte
	ok = append(ok, reply(3, FlagReply, 2, 1, 2, 3)...)           // call 2 reads into 3 bytes
	ok = append(ok, reply(2, FlagReply, 1, 'h', 'i')...)          // call 1 takes a body
	ok = append(ok, reply(3, FlagReply|FlagError, 3, 1, 0, 0)...) // malformed error body
	f.Add(uint8(3), ok)
	errBody := append([]byte{byte(CodeOutOfMemory), 0, 3, 0, 0, 0}, "oom"...)
	f.Add(uint8(1), reply(len(errBody), FlagReply|FlagError, 1, errBody...))
	f.Add(uint8(2), reply(5, FlagReply, 2, 1, 2, 3, 4, 5))          // wrong length for into
	f.Add(uint8(1), reply(0, 0, 1))                                 // a request, not a reply
	f.Add(uint8(1), reply(0, FlagReply, 99))                        // unknown id
	f.Add(uint8(1), rawHeader(MaxBody+1, OpNodeRead, FlagReply, 1)) // oversized
	f.Add(uint8(4), reply(8, FlagReply, 1, 1, 2))                   // cut body
	f.Fuzz(func(t *testing.T, k uint8, data []byte) {
		n := int(k%8) + 1
		a, b := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			defer a.Close()
			sc := NewConn(a)
			for i := 0; i < n; i++ {
				if _, _, err := readFrame(sc); err != nil {
					return
				}
			}
			a.Write(data)
		}()
		r := NewRPC(NewConn(b), "fuzz-peer")
		calls := make([]*Call, n)
		for i := range calls {
			var into []byte
			if i%2 == 1 { // even ids (odd i) read into a buffer of 3 bytes
				into = make([]byte, 3)
			}
			calls[i] = r.Go(OpNodeRead, into, []byte{byte(i)})
		}
		for i, c := range calls {
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("call %d never completed", i)
			}
			if c.Err != nil && !typed(c.Err) {
				t.Fatalf("call %d failed with an untyped error: %v", i, c.Err)
			}
			if c.Err == nil && c.into != nil && c.Body != nil {
				t.Fatalf("call %d read into a buffer and has a body", i)
			}
		}
		r.Close()
		<-served
	})
}
