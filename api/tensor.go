package api

import "fmt"

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
	Shape     []int64 // 1 to MaxTensorDims dimensions, each at least 1
	Residency Residency
	// Addr is, for a bound tensor (Residency.Bound), its first byte: any
	// multiple of its element size such that all its bytes lie within one
	// allocation of the tenant (a model's weights may share one); 0
	// otherwise.
	Addr uint64
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

// GraphDef is what a tenant registers (OpGraphRegister → Graph).
type GraphDef struct {
	Name    string
	Scalars []string // names of the invocation's scalar inputs
	Tensors []TensorDef
	Ops     []OpDef // in the order they run
}

func (m *GraphDef) Marshal(e *Encoder) {
	e.String(m.Name)
	e.U32(uint32(len(m.Scalars)))
	for _, s := range m.Scalars {
		e.String(s)
	}
	e.U32(uint32(len(m.Tensors)))
	for _, t := range m.Tensors {
		e.String(t.Name)
		e.U8(uint8(t.DType))
		e.U8(uint8(t.Residency))
		e.U64(t.Addr)
		e.U32(uint32(len(t.Shape)))
		for _, d := range t.Shape {
			e.I64(d)
		}
	}
	e.U32(uint32(len(m.Ops)))
	for _, op := range m.Ops {
		e.String(op.Kernel)
		e.U8(uint8(op.Phase))
		e.U32(uint32(len(op.Args)))
		for _, a := range op.Args {
			putOpArg(e, a)
		}
	}
}

func putOpArg(e *Encoder, a OpArg) {
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

// Unmarshal decodes a graph, checking only what the wire form itself needs
// (lengths, the kinds of arguments, the count of dimensions, of scalars, of
// tensors and of operations); the mediator checks the rest (CheckGraph).
func (m *GraphDef) Unmarshal(d *Decoder) {
	m.Name = d.Str()
	m.Scalars = make([]string, d.Len(4))
	if len(m.Scalars) > MaxGraphScalars {
		d.fail("graph has %d scalars, at most %d", len(m.Scalars), MaxGraphScalars)
		return
	}
	for i := range m.Scalars {
		m.Scalars[i] = d.Str()
	}
	m.Tensors = make([]TensorDef, d.Len(4+1+1+8+4))
	if len(m.Tensors) > MaxGraphTensors {
		d.fail("graph has %d tensors, at most %d", len(m.Tensors), MaxGraphTensors)
		return
	}
	for i := range m.Tensors {
		t := &m.Tensors[i]
		t.Name = d.Str()
		t.DType = DType(d.U8())
		t.Residency = Residency(d.U8())
		t.Addr = d.U64()
		t.Shape = make([]int64, d.Len(8))
		if len(t.Shape) > MaxTensorDims {
			d.fail("tensor %d has %d dimensions, at most %d", i, len(t.Shape), MaxTensorDims)
			return
		}
		for j := range t.Shape {
			t.Shape[j] = d.I64()
		}
	}
	m.Ops = make([]OpDef, d.Len(4+1+4))
	if len(m.Ops) > MaxGraphOps {
		d.fail("graph has %d operations, at most %d", len(m.Ops), MaxGraphOps)
		return
	}
	for i := range m.Ops {
		op := &m.Ops[i]
		op.Kernel = d.Str()
		op.Phase = Phase(d.U8())
		op.Args = make([]OpArg, d.Len(5))
		for j := range op.Args {
			op.Args[j] = getOpArg(d)
			if d.err != nil {
				return
			}
		}
	}
}

func getOpArg(d *Decoder) OpArg {
	a := OpArg{Kind: OpArgKind(d.U8())}
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
		d.fail("operation argument kind %d", a.Kind)
	}
	return a
}

// GraphInvoke runs a registered graph (OpGraphInvoke). Inputs holds the
// bytes of the graph's input tensors, in the order of GraphDef.Tensors,
// each exactly its size; the reply holds the bytes of its output tensors
// the same way.
type GraphInvoke struct {
	Graph   uint32
	Scalars []int64 // one per GraphDef.Scalars
	Inputs  []byte
}

