package api

import (
	"github.com/vgpu/vgpu/api/wire"
)

// The node's tensor graphs: a GraphDef as the mediator registers it with
// the node that holds its tensors (tenant_graph.go has the tenant's side).

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
