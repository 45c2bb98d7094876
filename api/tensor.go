package api

import (
	"fmt"
)

// The words of tensor graphs that the tenant's (tenant_graph.go) and the
// node's (node_graph.go) messages share: element types, residencies,
// phases, and the limits of a graph.

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
