package api

import (
	"fmt"

	"github.com/vgpu/vgpu/api/wire"
)

// Tensor graphs: a model's work registered once, with its meaning — which
// tensors are weights, activations, KV caches, inputs and outputs, which
// phase each operation belongs to — and then invoked with its inputs in one
// round trip (docs/graphs.md). A tenant registers a GraphDef with the
// mediator (OpGraphRegister); the mediator checks it whole, lays out its
// tensors and registers its launches with the node that holds them as a
// NodeGraph, which each invocation (OpGraphInvoke) runs with its scalars.
//
// Tensors are named by their index in GraphDef.Tensors, scalars by their
// index in GraphDef.Scalars.

// DType is a tensor's element type.
type DType uint8

// Element types. Kernel buffer parameters say which they take (Param.DType).
const (
	DTypeF32 DType = 1 + iota // little-endian IEEE 754 binary32
	DTypeI32                  // little-endian two's complement int32 (token ids, indices)
	dtypeEnd
)

var dtypeNames = [...]string{DTypeF32: "f32", DTypeI32: "i32"}

func (t DType) String() string { return enumString(dtypeNames[:], t, "dtype") }

// Valid reports whether t is a known element type.
func (t DType) Valid() bool { return t > 0 && t < dtypeEnd }

// Size is the bytes of one element.
func (t DType) Size() uint64 { return 4 }

// Residency says what a tensor is for and so where it lives.
type Residency uint8

// Residencies.
const (
	// ResWeight: read-only parameters, bound to a sealed allocation of the
	// tenant (deduplicated across tenants; shared by the session's graphs).
	ResWeight Residency = 1 + iota
	// ResActivation: intermediate results, in the graph's arena, reused
	// by every invocation.
	ResActivation
	// ResKVCache: state kept between invocations, bound to an allocation
	// of the tenant (hint kv-cache) that the session's graphs share.
	ResKVCache
	// ResInput: written from the invocation's input bytes before its ops.
	ResInput
	// ResOutput: returned in the invocation's reply after its ops.
	ResOutput
	residencyEnd
)

var residencyNames = [...]string{ResWeight: "weight", ResActivation: "activation", ResKVCache: "kv-cache", ResInput: "input", ResOutput: "output"}

func (r Residency) String() string { return enumString(residencyNames[:], r, "residency") }

// Valid reports whether r is a known residency.
func (r Residency) Valid() bool { return r > 0 && r < residencyEnd }

// Bound says whether a tensor of residency r lives in an allocation the
// tenant made (TensorDef.Addr) rather than in the graph's arena.
func (r Residency) Bound() bool { return r == ResWeight || r == ResKVCache }

// Phase is the part of a model's work an operation belongs to. The node's
// scheduler serves decode work ahead of bulk work within each tenant's
// fair share (docs/graphs.md).
type Phase uint8

// Phases.
const (
	PhaseOther Phase = iota
	PhasePrefill
	PhaseDecode
	PhaseForward
	PhaseBackward
	phaseEnd
)

var phaseNames = [...]string{PhaseOther: "other", PhasePrefill: "prefill", PhaseDecode: "decode", PhaseForward: "forward", PhaseBackward: "backward"}

func (p Phase) String() string { return enumString(phaseNames[:], p, "phase") }

// enumString is v's name in names, or kind(v) for a value that has none.
func enumString[T ~uint8](names []string, v T, kind string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", kind, uint8(v))
}

// Valid reports whether p is a known phase.
func (p Phase) Valid() bool { return p < phaseEnd }

// Limits of a graph.
const (
	MaxTensorDims   = 4
	MaxGraphTensors = 1 << 12
	MaxGraphOps     = 1 << 12
	MaxGraphScalars = 16
)

// TensorDef declares a tensor of a graph.
type TensorDef struct {
	Name      string // for messages ("blocks.0.attn.w_qkv"); need not be unique
	DType     DType
	Residency Residency
	// Addr is, for a bound tensor (Residency.Bound), its first byte: any
	// multiple of its element size such that all its bytes lie within one
	// allocation of the tenant (a model's weights may share one); 0
	// otherwise.
	Addr  uint64
	Shape []int64 `wire:"max=MaxTensorDims"` // 1 to MaxTensorDims dimensions, each at least 1
}

// OpArgKind says what an operation's argument is.
type OpArgKind uint8

// Argument kinds of an operation.
const (
	OpArgTensor OpArgKind = 1 + iota // a tensor, for a buffer parameter
	OpArgI64                         // a constant, for an i64 parameter
	OpArgF32                         // a constant, for an f32 parameter
	// OpArgScalar: Mul × scalars[Scalar] + Add, for an i64 parameter,
	// from the invocation's scalar inputs (a decode position, say).
	OpArgScalar
	opArgEnd
)

