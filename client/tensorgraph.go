package client

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/vgpu/vgpu/api"
)

// Tensor graphs (docs/graphs.md): a model's work described once, with its
// meaning — which tensors are weights, KV caches, activations, inputs and
// outputs, and which phase each operation belongs to — registered with the
// mediator and then invoked with its inputs in one round trip.
//
// A GraphDef builds the description; RegisterGraph hands it to the
// mediator, which checks it whole and answers a TensorGraph; Invoke runs
// it. The builder checks only what the SDK itself relies on (the sizes it
// splits replies by); the mediator checks everything else and names the
// offending op, tensor or value in a typed error.
//
// (Graph, in graph.go, is another thing: a stream's commands recorded and
// replayed.)

// Tensor names a tensor of the GraphDef that declared it.
type Tensor uint32

// Scalar names a scalar input of the GraphDef that declared it: a value
// each invocation supplies (a decode position, say).
type Scalar uint32

// GraphArg is an argument of an operation: a Tensor for a buffer
// parameter; Int, a Scalar or a ScalarExpr for an i64 parameter; Float
// for an f32 parameter.
type GraphArg interface{ opArg() api.OpArg }

// Int is a constant for an i64 parameter.
type Int int64

// Float is a constant for an f32 parameter.
type Float float32

// ScalarExpr is Mul × the scalar's value + Add, for an i64 parameter.
type ScalarExpr struct {
	Scalar   Scalar
	Mul, Add int64
}

// Times is s × mul.
func (s Scalar) Times(mul int64) ScalarExpr { return ScalarExpr{s, mul, 0} }

// Plus is s + add.
func (s Scalar) Plus(add int64) ScalarExpr { return ScalarExpr{s, 1, add} }

// Plus is e + add.
func (e ScalarExpr) Plus(add int64) ScalarExpr { e.Add += add; return e }

func (t Tensor) opArg() api.OpArg { return api.OpArg{Kind: api.OpArgTensor, Tensor: uint32(t)} }
func (v Int) opArg() api.OpArg    { return api.OpArg{Kind: api.OpArgI64, I64: int64(v)} }
func (v Float) opArg() api.OpArg  { return api.OpArg{Kind: api.OpArgF32, F32: float32(v)} }
func (s Scalar) opArg() api.OpArg { return s.Times(1).opArg() }
func (e ScalarExpr) opArg() api.OpArg {
	return api.OpArg{Kind: api.OpArgScalar, Scalar: uint32(e.Scalar), Mul: e.Mul, I64: e.Add}
}

// GraphDef builds a tensor graph. Its methods record the first mistake
// they find, which RegisterGraph returns; a GraphDef is not safe for
// concurrent use.
type GraphDef struct {
	def api.GraphDef
	err error
}

// NewGraphDef starts a graph called name (for messages).
func NewGraphDef(name string) *GraphDef { return &GraphDef{def: api.GraphDef{Name: name}} }

// Scalar declares the next scalar input of every invocation.
func (b *GraphDef) Scalar(name string) Scalar {
	b.def.Scalars = append(b.def.Scalars, name)
	return Scalar(len(b.def.Scalars) - 1)
}

// Weight declares a read-only tensor at p, anywhere in a sealed allocation
// that holds all of it (uploaded once, shared by the session's graphs;
// one allocation may hold a model's weights).
func (b *GraphDef) Weight(name string, dt api.DType, p Ptr, shape ...int64) Tensor {
	return b.tensor(name, dt, api.ResWeight, p, shape)
}

// KVCache declares a tensor kept across invocations at p, anywhere in an
// allocation that holds all of it (allocated with api.HintKVCache), which
// the session's graphs may share.
func (b *GraphDef) KVCache(name string, dt api.DType, p Ptr, shape ...int64) Tensor {
	return b.tensor(name, dt, api.ResKVCache, p, shape)
}

// Input declares a tensor written from an invocation's input bytes.
func (b *GraphDef) Input(name string, dt api.DType, shape ...int64) Tensor {
	return b.tensor(name, dt, api.ResInput, 0, shape)
}

// Output declares a tensor returned in an invocation's reply.
func (b *GraphDef) Output(name string, dt api.DType, shape ...int64) Tensor {
	return b.tensor(name, dt, api.ResOutput, 0, shape)
}

// Activation declares an intermediate tensor, in the graph's arena.
func (b *GraphDef) Activation(name string, dt api.DType, shape ...int64) Tensor {
	return b.tensor(name, dt, api.ResActivation, 0, shape)
}

func (b *GraphDef) tensor(name string, dt api.DType, r api.Residency, p Ptr, shape []int64) Tensor {
	if r.Bound() && p == 0 && b.err == nil {
		b.err = fmt.Errorf("graph %q: tensor %d (%s, %v): no allocation given: %w", b.def.Name, len(b.def.Tensors), name, r, api.ErrInvalidArgument)
	}
	b.def.Tensors = append(b.def.Tensors, api.TensorDef{Name: name, DType: dt, Shape: slices.Clone(shape), Residency: r, Addr: uint64(p)})
	return Tensor(len(b.def.Tensors) - 1)
}

