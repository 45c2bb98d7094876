package api

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/vgpu/vgpu/api/wire"
)

// The operations: the opcode of a request (wire.Op) says which message its
// body is. The numbers are part of the wire protocol, one space for every
// role.

// Operations every peer understands.
const (
	OpHello   wire.Op = 1 // Hello → HelloReply; must be the first request
	OpKernels wire.Op = 2 // → KernelList
)

// Tenant operations: client → mediator. Addresses are tenant virtual addresses.
const (
	OpMalloc         wire.Op = 16 + iota // Malloc → MallocReply
	OpFree                               // Free
	OpStreamCreate                       // → StreamReply
	OpStreamDestroy                      // StreamReq
	OpCopyToDevice                       // CopyToDevice (+ payload)
	OpCopyFromDevice                     // CopyFromDevice → payload
	OpCopyDevice                         // CopyDevice
	OpMemset                             // Memset
	OpLaunch                             // Launch
	OpSynchronize                        // StreamReq; answered once all earlier commands completed
	OpStatus                             // → JSON Status
)

// Tenant operations of the data path (datapath.go).
const (
	OpHostRegister       wire.Op = 32 + iota // HostRegister, with a memfd passed alongside → HostRegion
	OpHostUnregister                         // HostRegion
	OpCopyToDeviceHost                       // CopyHost: from a registered host region
	OpCopyFromDeviceHost                     // CopyHost: into a registered host region
	OpBatch                                  // Batch; answered once every command in it completed
	OpSeal                                   // Seal
	OpGraphCreate                            // Batch (its stream unused) → Graph
	OpGraphLaunch                            // GraphLaunch
	OpGraphDestroy                           // Graph
	OpSessionStats                           // → SessionStats
	OpExport                                 // Export → Shared
	OpImport                                 // Shared → ImportReply
	OpRevoke                                 // Revoke
	OpPublish                                // At → BufVersion: the versioned buffer's draft becomes a version
	OpPin                                    // At → BufVersion: read the latest published version from now on
)

// Operator operations: vgpuctl and vgpu-hook → mediator. Those that change
// state need a peer running as root (or as the mediator's own user).
const (
	OpRegister wire.Op = 48 + iota // Register → RegisterReply; admission of a starting container
	OpRelease                      // Release; a stopped container's memory and socket are freed
	OpTenants                      // → JSON []TenantInfo
	OpReload                       // re-read the quota file; the old one stays if the new one is invalid
	// OpSelf → JSON SelfStatus: on a container's socket, what that
	// container has; the only status a container may read (self.go).
	OpSelf
)

// Node operations: mediator → node. Addresses are physical device addresses.
const (
	OpNodeAlloc      wire.Op = 64 + iota // NodeAlloc → NodeFrames
	OpNodeFree                           // NodeFrames
	OpNodeWrite                          // NodeAccess (+ payload)
	OpNodeRead                           // NodeAccess → payload
	OpNodeFill                           // NodeAccess
	OpNodeCopy                           // NodeCopy
	OpNodeLaunch                         // NodeLaunch
	OpNodeStatus                         // → JSON NodeStatus
	OpNodeBatch                          // Batch of node commands, in order, one reply
	OpNodeSeal                           // NodeFrames → NodeSealReply: make frames read-only and index their contents
	OpNodeDedup                          // NodeDedup → NodeDedupReply
	OpNodeExport                         // NodeExport → NodeObject
	OpNodeImport                         // NodeObject → NodeImportReply
	OpNodeRevoke                         // NodeRevoke
	OpNodeObjRead                        // NodeObjAccess → NodeGrant + bytes
	OpNodeObjWrite                       // NodeObjAccess (+ payload) → NodeGrant, once no other copy is valid
	OpNodeInval                          // NodeInval: pushed to a reader (wire.FlagPush); acknowledged with OpNodeInvalAck
	OpNodeInvalAck                       // NodeInval
	OpNodeRevoked                        // NodeRevoke: pushed to the revoked tenant's readers; acknowledged with OpNodeRevokedAck
	OpNodeRevokedAck                     // NodeRevoke
	OpNodeUnexport                       // NodeObject: its exporter ends it (frees the buffer)
	OpNodePublish                        // NodeObject → BufVersion
	OpNodePin                            // NodeObject → BufVersion: one more pin of the published version by the connection
	OpNodeUnpin                          // NodeVersion: undoes one pin of that version by the connection
	// OpNodeAttach: NodeAttach → NodeAttached. With Owner 0 the node keeps
	// the connection's frames for its reattach grace under Token when the
	// connection drops; with an Owner it hands the frames it kept of that
	// connection to this one (a restarted mediator's reclaim).
	OpNodeAttach
)

