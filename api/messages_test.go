package api

import (
	"bytes"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api/wire"
	"pgregory.net/rapid"
)

// msgCase is one Message type: how to make a zero one and a random one, and,
// for messages whose last field is a payload read with Rest, that payload.
type msgCase struct {
	new     func() Message
	gen     *rapid.Generator[Message]
	payload func(Message) []byte // nil unless the message ends in a payload
	// absent says whether a message's optional trailing field is absent,
	// so bytes more would be read as that field (nil: none).
	absent func(Message) bool
}

// Generators of wire fields.
var (
	genU8  = rapid.Uint8()
	genU16 = rapid.Uint16()
	genU32 = rapid.Uint32()
	genU64 = rapid.Uint64()
	// Wire strings are arbitrary bytes up to MaxString: mostly short, some
	// long, some exactly at the limit.
	genStr = rapid.OneOf(
		rapid.StringN(0, 16, -1),
		rapid.Map(rapid.SliceOfN(rapid.Byte(), 0, wire.MaxString), func(b []byte) string { return string(b) }),
		rapid.Map(rapid.Byte(), func(b byte) string { return strings.Repeat(string(rune(b%128)), wire.MaxString) }),
	)
	genBytes = rapid.OneOf(
		rapid.SliceOfN(rapid.Byte(), 0, 64),
		rapid.Map(rapid.IntRange(0, 1<<17), func(n int) []byte {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(i*7 + i>>8)
			}
			return b
		}),
	)
	genGrants = rapid.SliceOfN(rapid.Custom(func(t *rapid.T) Grant {
		return Grant{Tenant: genStr.Draw(t, "tenant"), Write: rapid.Bool().Draw(t, "write")}
	}), 0, 8)
	genExtents = rapid.SliceOfN(rapid.Custom(func(t *rapid.T) Extent {
		return Extent{Addr: genU64.Draw(t, "addr"), Len: genU64.Draw(t, "len")}
	}), 0, 16)
)

func gen[M Message](fn func(t *rapid.T) M) *rapid.Generator[Message] {
	return rapid.Custom(func(t *rapid.T) Message { return fn(t) })
}