// OpArg is one argument of an operation.
//
//vgpu:wire custom min=5
type OpArg struct {
	Kind   OpArgKind
	Tensor uint32 // OpArgTensor
	I64    int64  // OpArgI64; the Add of OpArgScalar
	F32    float32
	Scalar uint32 // OpArgScalar
	Mul    int64  // OpArgScalar
}

// OpDef is one operation: a catalog kernel, its arguments in the order of
// its parameters, and its phase.
type OpDef struct {
	Kernel string
	Phase  Phase
	Args   []OpArg
}

// GraphDef is what a tenant registers (OpGraphRegister → Graph). Its
// decoder checks only what the wire form itself needs (lengths, the kinds
// of arguments, the count of dimensions, of scalars, of tensors and of
// operations); the mediator checks the rest (CheckGraph).
//
//vgpu:wire
type GraphDef struct {
	Name    string
	Scalars []string    `wire:"max=MaxGraphScalars"` // names of the invocation's scalar inputs
	Tensors []TensorDef `wire:"max=MaxGraphTensors"`
	Ops     []OpDef     `wire:"max=MaxGraphOps"` // in the order they run
}

// An OpArg's fields on the wire depend on its kind; an unknown kind is
// refused, since what follows it cannot be read.
func (a *OpArg) marshalWire(e *wire.Encoder) {
	e.U8(uint8(a.Kind))
	switch a.Kind {
	case OpArgTensor:
		e.U32(a.Tensor)
	case OpArgF32:
		e.F32(a.F32)
	case OpArgScalar:
		e.U32(a.Scalar)
		e.I64(a.Mul)
		e.I64(a.I64)
	default:
		e.I64(a.I64)
	}
}

func (a *OpArg) unmarshalWire(d *wire.Decoder) {
	*a = OpArg{Kind: OpArgKind(d.U8())}
	switch a.Kind {
	case OpArgTensor:
		a.Tensor = d.U32()
	case OpArgF32:
		a.F32 = d.F32()
	case OpArgScalar:
		a.Scalar = d.U32()
		a.Mul = d.I64()
		a.I64 = d.I64()
	case OpArgI64:
		a.I64 = d.I64()
	default:
		d.Fail("operation argument kind %d", a.Kind)
	}
}

// GraphInvoke runs a registered graph (OpGraphInvoke). Inputs holds the
// bytes of the graph's input tensors, in the order of GraphDef.Tensors,
// each exactly its size; the reply holds the bytes of its output tensors
// the same way.
//
//vgpu:wire
type GraphInvoke struct {
	Graph   uint32
	Scalars []int64 `wire:"max=MaxGraphScalars"` // one per GraphDef.Scalars
	Inputs  []byte  `wire:"rest"`
}

// NodeGraph is a graph's launches as a node runs them (OpNodeGraphRegister
// → Graph): every buffer argument already translated to the extents of the
// connection's frames, and every argument that comes from the invocation's
// scalars saying which (NodeGraphArg.Scalar ≥ 0). The node keeps it until
// OpNodeGraphFree or the connection's end.
//
//vgpu:wire
type NodeGraph struct {
	Device   uint32
	Launches []NodeGraphLaunch `wire:"max=MaxGraphOps"`
}

// NodeGraphLaunch is one launch of a NodeGraph.
type NodeGraphLaunch struct {
	Kernel string
	Phase  Phase
	Args   []NodeGraphArg
}

// NodeGraphArg is a NodeArg whose i64 value may come from the run's
// scalars: Mul × scalars[Scalar] + Add when Scalar ≥ 0, Bits otherwise.
//
//vgpu:wire custom min=5
type NodeGraphArg struct {
	NodeArg
	Scalar   int32
	Mul, Add int64
}

// A NodeGraphArg's fields on the wire depend on its kind and on whether it
// takes a scalar: a buffer's extents; else the bits, the scalar's index
// (-1: none) and, with a scalar, Mul and Add. A decoded buffer argument
// takes no scalar.
func (a *NodeGraphArg) marshalWire(e *wire.Encoder) {
	e.U8(uint8(a.Kind))
	if a.Kind == ArgBuffer {
		putExtents(e, a.Extents)
		return
	}
	e.U64(a.Bits)
	e.U32(uint32(a.Scalar))
	if a.Scalar >= 0 {
		e.I64(a.Mul)
		e.I64(a.Add)
	}
}

func (a *NodeGraphArg) unmarshalWire(d *wire.Decoder) {
	a.Kind = ArgKind(d.U8())
	a.Scalar = -1
	if a.Kind == ArgBuffer {
		a.Extents = getExtents(d)
		return
	}
	a.Bits = d.U64()
	a.Scalar = int32(d.U32())
	if a.Scalar >= 0 {
		a.Mul = d.I64()
		a.Add = d.I64()
	}
}

// NodeGraphRun runs a registered NodeGraph with the invocation's scalars
// (OpNodeGraphRun); answered once all its launches completed.
//
//vgpu:wire
type NodeGraphRun struct {
	Graph   uint32
	Scalars []int64 `wire:"max=MaxGraphScalars"`
}