// Tensor graphs (tensor.go): tenant → mediator.
const (
	OpGraphRegister wire.Op = 96 + iota // GraphDef → Graph
	OpGraphInvoke                       // GraphInvoke → the output tensors' bytes
	OpGraphRelease                      // Graph
)

// Tensor graphs: mediator → node.
const (
	OpNodeGraphRegister wire.Op = 112 + iota // NodeGraph → Graph
	OpNodeGraphRun                           // NodeGraphRun; answered once every launch completed
	OpNodeGraphFree                          // Graph
)

var opNames = map[wire.Op]string{
	OpHello: "hello", OpKernels: "kernels",
	OpMalloc: "malloc", OpFree: "free", OpStreamCreate: "stream-create", OpStreamDestroy: "stream-destroy",
	OpCopyToDevice: "copy-to-device", OpCopyFromDevice: "copy-from-device", OpCopyDevice: "copy-device",
	OpMemset: "memset", OpLaunch: "launch", OpSynchronize: "synchronize", OpStatus: "status",
	OpRegister: "register", OpRelease: "release", OpTenants: "tenants", OpReload: "reload", OpSelf: "self",
	OpNodeAlloc: "node-alloc", OpNodeFree: "node-free", OpNodeWrite: "node-write", OpNodeRead: "node-read",
	OpNodeFill: "node-fill", OpNodeCopy: "node-copy", OpNodeLaunch: "node-launch", OpNodeStatus: "node-status",
	OpHostRegister: "host-register", OpHostUnregister: "host-unregister",
	OpCopyToDeviceHost: "copy-to-device-host", OpCopyFromDeviceHost: "copy-from-device-host",
	OpBatch: "batch", OpSeal: "seal", OpGraphCreate: "graph-create", OpGraphLaunch: "graph-launch",
	OpGraphDestroy: "graph-destroy", OpSessionStats: "session-stats",
	OpNodeBatch: "node-batch", OpNodeSeal: "node-seal", OpNodeDedup: "node-dedup",
	OpExport: "export", OpImport: "import", OpRevoke: "revoke", OpPublish: "publish", OpPin: "pin",
	OpNodePublish: "node-publish", OpNodePin: "node-pin", OpNodeUnpin: "node-unpin", OpNodeAttach: "node-attach",
	OpNodeExport: "node-export", OpNodeImport: "node-import", OpNodeRevoke: "node-revoke",
	OpNodeObjRead: "node-obj-read", OpNodeObjWrite: "node-obj-write", OpNodeInval: "node-inval", OpNodeInvalAck: "node-inval-ack",
	OpNodeRevoked: "node-revoked", OpNodeRevokedAck: "node-revoked-ack", OpNodeUnexport: "node-unexport",
	OpGraphRegister: "graph-register", OpGraphInvoke: "graph-invoke", OpGraphRelease: "graph-release",
	OpNodeGraphRegister: "node-graph-register", OpNodeGraphRun: "node-graph-run", OpNodeGraphFree: "node-graph-free",
}

// The wire's errors name operations by these names.
func init() { wire.NameOps(opNames) }

// Message is a request or reply body with a fixed layout.
type Message interface {
	Marshal(e *wire.Encoder)
	Unmarshal(d *wire.Decoder)
}

// Encode returns m's wire form.
func Encode(m Message) []byte {
	// Room for a typical small message up front: growing from nothing
	// costs an allocation per doubling.
	e := wire.Encoder{B: make([]byte, 0, 64)}
	m.Marshal(&e)
	return e.B
}

// Decode fills m from b, rejecting short, malformed and over-long bodies.
func Decode(b []byte, m Message) error {
	d := wire.NewDecoder(b)
	m.Unmarshal(d)
	return d.Finish()
}

// Magic opens every Hello.
const Magic = 0x55504756 // "VGPU"

// Version is the protocol version this build speaks. Peers must match.
const Version = 6

// Role says who is connecting.
type Role uint8

// Roles.
const (
	RoleTenant   Role = 1 // a tenant program, to a mediator
	RoleOperator Role = 2 // vgpuctl, to a mediator
	RoleMediator Role = 3 // a mediator, to a node
)