// messages lists every Message type of the package, keyed by type name.
// TestMessagesComplete fails when messages.go grows a type this lacks.
var messages = map[string]msgCase{
	"Hello": {new: func() Message { return new(Hello) }, gen: gen(func(t *rapid.T) *Hello {
		h := &Hello{
			Magic: genU32.Draw(t, "magic"), Version: genU16.Draw(t, "version"), Role: Role(genU8.Draw(t, "role")),
			Tenant: genStr.Draw(t, "tenant"), Devices: genU32.Draw(t, "devices"),
			Weight: genU32.Draw(t, "weight"), ComputeMax: float32(genU16.Draw(t, "compute-max")) / 65535,
		}
		if h.Resumable = rapid.Bool().Draw(t, "resumable"); h.Resumable {
			h.Resume = rapid.StringN(0, MaxToken, MaxToken).Draw(t, "resume")
		}
		return h
	}), absent: func(m Message) bool { return !m.(*Hello).Resumable }},
	"HelloReply": {new: func() Message { return new(HelloReply) }, gen: gen(func(t *rapid.T) *HelloReply {
		r := &HelloReply{
			Version: genU16.Draw(t, "version"), Session: genU64.Draw(t, "session"),
			Devices: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) DeviceInfo {
				return DeviceInfo{Index: genU32.Draw(t, "index"), Name: genStr.Draw(t, "name"),
					Node: genStr.Draw(t, "node"), Memory: genU64.Draw(t, "memory")}
			}), 0, 8).Draw(t, "devices"),
		}
		if r.Resumable = rapid.Bool().Draw(t, "resumable"); r.Resumable {
			r.Token = genStr.Draw(t, "token")
		}
		return r
	}), absent: func(m Message) bool { return !m.(*HelloReply).Resumable }},
	"NodeAttach": {new: func() Message { return new(NodeAttach) }, gen: gen(func(t *rapid.T) *NodeAttach {
		a := &NodeAttach{Owner: genU64.Draw(t, "owner"), Token: rapid.StringN(0, MaxToken, MaxToken).Draw(t, "token")}
		if a.HasGrace = rapid.Bool().Draw(t, "has_grace"); a.HasGrace {
			a.GraceMillis = genU32.Draw(t, "grace")
		}
		return a
	}), absent: func(m Message) bool { return !m.(*NodeAttach).HasGrace }},
	"NodeAttached": {new: func() Message { return new(NodeAttached) }, gen: gen(func(t *rapid.T) *NodeAttached {
		return &NodeAttached{Owner: genU64.Draw(t, "owner"), Devices: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) NodeFrames {
			return NodeFrames{Device: genU32.Draw(t, "device"), Frames: rapid.SliceOfN(genU64, 0, 8).Draw(t, "frames")}
		}), 0, 4).Draw(t, "devices")}
	})},
	"Malloc": {new: func() Message { return new(Malloc) }, gen: gen(func(t *rapid.T) *Malloc {
		return &Malloc{Device: genU32.Draw(t, "device"), Size: genU64.Draw(t, "size"), Hint: Hint(genU8.Draw(t, "hint")),
			Flags: genU8.Draw(t, "flags"), Stream: genU32.Draw(t, "stream"), Near: genU64.Draw(t, "near")}
	})},
	"MallocReply": {new: func() Message { return new(MallocReply) }, gen: gen(func(t *rapid.T) *MallocReply {
		return &MallocReply{Addr: genU64.Draw(t, "addr")}
	})},
	"Free": {new: func() Message { return new(Free) }, gen: gen(func(t *rapid.T) *Free {
		return &Free{Addr: genU64.Draw(t, "addr")}
	})},
	"StreamReq": {new: func() Message { return new(StreamReq) }, gen: gen(func(t *rapid.T) *StreamReq {
		return &StreamReq{Stream: genU32.Draw(t, "stream")}
	})},
	"CopyToDevice": {
		new: func() Message { return new(CopyToDevice) },
		gen: gen(func(t *rapid.T) *CopyToDevice {
			return &CopyToDevice{Stream: genU32.Draw(t, "stream"), Dst: genU64.Draw(t, "dst"), Payload: genBytes.Draw(t, "payload")}
		}),
		payload: func(m Message) []byte { return m.(*CopyToDevice).Payload },
	},
	"CopyFromDevice": {new: func() Message { return new(CopyFromDevice) }, gen: gen(func(t *rapid.T) *CopyFromDevice {
		return &CopyFromDevice{Stream: genU32.Draw(t, "stream"), Src: genU64.Draw(t, "src"), Len: genU64.Draw(t, "len")}
	})},
	"CopyDevice": {new: func() Message { return new(CopyDevice) }, gen: gen(func(t *rapid.T) *CopyDevice {
		return &CopyDevice{Stream: genU32.Draw(t, "stream"), Dst: genU64.Draw(t, "dst"), Src: genU64.Draw(t, "src"), Len: genU64.Draw(t, "len")}
	})},
	"Memset": {new: func() Message { return new(Memset) }, gen: gen(func(t *rapid.T) *Memset {
		return &Memset{Stream: genU32.Draw(t, "stream"), Dst: genU64.Draw(t, "dst"), Value: genU8.Draw(t, "value"), Len: genU64.Draw(t, "len")}
	})},
	"Launch": {new: func() Message { return new(Launch) }, gen: gen(func(t *rapid.T) *Launch {
		return &Launch{
			Stream: genU32.Draw(t, "stream"), Kernel: genStr.Draw(t, "kernel"),
			Args: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) Arg {
				return Arg{Kind: ArgKind(genU8.Draw(t, "kind")), Bits: genU64.Draw(t, "bits")}
			}), 0, 32).Draw(t, "args"),
		}
	})},
	"KernelList": {new: func() Message { return new(KernelList) }, gen: gen(func(t *rapid.T) *KernelList {
		return &KernelList{Kernels: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) KernelInfo {
			return KernelInfo{
				Name: genStr.Draw(t, "name"), Doc: genStr.Draw(t, "doc"),
				Params: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) Param {
					p := Param{Name: genStr.Draw(t, "name"), Kind: ArgKind(genU8.Draw(t, "kind")), Access: Access(genU8.Draw(t, "access")),
						Elem: genU8.Draw(t, "elem"), DType: DType(genU8.Draw(t, "dtype"))}
					if dims := rapid.SliceOfN(rapid.StringN(0, 8, -1), 0, 3).Draw(t, "dims"); len(dims) > 0 {
						p.Dims = dims
					}
					return p
				}), 0, 8).Draw(t, "params"),
			}
		}), 0, 6).Draw(t, "kernels")}
	})},
	"Register": {new: func() Message { return new(Register) }, gen: gen(func(t *rapid.T) *Register {
		return &Register{Container: genStr.Draw(t, "container"), Namespace: genStr.Draw(t, "namespace"),
			Tenant: genStr.Draw(t, "tenant"), Memory: genU64.Draw(t, "memory"), Compute: genU32.Draw(t, "compute"),
			Devices: genU32.Draw(t, "devices"), Pid: genU32.Draw(t, "pid"), SocketDir: genStr.Draw(t, "dir")}
	})},
	"RegisterReply": {new: func() Message { return new(RegisterReply) }, gen: gen(func(t *rapid.T) *RegisterReply {
		return &RegisterReply{Tenant: genStr.Draw(t, "tenant"), Memory: genU64.Draw(t, "memory"), Socket: genStr.Draw(t, "socket")}
	})},
	"Release": {new: func() Message { return new(Release) }, gen: gen(func(t *rapid.T) *Release {
		return &Release{Container: genStr.Draw(t, "container"), Namespace: genStr.Draw(t, "namespace")}
	})},
	"NodeAlloc": {new: func() Message { return new(NodeAlloc) }, gen: gen(func(t *rapid.T) *NodeAlloc {
		return &NodeAlloc{Device: genU32.Draw(t, "device"), Count: genU32.Draw(t, "count")}
	})},
	"NodeFrames": {new: func() Message { return new(NodeFrames) }, gen: gen(func(t *rapid.T) *NodeFrames {
		return &NodeFrames{Device: genU32.Draw(t, "device"), Frames: rapid.SliceOfN(genU64, 0, 64).Draw(t, "frames")}
	})},
	"NodeAccess": {
		new: func() Message { return new(NodeAccess) },
		gen: gen(func(t *rapid.T) *NodeAccess {
			return &NodeAccess{Device: genU32.Draw(t, "device"), Extents: genExtents.Draw(t, "extents"),
				Value: genU8.Draw(t, "value"), Payload: genBytes.Draw(t, "payload")}
		}),
		payload: func(m Message) []byte { return m.(*NodeAccess).Payload },
	},
	"NodeCopy": {new: func() Message { return new(NodeCopy) }, gen: gen(func(t *rapid.T) *NodeCopy {
		return &NodeCopy{Device: genU32.Draw(t, "device"), Dst: genExtents.Draw(t, "dst"), Src: genExtents.Draw(t, "src")}
	})},
	"NodeLaunch": {new: func() Message { return new(NodeLaunch) }, gen: gen(func(t *rapid.T) *NodeLaunch {
		return &NodeLaunch{
			Device: genU32.Draw(t, "device"), Kernel: genStr.Draw(t, "kernel"),
			Args: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) NodeArg {
				// A buffer carries extents, anything else its bits: the
				// wire form has room for one or the other.
				a := NodeArg{Kind: ArgKind(rapid.OneOf(rapid.Just(uint8(ArgBuffer)), genU8).Draw(t, "kind"))}
				if a.Kind == ArgBuffer {
					a.Extents = genExtents.Draw(t, "extents")
				} else {
					a.Bits = genU64.Draw(t, "bits")
				}
				return a
			}), 0, 16).Draw(t, "args"),
		}
	})},
	"HostRegister": {new: func() Message { return new(HostRegister) }, gen: gen(func(t *rapid.T) *HostRegister {
		return &HostRegister{Size: genU64.Draw(t, "size")}
	})},
	"HostRegion": {new: func() Message { return new(HostRegion) }, gen: gen(func(t *rapid.T) *HostRegion {
		return &HostRegion{Region: genU32.Draw(t, "region")}
	})},
	"CopyHost": {new: func() Message { return new(CopyHost) }, gen: gen(func(t *rapid.T) *CopyHost {
		return &CopyHost{Stream: genU32.Draw(t, "stream"), Addr: genU64.Draw(t, "addr"), Region: genU32.Draw(t, "region"),
			Off: genU64.Draw(t, "off"), Len: genU64.Draw(t, "len")}
	})},
	"Batch": {new: func() Message { return new(Batch) }, gen: gen(func(t *rapid.T) *Batch {
		return &Batch{Stream: genU32.Draw(t, "stream"), Cmds: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) Cmd {
			return Cmd{Op: wire.Op(genU16.Draw(t, "op")), Body: rapid.SliceOfN(rapid.Byte(), 0, 64).Draw(t, "body")}
		}), 0, 16).Draw(t, "cmds")}
	})},
	"Seal": {new: func() Message { return new(Seal) }, gen: gen(func(t *rapid.T) *Seal {
		return &Seal{Addr: genU64.Draw(t, "addr")}
	})},
	"Graph": {new: func() Message { return new(Graph) }, gen: gen(func(t *rapid.T) *Graph {
		return &Graph{Graph: genU32.Draw(t, "graph")}
	})},
	"GraphLaunch": {new: func() Message { return new(GraphLaunch) }, gen: gen(func(t *rapid.T) *GraphLaunch {
		return &GraphLaunch{Stream: genU32.Draw(t, "stream"), Graph: genU32.Draw(t, "graph")}
	})},
	"SessionStats": {new: func() Message { return new(SessionStats) }, gen: gen(func(t *rapid.T) *SessionStats {
		return &SessionStats{CopiedIn: genU64.Draw(t, "in"), CopiedOut: genU64.Draw(t, "out"), Launches: genU64.Draw(t, "launches"),
			NetOut: genU64.Draw(t, "net-out"), NetIn: genU64.Draw(t, "net-in"), DedupHits: genU64.Draw(t, "hits"), DedupBytes: genU64.Draw(t, "bytes"),
			SocketIn: genU64.Draw(t, "socket-in"), SocketOut: genU64.Draw(t, "socket-out"),
			SharedHits: genU64.Draw(t, "shared-hits"), SharedMisses: genU64.Draw(t, "shared-misses")}
	})},
	"NodeDedup": {new: func() Message { return new(NodeDedup) }, gen: gen(func(t *rapid.T) *NodeDedup {
		return &NodeDedup{Device: genU32.Draw(t, "device"), Dst: genExtents.Draw(t, "dst"),
			Hashes: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) [32]byte {
				var h [32]byte
				copy(h[:], rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "hash"))
				return h
			}), 0, 8).Draw(t, "hashes")}
	})},
	"Export": {new: func() Message { return new(Export) }, gen: gen(func(t *rapid.T) *Export {
		return &Export{Addr: genU64.Draw(t, "addr"), Mode: Mode(genU8.Draw(t, "mode")), Grants: genGrants.Draw(t, "grants")}
	})},
	"Shared": {new: func() Message { return new(Shared) }, gen: gen(func(t *rapid.T) *Shared {
		return &Shared{Node: genStr.Draw(t, "node"), Object: genU64.Draw(t, "object")}
	})},
	"ImportReply": {new: func() Message { return new(ImportReply) }, gen: gen(func(t *rapid.T) *ImportReply {
		return &ImportReply{Addr: genU64.Draw(t, "addr"), Size: genU64.Draw(t, "size"), Mode: Mode(genU8.Draw(t, "mode")), Write: rapid.Bool().Draw(t, "write")}
	})},
	"Revoke": {new: func() Message { return new(Revoke) }, gen: gen(func(t *rapid.T) *Revoke {
		return &Revoke{Addr: genU64.Draw(t, "addr"), Tenant: genStr.Draw(t, "tenant")}
	})},
	"NodeExport": {new: func() Message { return new(NodeExport) }, gen: gen(func(t *rapid.T) *NodeExport {
		return &NodeExport{Device: genU32.Draw(t, "device"), Extents: genExtents.Draw(t, "extents"), Mode: Mode(genU8.Draw(t, "mode")), Grants: genGrants.Draw(t, "grants")}
	})},
	"NodeObject": {new: func() Message { return new(NodeObject) }, gen: gen(func(t *rapid.T) *NodeObject {
		return &NodeObject{Object: genU64.Draw(t, "object")}
	})},
	"NodeImportReply": {new: func() Message { return new(NodeImportReply) }, gen: gen(func(t *rapid.T) *NodeImportReply {
		r := &NodeImportReply{Size: genU64.Draw(t, "size"), Mode: Mode(genU8.Draw(t, "mode")), Write: rapid.Bool().Draw(t, "write"),
			PageSize: genU32.Draw(t, "page"), LeaseNs: int64(genU64.Draw(t, "lease"))}
		if rapid.Bool().Draw(t, "has exporter") {
			r.HasExporter, r.Exporter = true, genStr.Draw(t, "exporter")
		}
		return r
	}), absent: func(m Message) bool { return !m.(*NodeImportReply).HasExporter }},
	"NodeRestore": {new: func() Message { return new(NodeRestore) }, gen: gen(func(t *rapid.T) *NodeRestore {
		return &NodeRestore{Object: genU64.Draw(t, "object"), Version: genU64.Draw(t, "version"), Size: genU64.Draw(t, "size"),
			Grants: genGrants.Draw(t, "grants"), Off: genU64.Draw(t, "off"), Payload: genBytes.Draw(t, "payload")}
	}), payload: func(m Message) []byte { return m.(*NodeRestore).Payload }},
	"NodeRevoke": {new: func() Message { return new(NodeRevoke) }, gen: gen(func(t *rapid.T) *NodeRevoke {
		return &NodeRevoke{Object: genU64.Draw(t, "object"), Tenant: genStr.Draw(t, "tenant")}
	})},
	"NodeObjAccess": {
		new: func() Message { return new(NodeObjAccess) },
		gen: gen(func(t *rapid.T) *NodeObjAccess {
			return &NodeObjAccess{Object: genU64.Draw(t, "object"), Version: genU64.Draw(t, "version"), Off: genU64.Draw(t, "off"), Len: genU64.Draw(t, "len"), Payload: genBytes.Draw(t, "payload")}
		}),
		payload: func(m Message) []byte { return m.(*NodeObjAccess).Payload },
	},
	"BufVersion": {new: func() Message { return new(BufVersion) }, gen: gen(func(t *rapid.T) *BufVersion {
		return &BufVersion{Version: genU64.Draw(t, "version")}
	})},
	"NodeVersion": {new: func() Message { return new(NodeVersion) }, gen: gen(func(t *rapid.T) *NodeVersion {
		return &NodeVersion{Object: genU64.Draw(t, "object"), Version: genU64.Draw(t, "version")}
	})},
	"At": {new: func() Message { return new(At) }, gen: gen(func(t *rapid.T) *At {
		return &At{Addr: genU64.Draw(t, "addr")}
	})},
	"NodeGrant": {new: func() Message { return new(NodeGrant) }, gen: gen(func(t *rapid.T) *NodeGrant {
		return &NodeGrant{Version: genU64.Draw(t, "version"), LeaseNs: int64(genU64.Draw(t, "lease")), Sealed: rapid.Bool().Draw(t, "sealed")}
	})},
	"NodeInval": {new: func() Message { return new(NodeInval) }, gen: gen(func(t *rapid.T) *NodeInval {
		return &NodeInval{Object: genU64.Draw(t, "object"), Page: genU32.Draw(t, "page"), Version: genU64.Draw(t, "version")}
	})},
	"NodeDedupReply": {new: func() Message { return new(NodeDedupReply) }, gen: gen(func(t *rapid.T) *NodeDedupReply {
		return &NodeDedupReply{Hit: rapid.SliceOfN(rapid.Bool(), 0, 16).Draw(t, "hit")}
	})},
	"NodeSealReply": {new: func() Message { return new(NodeSealReply) }, gen: gen(func(t *rapid.T) *NodeSealReply {
		return &NodeSealReply{StoredOnce: rapid.SliceOfN(rapid.Bool(), 0, 16).Draw(t, "stored once")}
	})},
	"GraphDef": {new: func() Message { return new(GraphDef) }, gen: gen(func(t *rapid.T) *GraphDef {
		return &GraphDef{
			Name:    genStr.Draw(t, "name"),
			Scalars: rapid.SliceOfN(genStr, 0, MaxGraphScalars).Draw(t, "scalars"),
			Tensors: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) TensorDef {
				return TensorDef{Name: genStr.Draw(t, "name"), DType: DType(genU8.Draw(t, "dtype")),
					Residency: Residency(genU8.Draw(t, "residency")), Addr: genU64.Draw(t, "addr"),
					Shape: rapid.SliceOfN(rapid.Int64(), 0, MaxTensorDims).Draw(t, "shape")}
			}), 0, 8).Draw(t, "tensors"),
			Ops: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) OpDef {
				return OpDef{Kernel: genStr.Draw(t, "kernel"), Phase: Phase(genU8.Draw(t, "phase")),
					Args: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) OpArg {
						// Each kind carries its own fields only.
						a := OpArg{Kind: OpArgKind(rapid.IntRange(int(OpArgTensor), int(opArgEnd)-1).Draw(t, "kind"))}
						switch a.Kind {
						case OpArgTensor:
							a.Tensor = genU32.Draw(t, "tensor")
						case OpArgF32:
							a.F32 = float32(genU16.Draw(t, "f32")) / 7
						case OpArgScalar:
							a.Scalar, a.Mul, a.I64 = genU32.Draw(t, "scalar"), rapid.Int64().Draw(t, "mul"), rapid.Int64().Draw(t, "add")
						default:
							a.I64 = rapid.Int64().Draw(t, "i64")
						}
						return a
					}), 0, 12).Draw(t, "args")}
			}), 0, 8).Draw(t, "ops"),
		}
	})},
	"GraphInvoke": {new: func() Message { return new(GraphInvoke) }, gen: gen(func(t *rapid.T) *GraphInvoke {
		return &GraphInvoke{Graph: genU32.Draw(t, "graph"), Scalars: rapid.SliceOfN(rapid.Int64(), 0, MaxGraphScalars).Draw(t, "scalars"),
			Inputs: genBytes.Draw(t, "inputs")}
	}), payload: func(m Message) []byte { return m.(*GraphInvoke).Inputs }},
	"NodeGraph": {new: func() Message { return new(NodeGraph) }, gen: gen(func(t *rapid.T) *NodeGraph {
		return &NodeGraph{Device: genU32.Draw(t, "device"), Launches: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) NodeGraphLaunch {
			return NodeGraphLaunch{Kernel: genStr.Draw(t, "kernel"), Phase: Phase(genU8.Draw(t, "phase")),
				Args: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) NodeGraphArg {
					// A buffer carries extents; anything else its bits, and
					// a scalar's reference where it has one.
					a := NodeGraphArg{NodeArg: NodeArg{Kind: ArgKind(rapid.OneOf(rapid.Just(uint8(ArgBuffer)), genU8).Draw(t, "kind"))}, Scalar: -1}
					if a.Kind == ArgBuffer {
						a.Extents = genExtents.Draw(t, "extents")
						return a
					}
					a.Bits = genU64.Draw(t, "bits")
					if rapid.Bool().Draw(t, "from a scalar") {
						a.Scalar = rapid.Int32Range(0, MaxGraphScalars).Draw(t, "scalar")
						a.Mul, a.Add = rapid.Int64().Draw(t, "mul"), rapid.Int64().Draw(t, "add")
					}
					return a
				}), 0, 12).Draw(t, "args")}
		}), 0, 8).Draw(t, "launches")}
	})},
	"NodeGraphRun": {new: func() Message { return new(NodeGraphRun) }, gen: gen(func(t *rapid.T) *NodeGraphRun {
		return &NodeGraphRun{Graph: genU32.Draw(t, "graph"), Scalars: rapid.SliceOfN(rapid.Int64(), 0, MaxGraphScalars).Draw(t, "scalars")}
	})},
}

