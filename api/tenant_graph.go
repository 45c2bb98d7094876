package api

import (
	"github.com/vgpu/vgpu/api/wire"
)

// The tenant's tensor graphs: a model's work registered once, with its
// meaning — which tensors are weights, activations, KV caches, inputs and
// outputs, which phase each operation belongs to — and then invoked with
// its inputs in one round trip (docs/graphs.md). A tenant registers a
// GraphDef with the mediator (OpGraphRegister); the mediator checks it
// whole (CheckGraph), lays out its tensors and registers its launches with
// the node that holds them as a NodeGraph (node_graph.go), which each
// invocation (OpGraphInvoke) runs with its scalars.
//
// Tensors are named by their index in GraphDef.Tensors, scalars by their
// index in GraphDef.Scalars.

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