// Op appends an operation: kernel run with args, in the order of its
// parameters, as part of phase. Operations run in the order appended.
func (b *GraphDef) Op(phase api.Phase, kernel string, args ...GraphArg) {
	op := api.OpDef{Kernel: kernel, Phase: phase, Args: make([]api.OpArg, len(args))}
	for i, a := range args {
		op.Args[i] = a.opArg()
	}
	b.def.Ops = append(b.def.Ops, op)
}

// Def is the graph as it goes on the wire. It shares memory with b.
func (b *GraphDef) Def() *api.GraphDef { return &b.def }

// TensorBytes is the size of a tensor of dtype dt and shape: the product
// of its dimensions times the element size. A dimension below 1 or a
// product past 2^63 is an error naming the dimension.
func TensorBytes(dt api.DType, shape []int64) (uint64, error) {
	n := dt.Size()
	for i, d := range shape {
		if d < 1 {
			return 0, fmt.Errorf("dimension %d is %d, want at least 1: %w", i, d, api.ErrInvalidArgument)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > 1<<63 {
			return 0, fmt.Errorf("shape %v: %d elements of %d bytes overflow: %w", shape, d, dt.Size(), api.ErrInvalidArgument)
		}
		n = lo
	}
	return n, nil
}

// TensorGraph is a graph registered with the mediator.
type TensorGraph struct {
	c       *Client
	id      uint32
	name    string
	inputs  []graphIO // in tensor order
	outputs []graphIO
	outLen  uint64 // bytes of all outputs
}

// graphIO is an input or output tensor: its index, name and bytes.
type graphIO struct {
	tensor uint32
	name   string
	size   uint64
}

// RegisterGraph checks b and registers it with the mediator, which checks
// it whole. Work queued on streams is sent first, as for Free. The graph
// lives until Release or the session's end; while it does, the
// allocations it binds cannot be freed.
func (c *Client) RegisterGraph(b *GraphDef) (*TensorGraph, error) {
	if b.err != nil {
		return nil, b.err
	}
	g := &TensorGraph{c: c, name: b.def.Name}
	for i, t := range b.def.Tensors {
		if t.Residency != api.ResInput && t.Residency != api.ResOutput {
			continue
		}
		n, err := TensorBytes(t.DType, t.Shape)
		if err != nil {
			return nil, fmt.Errorf("graph %q: tensor %d (%s): %w", b.def.Name, i, t.Name, err)
		}
		io := graphIO{tensor: uint32(i), name: t.Name, size: n}
		if t.Residency == api.ResInput {
			g.inputs = append(g.inputs, io)
		} else {
			g.outputs = append(g.outputs, io)
			g.outLen += n
		}
	}
	c.flushAll()
	body, err := c.rpc.Call(api.OpGraphRegister, nil, api.Encode(&b.def))
	var r api.Graph
	if err == nil {
		err = api.Decode(body, &r)
	}
	if err != nil {
		return nil, fmt.Errorf("graph %q: %w", b.def.Name, err)
	}
	g.id = r.Graph
	return g, nil
}

// Invoke runs the graph with one value per declared scalar and one byte
// slice per input tensor, in the order the tensors were declared, each
// exactly the tensor's size; it returns the output tensors' bytes the
// same way. Work queued on streams is sent first. It is one round trip.
func (g *TensorGraph) Invoke(scalars []int64, inputs ...[]byte) ([][]byte, error) {
	if len(inputs) != len(g.inputs) {
		return nil, fmt.Errorf("graph %q takes %d inputs, got %d: %w", g.name, len(g.inputs), len(inputs), api.ErrInvalidArgument)
	}
	for i, in := range g.inputs {
		if uint64(len(inputs[i])) != in.size {
			return nil, fmt.Errorf("graph %q: input tensor %d (%s) holds %d bytes, got %d: %w",
				g.name, in.tensor, in.name, in.size, len(inputs[i]), api.ErrInvalidArgument)
		}
	}
	g.c.flushAll()
	parts := append([][]byte{api.Encode(&api.GraphInvoke{Graph: g.id, Scalars: scalars})}, inputs...)
	var reply []byte
	if g.outLen > 0 {
		reply = make([]byte, g.outLen)
	}
	body, err := g.c.rpc.Call(api.OpGraphInvoke, reply, parts...)
	if err == nil && reply == nil && len(body) > 0 {
		err = fmt.Errorf("%d bytes of outputs, want none: %w", len(body), api.ErrProtocol)
	}
	if err != nil {
		return nil, fmt.Errorf("graph %q: %w", g.name, err)
	}
	out := make([][]byte, len(g.outputs))
	for i, o := range g.outputs {
		out[i], reply = reply[:o.size:o.size], reply[o.size:]
	}
	return out, nil
}

// Release drops the graph once work already queued is done; the
// allocations it bound may then be freed.
func (g *TensorGraph) Release() error {
	g.c.flushAll()
	if _, err := g.c.rpc.Call(api.OpGraphRelease, nil, api.Encode(&api.Graph{Graph: g.id})); err != nil {
		return fmt.Errorf("graph %q: %w", g.name, err)
	}
	return nil
}