// messageNames returns the names in messages, sorted, so tests run in a fixed order.
func messageNames() []string {
	var names []string
	for n := range messages {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// TestMessagesComplete checks that messages covers every type of the
// package that has both Marshal and Unmarshal methods.
func TestMessagesComplete(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	methods := map[string]map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 {
				continue
			}
			typ := fd.Recv.List[0].Type
			if st, ok := typ.(*ast.StarExpr); ok {
				typ = st.X
			}
			id, ok := typ.(*ast.Ident)
			if !ok {
				continue
			}
			if methods[id.Name] == nil {
				methods[id.Name] = map[string]bool{}
			}
			methods[id.Name][fd.Name.Name] = true
		}
	}
	found := 0
	for typ, ms := range methods {
		if !ms["Marshal"] || !ms["Unmarshal"] {
			continue
		}
		found++
		c, ok := messages[typ]
		if !ok {
			t.Errorf("message type %s has no case in messages (messages_test.go)", typ)
			continue
		}
		if got := reflect.TypeOf(c.new()).Elem().Name(); got != typ {
			t.Errorf("messages[%q] makes a %s", typ, got)
		}
	}
	if found != len(messages) {
		t.Errorf("the package has %d message types, the test %d", found, len(messages))
	}
}

// normalize turns empty slices into nil, recursively, so that a nil list and
// a decoded empty one compare equal.
func normalize(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			normalize(v.Elem())
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Field(i).CanSet() {
				normalize(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Len() == 0 {
			if !v.IsNil() {
				v.Set(reflect.Zero(v.Type()))
			}
			return
		}
		for i := 0; i < v.Len(); i++ {
			normalize(v.Index(i))
		}
	}
}

func sameMessage(a, b Message) bool {
	normalize(reflect.ValueOf(a))
	normalize(reflect.ValueOf(b))
	return reflect.DeepEqual(a, b)
}

// TestMessageRoundTrip: every message decodes from its encoding to an equal
// value, and the encoding of that value is the same bytes.
func TestMessageRoundTrip(t *testing.T) {
	for _, name := range messageNames() {
		c := messages[name]
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				m := c.gen.Draw(t, "msg")
				b := Encode(m)
				got := c.new()
				if err := Decode(b, got); err != nil {
					t.Fatalf("Decode(Encode(%+v)): %v", m, err)
				}
				if again := Encode(got); !bytes.Equal(again, b) {
					t.Fatalf("re-encoding differs:\n%x\n%x", b, again)
				}
				if !sameMessage(m, got) {
					t.Fatalf("round trip:\n sent %+v\n got  %+v", m, got)
				}
			})
		})
	}
}