// Hello opens a connection.
//
//vgpu:wire
type Hello struct {
	Magic   uint32
	Version uint16
	Role    Role
	Tenant  string // the tenant this connection acts for; empty for operators
	Devices uint32 // virtual devices wanted (tenants); 0 means 1
	// Mediator → node only: the tenant's fair-share weight (0 means 1) and
	// the cap on its share of a device's time (0 means none), from the
	// mediator's quota file.
	Weight     uint32
	ComputeMax float32
	// Tenant → mediator only, an optional trailing field (a hello without
	// it is a client that cannot reconnect, or reconnect=0 in Python): Resumable
	// asks for a session token in the reply (HelloReply.Token), and Resume,
	// if not empty, is the token of a session to take up again after the
	// mediator restarted, instead of opening a new one.
	Resumable bool   `wire:"-"`
	Resume    string `wire:"if=Resumable,max=MaxToken"`
}

// MaxToken bounds a session token (Hello.Resume, HelloReply.Token,
// NodeAttach.Token).
const MaxToken = 64

// DeviceInfo describes a device: to a tenant its virtual device, to a
// mediator a node's physical device.
type DeviceInfo struct {
	Index  uint32
	Name   string
	Node   string // where it lives
	Memory uint64 // bytes
}

// HelloReply accepts a connection.
//
//vgpu:wire
type HelloReply struct {
	Version uint16
	Session uint64
	Devices []DeviceInfo
	// Token, an optional trailing field sent only to a Resumable hello:
	// the secret that takes this session up again after a mediator
	// restart (Hello.Resume); empty where the mediator keeps no journal.
	Resumable bool   `wire:"-"`
	Token     string `wire:"if=Resumable"`
}

// Malloc allocates Size bytes on virtual device Device, or, with
// MallocNear, on the device of the allocation that holds Near. Hint says
// what the buffer is for; with MallocFreeWithStream it is freed when Stream
// is destroyed.
//
//vgpu:wire
type Malloc struct {
	Device uint32
	Size   uint64
	Hint   Hint
	Flags  uint8
	Stream uint32
	Near   uint64
}

// Malloc flags.
const (
	MallocFreeWithStream uint8 = 1 << iota // freed when Stream is destroyed
	MallocNear                             // placed on Near's device, not Device
	mallocFlags          = MallocFreeWithStream | MallocNear
)

// Check refuses unknown hints and flags.
func (m *Malloc) Check() error {
	if !m.Hint.Valid() {
		return fmt.Errorf("malloc: %v is not a residency hint: %w", m.Hint, ErrInvalidArgument)
	}
	if m.Flags&^mallocFlags != 0 {
		return fmt.Errorf("malloc: unknown flags %#x: %w", m.Flags&^mallocFlags, ErrInvalidArgument)
	}
	return nil
}

// MallocReply returns the device virtual address of a new allocation.
//
//vgpu:wire
type MallocReply struct{ Addr uint64 }

// Free releases the allocation that starts at Addr.
//
//vgpu:wire
type Free struct{ Addr uint64 }

// DefaultStream exists in every session and cannot be destroyed.
const DefaultStream = 0

// StreamReq names a stream (destroy, synchronize); StreamReply returns one.
//
//vgpu:wire
type StreamReq struct{ Stream uint32 }

// CopyToDevice writes its payload at Dst. The payload is the rest of the body.
//
//vgpu:wire
type CopyToDevice struct {
	Stream  uint32
	Dst     uint64
	Payload []byte `wire:"rest"`
}

// CopyToDeviceHeader is the length of the fields in front of the payload.
const CopyToDeviceHeader = 12

// CopyFromDevice reads Len bytes at Src; the reply body is the bytes.
//
//vgpu:wire
type CopyFromDevice struct {
	Stream uint32
	Src    uint64
	Len    uint64
}

// CopyDevice copies Len bytes from Src to Dst, both device addresses.
//
//vgpu:wire
type CopyDevice struct {
	Stream   uint32
	Dst, Src uint64
	Len      uint64
}

// Memset sets Len bytes at Dst to Value.
//
//vgpu:wire
type Memset struct {
	Stream uint32
	Dst    uint64
	Value  uint8
	Len    uint64
}

// ArgKind is the type of a kernel argument.
type ArgKind uint8