func (m *GraphInvoke) Marshal(e *Encoder) {
	e.U32(m.Graph)
	e.U32(uint32(len(m.Scalars)))
	for _, s := range m.Scalars {
		e.I64(s)
	}
	e.B = append(e.B, m.Inputs...)
}

func (m *GraphInvoke) Unmarshal(d *Decoder) {
	m.Graph = d.U32()
	m.Scalars = make([]int64, d.Len(8))
	if len(m.Scalars) > MaxGraphScalars {
		d.fail("invocation has %d scalars, at most %d", len(m.Scalars), MaxGraphScalars)
		return
	}
	for i := range m.Scalars {
		m.Scalars[i] = d.I64()
	}
	m.Inputs = d.Rest()
}

// NodeGraph is a graph's launches as a node runs them (OpNodeGraphRegister
// → Graph): every buffer argument already translated to the extents of the
// connection's frames, and every argument that comes from the invocation's
// scalars saying which (NodeGraphArg.Scalar ≥ 0). The node keeps it until
// OpNodeGraphFree or the connection's end.
type NodeGraph struct {
	Device   uint32
	Launches []NodeGraphLaunch
}

// NodeGraphLaunch is one launch of a NodeGraph.
type NodeGraphLaunch struct {
	Kernel string
	Phase  Phase
	Args   []NodeGraphArg
}

// NodeGraphArg is a NodeArg whose i64 value may come from the run's
// scalars: Mul × scalars[Scalar] + Add when Scalar ≥ 0, Bits otherwise.
type NodeGraphArg struct {
	NodeArg
	Scalar   int32
	Mul, Add int64
}

func (m *NodeGraph) Marshal(e *Encoder) {
	e.U32(m.Device)
	e.U32(uint32(len(m.Launches)))
	for _, l := range m.Launches {
		e.String(l.Kernel)
		e.U8(uint8(l.Phase))
		e.U32(uint32(len(l.Args)))
		for _, a := range l.Args {
			e.U8(uint8(a.Kind))
			if a.Kind == ArgBuffer {
				putExtents(e, a.Extents)
				continue
			}
			e.U64(a.Bits)
			e.U32(uint32(a.Scalar))
			if a.Scalar >= 0 {
				e.I64(a.Mul)
				e.I64(a.Add)
			}
		}
	}
}

func (m *NodeGraph) Unmarshal(d *Decoder) {
	m.Device = d.U32()
	m.Launches = make([]NodeGraphLaunch, d.Len(4+1+4))
	if len(m.Launches) > MaxGraphOps {
		d.fail("node graph has %d launches, at most %d", len(m.Launches), MaxGraphOps)
		return
	}
	for i := range m.Launches {
		l := &m.Launches[i]
		l.Kernel = d.Str()
		l.Phase = Phase(d.U8())
		l.Args = make([]NodeGraphArg, d.Len(5))
		for j := range l.Args {
			a := &l.Args[j]
			a.Kind = ArgKind(d.U8())
			a.Scalar = -1
			if a.Kind == ArgBuffer {
				a.Extents = getExtents(d)
				continue
			}
			a.Bits = d.U64()
			a.Scalar = int32(d.U32())
			if a.Scalar >= 0 {
				a.Mul = d.I64()
				a.Add = d.I64()
			}
		}
		if d.err != nil {
			return
		}
	}
}

// NodeGraphRun runs a registered NodeGraph with the invocation's scalars
// (OpNodeGraphRun); answered once all its launches completed.
type NodeGraphRun struct {
	Graph   uint32
	Scalars []int64
}

func (m *NodeGraphRun) Marshal(e *Encoder) {
	e.U32(m.Graph)
	e.U32(uint32(len(m.Scalars)))
	for _, s := range m.Scalars {
		e.I64(s)
	}
}

func (m *NodeGraphRun) Unmarshal(d *Decoder) {
	m.Graph = d.U32()
	m.Scalars = make([]int64, d.Len(8))
	if len(m.Scalars) > MaxGraphScalars {
		d.fail("run has %d scalars, at most %d", len(m.Scalars), MaxGraphScalars)
		return
	}
	for i := range m.Scalars {
		m.Scalars[i] = d.I64()
	}
}