// TestMessageTruncated: every strict prefix of an encoding fails with
// ErrProtocol, except that a payload may be cut (it is the rest of the
// body) and an optional trailing field left out, and never panics.
func TestMessageTruncated(t *testing.T) {
	for _, name := range messageNames() {
		c := messages[name]
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				m := c.gen.Draw(t, "msg")
				b := Encode(m)
				fixed := len(b) // bytes in front of the payload
				if c.payload != nil {
					fixed -= len(c.payload(m))
				}
				for _, n := range cuts(t, len(b)) {
					got := c.new()
					err := Decode(b[:n:n], got)
					if n < fixed {
						if err == nil && c.absent != nil && c.absent(got) && len(Encode(got)) == n {
							continue // cut where its optional field starts
						}
						if !errors.Is(err, ErrProtocol) {
							t.Fatalf("Decode of %d of %d bytes: %v, want ErrProtocol", n, len(b), err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("Decode of %d of %d bytes (payload cut): %v", n, len(b), err)
					}
					if p := c.payload(got); !bytes.Equal(p, b[fixed:n]) {
						t.Fatalf("cut payload = %x, want %x", p, b[fixed:n])
					}
				}
			})
		})
	}
}

// cuts returns the lengths to cut an encoding of size n at: all of them when
// n is small; else both ends, a regular stride and random points, so that the
// check stays linear in n rather than quadratic.
func cuts(t *rapid.T, n int) []int {
	if n <= 1024 {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	var out []int
	for i := 0; i < 256; i++ {
		out = append(out, i, n-1-i)
	}
	for i := 256; i < n-256; i += n / 128 {
		out = append(out, i)
	}
	for i := 0; i < 64; i++ {
		out = append(out, rapid.IntRange(0, n-1).Draw(t, "cut"))
	}
	return out
}

// TestMessageTrailing: a byte more fails with ErrProtocol naming the
// trailing bytes, except where it lengthens a payload or is where an
// optional field would be.
func TestMessageTrailing(t *testing.T) {
	for _, name := range messageNames() {
		c := messages[name]
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				m := c.gen.Draw(t, "msg")
				if c.absent != nil && c.absent(m) {
					return // bytes more are its optional field
				}
				extra := rapid.SliceOfN(rapid.Byte(), 1, 9).Draw(t, "extra")
				b := append(Encode(m), extra...)
				got := c.new()
				err := Decode(b, got)
				if c.payload != nil {
					if err != nil {
						t.Fatalf("Decode with %d payload bytes more: %v", len(extra), err)
					}
					if want := append(append([]byte(nil), c.payload(m)...), extra...); !bytes.Equal(c.payload(got), want) {
						t.Fatalf("payload = %x, want %x", c.payload(got), want)
					}
					return
				}
				if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "trailing") {
					t.Fatalf("Decode with %d bytes more: %v, want a trailing-bytes ErrProtocol", len(extra), err)
				}
			})
		})
	}
}