// Argument kinds.
const (
	ArgBuffer ArgKind = 1 // a device address (tenant) or extents (node)
	ArgI64    ArgKind = 2
	ArgF32    ArgKind = 3
)

func (k ArgKind) String() string {
	switch k {
	case ArgBuffer:
		return "buffer"
	case ArgI64:
		return "i64"
	case ArgF32:
		return "f32"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Arg is a kernel argument as a tenant gives it: a scalar or a device address.
type Arg struct {
	Kind ArgKind
	Bits uint64 // the address, the int64, or the float32's bits
}

// Launch runs Kernel with Args on the device that holds its buffers.
//
//vgpu:wire
type Launch struct {
	Stream uint32
	Kernel string
	Args   []Arg
}

// Access says how a kernel uses a buffer parameter.
type Access uint8

// Buffer accesses.
const (
	AccessNone Access = iota // scalars
	AccessRead
	AccessWrite
	AccessReadWrite
)

// Param is one parameter of a kernel's signature. A buffer parameter says
// how many bytes the kernel touches: Elem times the product of the scalar
// parameters named in Dims (Elem alone when Dims is empty), so a mediator
// can make resident just that, not the whole allocation behind a pointer.
// DType is a buffer's element type; 0 on the wire means f32 (kernels
// that predate it take f32 data but for index buffers, which say i32).
type Param struct {
	Name   string
	Kind   ArgKind
	Access Access
	Elem   uint8
	Dims   []string `wire:"nilempty"`
	DType  DType
}

// Extent is the number of bytes the kernel touches through buffer
// parameter i given args, or false when args do not determine it (a
// missing or negative dimension, an overflow): then all of the buffer
// may be touched.
func (k *KernelInfo) Extent(i int, args []Arg) (uint64, bool) {
	if i >= len(k.Params) || k.Params[i].Kind != ArgBuffer || k.Params[i].Elem == 0 {
		return 0, false
	}
	n := uint64(k.Params[i].Elem)
	for _, dim := range k.Params[i].Dims {
		j := slices.IndexFunc(k.Params, func(p Param) bool { return p.Name == dim && p.Kind == ArgI64 })
		if j < 0 || j >= len(args) || args[j].Kind != ArgI64 || int64(args[j].Bits) < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(n, args[j].Bits)
		if hi != 0 {
			return 0, false
		}
		n = lo
	}
	return n, true
}

// KernelInfo describes a kernel in a node's catalog.
type KernelInfo struct {
	Name   string
	Doc    string
	Params []Param
}

// KernelList is the catalog.
//
//vgpu:wire
type KernelList struct{ Kernels []KernelInfo }

func putExtents(e *wire.Encoder, xs []Extent) {
	e.U32(uint32(len(xs)))
	for _, x := range xs {
		e.U64(x.Addr)
		e.U64(x.Len)
	}
}

func getExtents(d *wire.Decoder) []Extent {
	xs := make([]Extent, d.Len(16))
	for i := range xs {
		xs[i] = Extent{Addr: d.U64(), Len: d.U64()}
	}
	return xs
}

// ExtentsPrefix returns the extents of the first n bytes of xs (all of xs
// when they hold no more), sharing xs's array up to the last, which is
// copied if cut.
func ExtentsPrefix(xs []Extent, n uint64) []Extent {
	for i, x := range xs {
		if x.Len >= n {
			out := xs[: i+1 : i+1]
			if x.Len > n {
				out = append(xs[:i:i], Extent{Addr: x.Addr, Len: n})
			}
			return out
		}
		n -= x.Len
	}
	return xs
}

// ExtentsOverlap reports whether a byte lies in an extent of a and in an
// extent of b, in O((len(a)+len(b)) log) time; without sorting, or
// allocating, where each holds one extent.
func ExtentsOverlap(a, b []Extent) bool {
	if len(a) <= 1 && len(b) <= 1 {
		return len(a) == 1 && len(b) == 1 && extentsMeet(a[0], b[0])
	}
	byAddr := func(x, y Extent) int { return cmp.Compare(x.Addr, y.Addr) }
	a, b = slices.SortedFunc(slices.Values(a), byAddr), slices.SortedFunc(slices.Values(b), byAddr)
	for i, j := 0, 0; i < len(a) && j < len(b); {
		x, y := a[i], b[j]
		switch {
		case extentsMeet(x, y):
			return true
		case x.Len == 0 || y.Len != 0 && x.Addr < y.Addr:
			i++ // x ends before y, and every later extent of b, starts
		default:
			j++
		}
	}
	return false
}

// extentsMeet reports whether x and y share a byte. It compares
// differences, not ends, which may overflow.
func extentsMeet(x, y Extent) bool {
	if x.Len == 0 || y.Len == 0 {
		return false
	}
	if x.Addr <= y.Addr {
		return y.Addr-x.Addr < x.Len
	}
	return x.Addr-y.Addr < y.Len
}

// NodeAlloc asks a node for Count frames on Device for the connection's tenant.
//
//vgpu:wire
type NodeAlloc struct {
	Device uint32
	Count  uint32
}

// NodeFrames lists frames by physical address: granted, or to be freed.
//
//vgpu:wire
type NodeFrames struct {
	Device uint32
	Frames []uint64
}

// NodeAttach asks a node to keep a connection's frames through its drop
// (Owner 0), or to hand over those it kept of connection Owner (the
// HelloReply.Session that connection had), whose Token this must be.
//
//vgpu:wire
type NodeAttach struct {
	Owner uint64
	Token string `wire:"max=MaxToken"`
}

// NodeAttached answers NodeAttach: the connection's id as the node knows
// it (an Owner to reclaim later), and, for a reclaim, the frames it now
// holds on each device.
//
//vgpu:wire
type NodeAttached struct {
	Owner   uint64
	Devices []NodeFrames
}

// NodeAccess names physical memory to write (payload follows), read or fill.
//
//vgpu:wire
type NodeAccess struct {
	Device  uint32
	Extents []Extent
	Value   uint8  // fill only
	Payload []byte `wire:"rest"` // write only: the rest of the body
}

// NodeCopy copies between physical runs of one device; totals must match.
//
//vgpu:wire
type NodeCopy struct {
	Device   uint32
	Dst, Src []Extent
}

// NodeArg is a kernel argument as a node sees it: a scalar, or a buffer given
// as the physical runs that back it, in order.
//
//vgpu:wire custom min=5
type NodeArg struct {
	Kind    ArgKind
	Bits    uint64
	Extents []Extent
}

// A NodeArg's fields on the wire depend on its kind: a buffer's extents,
// or a scalar's bits.
func (a *NodeArg) marshalWire(e *wire.Encoder) {
	e.U8(uint8(a.Kind))
	if a.Kind == ArgBuffer {
		putExtents(e, a.Extents)
	} else {
		e.U64(a.Bits)
	}
}

func (a *NodeArg) unmarshalWire(d *wire.Decoder) {
	a.Kind = ArgKind(d.U8())
	if a.Kind == ArgBuffer {
		a.Extents = getExtents(d)
	} else {
		a.Bits = d.U64()
	}
}

// NodeLaunch runs a kernel on a device of the node.
//
//vgpu:wire
type NodeLaunch struct {
	Device uint32
	Kernel string
	Args   []NodeArg
}

// F32Bits packs a float32 argument into Arg.Bits.
func F32Bits(v float32) uint64 { return uint64(math.Float32bits(v)) }

// F32FromBits unpacks a float32 argument from Arg.Bits.
func F32FromBits(b uint64) float32 { return math.Float32frombits(uint32(b)) }

// Register admits a container that is being created. The hook sends it from
// the createRuntime hook; the mediator decides the tenant (from Tenant, set
// only by the operator's runtime configuration, else from the quota file's
// mapping of Namespace), checks the tenant's quota, and creates the
// container's own socket in SocketDir.
//
//vgpu:wire
type Register struct {
	Container string // container id
	Namespace string // containerd namespace ("moby" for Docker); with the id, names the container
	Tenant    string // from the runtime's own arguments; empty if the operator set none
	Memory    uint64 // bytes requested; 0: the tenant's default
	Compute   uint32 // weight requested; 0: the tenant's default
	Devices   uint32 // virtual devices; 0: 1
	Pid       uint32 // the container's init process, to notice it vanish
	SocketDir string // host directory, bind-mounted into the container, for its socket
}

// RegisterReply says what was granted.
//
//vgpu:wire
type RegisterReply struct {
	Tenant string
	Memory uint64
	Socket string // host path of the container's socket
}

// Release ends a container's registration. A container is named by its
// containerd namespace and id together, as in Register.
//
//vgpu:wire
type Release struct {
	Container string // container id
	Namespace string // containerd namespace; "" for a container registered without one
}
