package api

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
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