func TestMessageZeroValues(t *testing.T) {
	for _, name := range messageNames() {
		c := messages[name]
		b := Encode(c.new())
		got := c.new()
		if err := Decode(b, got); err != nil || !sameMessage(c.new(), got) {
			t.Errorf("%s: zero value round trip: %+v, %v", name, got, err)
		}
	}
}

// TestPayloadNotCopied: Rest hands out the body's own bytes.
func TestPayloadNotCopied(t *testing.T) {
	b := Encode(&CopyToDevice{Stream: 1, Dst: 2, Payload: []byte("abcdef")})
	var m CopyToDevice
	if err := Decode(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Payload) != 6 || &m.Payload[0] != &b[CopyToDeviceHeader] {
		t.Fatalf("payload %q does not alias the body at offset %d", m.Payload, CopyToDeviceHeader)
	}
}

// TestForgedListCounts: a short body that announces a huge list fails
// without allocating for it.
func TestForgedListCounts(t *testing.T) {
	le32 := func(b []byte, v uint32) []byte { return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24)) }
	pad := func(b []byte, n int) []byte { return append(b, make([]byte, n)...) }
	for _, count := range []uint32{1e6, wire.MaxList, wire.MaxList + 1, math.MaxUint32} {
		cases := map[string]struct {
			body []byte
			m    Message
		}{
			"NodeFrames": {pad(le32(le32(nil, 0), count), 12), new(NodeFrames)},
			"HelloReply": {pad(le32(make([]byte, 10), count), 6), new(HelloReply)},
			"Launch":     {pad(le32(le32(le32(nil, 0), 0), count), 8), new(Launch)},
			"KernelList": {pad(le32(nil, count), 16), new(KernelList)},
			"NodeAccess": {pad(le32(le32(nil, 0), count), 12), new(NodeAccess)},
			"NodeCopy":   {pad(le32(le32(nil, 0), count), 12), new(NodeCopy)},
			"NodeLaunch": {pad(le32(le32(le32(nil, 0), 0), count), 8), new(NodeLaunch)},
		}
		for name, tc := range cases {
			if len(tc.body) != 20 {
				t.Fatalf("%s: test body is %d bytes, want 20", name, len(tc.body))
			}
			err := Decode(tc.body, tc.m)
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("%s announcing %d elements in 20 bytes: %v, want ErrProtocol", name, count, err)
			}
			if n := listElems(reflect.ValueOf(tc.m)); n != 0 {
				t.Errorf("%s announcing %d elements: decoded %d", name, count, n)
			}
			allocs := bytesAllocated(func() { _ = Decode(tc.body, messages[name].new()) })
			if allocs > 4<<10 {
				t.Errorf("%s announcing %d elements in 20 bytes allocated %d bytes per decode", name, count, allocs)
			}
		}
	}
	// Over MaxList is refused even when the bytes are there.
	b := le32(le32(nil, 0), wire.MaxList+1)
	b = pad(b, 8*(wire.MaxList+1))
	if err := Decode(b, new(NodeFrames)); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("NodeFrames of MaxList+1 frames: %v, want ErrProtocol over the limit", err)
	}
	b = pad(le32(le32(nil, 0), wire.MaxList), 8*wire.MaxList)
	var m NodeFrames
	if err := Decode(b, &m); err != nil || len(m.Frames) != wire.MaxList {
		t.Errorf("NodeFrames of MaxList frames: %d frames, %v", len(m.Frames), err)
	}
}

// bytesAllocated returns the average heap bytes one call of fn allocates.
func bytesAllocated(fn func()) uint64 {
	const runs = 50
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < runs; i++ {
		fn()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / runs
}

// listElems counts the elements of every slice reachable from v, bytes of
// []byte included: a bound on what a decoder allocated.
func listElems(v reflect.Value) int {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 0
		}
		return listElems(v.Elem())
	case reflect.Struct:
		n := 0
		for i := 0; i < v.NumField(); i++ {
			n += listElems(v.Field(i))
		}
		return n
	case reflect.Slice:
		n := v.Len()
		if v.Type().Elem().Kind() != reflect.Uint8 {
			for i := 0; i < v.Len(); i++ {
				n += listElems(v.Index(i))
			}
		}
		return n
	case reflect.String:
		return v.Len()
	}
	return 0
}

func TestStringLimit(t *testing.T) {
	for _, n := range []int{0, 1, wire.MaxString} {
		var m Hello
		in := Hello{Tenant: strings.Repeat("t", n)}
		if err := Decode(Encode(&in), &m); err != nil || m.Tenant != in.Tenant {
			t.Errorf("tenant of %d bytes: %v", n, err)
		}
	}
	b := Encode(&Hello{Tenant: strings.Repeat("t", wire.MaxString+1)})
	if err := Decode(b, new(Hello)); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("tenant of MaxString+1 bytes: %v, want ErrProtocol over the limit", err)
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{OpHello.String(), "hello"},
		{OpNodeLaunch.String(), "node-launch"},
		{wire.Op(999).String(), "op(999)"},
		{ArgBuffer.String(), "buffer"},
		{ArgI64.String(), "i64"},
		{ArgF32.String(), "f32"},
		{ArgKind(9).String(), "kind(9)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	for op, name := range opNames {
		if op.String() != name || strings.HasPrefix(name, "op(") {
			t.Errorf("Op %d: %q", op, op.String())
		}
	}
}

func TestExtentsLen(t *testing.T) {
	if n := ExtentsLen(nil); n != 0 {
		t.Errorf("ExtentsLen(nil) = %d", n)
	}
	if n := ExtentsLen([]Extent{{Addr: 0, Len: 4096}, {Addr: 1 << 21, Len: 2 << 20}, {Addr: 7, Len: 0}}); n != 4096+2<<20 {
		t.Errorf("ExtentsLen = %d", n)
	}
}

func TestKernelExtent(t *testing.T) {
	k := KernelInfo{Name: "sgemm", Params: []Param{
		{Name: "m", Kind: ArgI64}, {Name: "k", Kind: ArgI64},
		{Name: "a", Kind: ArgBuffer, Elem: 4, Dims: []string{"m", "k"}},
		{Name: "out", Kind: ArgBuffer, Elem: 4},
		{Name: "any", Kind: ArgBuffer},
		{Name: "bad", Kind: ArgBuffer, Elem: 4, Dims: []string{"nosuch"}},
	}}
	i64 := func(v int64) Arg { return Arg{Kind: ArgI64, Bits: uint64(v)} }
	args := []Arg{i64(3), i64(5), {Kind: ArgBuffer}, {Kind: ArgBuffer}, {Kind: ArgBuffer}, {Kind: ArgBuffer}}
	for _, tc := range []struct {
		i    int
		args []Arg
		want uint64
		ok   bool
	}{
		{2, args, 60, true},
		{3, args, 4, true},
		{4, args, 0, false},     // no element size: the whole buffer
		{5, args, 0, false},     // names no scalar
		{0, args, 0, false},     // not a buffer
		{2, args[:1], 0, false}, // k missing
		{2, append([]Arg{i64(-1)}, args[1:]...), 0, false},
		{2, append([]Arg{i64(1 << 62)}, args[1:]...), 0, false}, // overflow
	} {
		got, ok := k.Extent(tc.i, tc.args)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Extent(%d) = %d, %v; want %d, %v", tc.i, got, ok, tc.want, tc.ok)
		}
	}
}

// TestExtentsOverlap checks ExtentsOverlap against a byte-by-byte answer,
// over small address ranges where extents collide often, and at the top of
// the address space, where ends overflow.
func TestExtentsOverlap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := rapid.SampledFrom([]uint64{0, math.MaxUint64 - 64}).Draw(t, "base")
		gen := rapid.Custom(func(t *rapid.T) Extent {
			off := rapid.Uint64Range(0, 63).Draw(t, "off")
			return Extent{Addr: base + off, Len: rapid.Uint64Range(0, min(64-off, 12)).Draw(t, "len")}
		})
		a := rapid.SliceOfN(gen, 0, 5).Draw(t, "a")
		b := rapid.SliceOfN(gen, 0, 5).Draw(t, "b")
		var inA [64]bool
		for _, x := range a {
			for i := x.Addr - base; i < x.Addr-base+x.Len; i++ {
				inA[i] = true
			}
		}
		want := false
		for _, x := range b {
			for i := x.Addr - base; i < x.Addr-base+x.Len; i++ {
				want = want || inA[i]
			}
		}
		if got := ExtentsOverlap(a, b); got != want {
			t.Fatalf("ExtentsOverlap(%v, %v) = %v, want %v", a, b, got, want)
		}
		if got := ExtentsOverlap(b, a); got != want {
			t.Fatalf("ExtentsOverlap(%v, %v) = %v, want %v", b, a, got, want)
		}
	})
}

func TestExtentsPrefix(t *testing.T) {
	xs := []Extent{{Addr: 100, Len: 10}, {Addr: 300, Len: 20}, {Addr: 500, Len: 5}}
	for _, tc := range []struct {
		n    uint64
		want []Extent
	}{
		{0, []Extent{{Addr: 100, Len: 0}}},
		{4, []Extent{{Addr: 100, Len: 4}}},
		{10, []Extent{{Addr: 100, Len: 10}}},
		{11, []Extent{{Addr: 100, Len: 10}, {Addr: 300, Len: 1}}},
		{35, xs},
		{99, xs},
	} {
		got := ExtentsPrefix(xs, tc.n)
		if !slices.Equal(got, tc.want) || ExtentsLen(got) != min(tc.n, 35) {
			t.Errorf("ExtentsPrefix(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
	if xs[1].Len != 20 {
		t.Fatalf("ExtentsPrefix changed its input: %v", xs)
	}
}
