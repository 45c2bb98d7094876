package api

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// CheckGraph checks everything about a graph that needs no memory: its
// tensors' element types, residencies, shapes and sizes; every operation's
// kernel, phase and arguments against the kernel's signature in catalog
// (docs/graphs.md); and the order in which the operations produce and read
// tensors. It is pure, so a mediator (and a tenant's SDK, before it sends
// a graph) can run it on untrusted graphs; what it returns is what laying
// the graph out in memory needs.
//
// Rules beyond the signature's kinds and element types:
//   - A buffer parameter's extent (the product of its Dims) must be given
//     by constant arguments and equal its tensor's element count exactly:
//     a tensor's shape is fixed at registration, and a graph's launches
//     keep the translation of each tensor's bytes (NodeGraph), so a
//     dimension taken from a scalar input is refused. Scalars may feed
//     every other i64 parameter (a position, an offset).
//   - Operations run in the order given. A tensor that an operation reads
//     must be an input, a weight or a KV cache, or have been written by an
//     earlier operation: an activation or output read first would hold the
//     previous invocation's bytes. Since the order given is the order run,
//     a cycle (op A reads what op B writes, and B what A writes) is always
//     a read before the write that feeds it, and is refused as such.
//   - Weights are read-only: an operation that writes one is refused.
//   - Every output is written by some operation.
//
// Errors wrap ErrUnknownKernel for a kernel missing from catalog and
// ErrInvalidArgument otherwise, naming the operation (index and kernel),
// the parameter, the tensor (index and name) and the values.
func CheckGraph(g *GraphDef, catalog map[string]KernelInfo) (*CheckedGraph, error) {
	switch {
	case len(g.Scalars) > MaxGraphScalars:
		return nil, fmt.Errorf("graph %q has %d scalars, at most %d: %w", g.Name, len(g.Scalars), MaxGraphScalars, ErrInvalidArgument)
	case len(g.Tensors) > MaxGraphTensors:
		return nil, fmt.Errorf("graph %q has %d tensors, at most %d: %w", g.Name, len(g.Tensors), MaxGraphTensors, ErrInvalidArgument)
	case len(g.Ops) > MaxGraphOps:
		return nil, fmt.Errorf("graph %q has %d operations, at most %d: %w", g.Name, len(g.Ops), MaxGraphOps, ErrInvalidArgument)
	}
	c := &CheckedGraph{
		Bytes: make([]uint64, len(g.Tensors)),
		First: make([]int, len(g.Tensors)),
		Last:  make([]int, len(g.Tensors)),
	}
	for i := range g.Tensors {
		n, err := checkTensor(i, &g.Tensors[i])
		if err != nil {
			return nil, err
		}
		c.Bytes[i], c.First[i], c.Last[i] = n, -1, -1
	}
	written := make([]bool, len(g.Tensors))
	for j := range g.Ops {
		if err := c.checkOp(g, j, catalog, written); err != nil {
			return nil, err
		}
	}
	for i, t := range g.Tensors {
		if t.Residency == ResOutput && !written[i] {
			return nil, fmt.Errorf("output tensor %d %q is never written by an operation: %w", i, t.Name, ErrInvalidArgument)
		}
	}
	return c, nil
}

// CheckedGraph is what CheckGraph learns of a valid graph.
type CheckedGraph struct {
	// Bytes is each tensor's size: its element count times its element
	// size, which CheckGraph has checked does not overflow.
	Bytes []uint64
	// First and Last are, for each tensor, the index of the first and of
	// the last operation that uses it; -1 for a tensor no operation uses.
	First, Last []int
}

// TensorName names tensor i of g for messages: its index and name.
func (g *GraphDef) TensorName(i int) string {
	return fmt.Sprintf("tensor %d %q", i, g.Tensors[i].Name)
}

// checkTensor checks tensor i and returns its size in bytes.
func checkTensor(i int, t *TensorDef) (uint64, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("tensor %d %q: "+format+": %w", append(append([]any{i, t.Name}, args...), ErrInvalidArgument)...)
	}
	switch {
	case !t.DType.Valid():
		return 0, bad("element type %v is not one of f32, i32", t.DType)
	case !t.Residency.Valid():
		return 0, bad("residency %v is not one of weight, activation, kv-cache, input, output", t.Residency)
	case len(t.Shape) == 0 || len(t.Shape) > MaxTensorDims:
		return 0, bad("shape %v has %d dimensions, want 1 to %d", t.Shape, len(t.Shape), MaxTensorDims)
	case t.Residency.Bound() && t.Addr == 0:
		return 0, bad("a %v tensor lives in an allocation of the tenant, but its address is 0", t.Residency)
	case t.Residency.Bound() && t.Addr%t.DType.Size() != 0:
		// Kernels read elements whole; a tensor may start anywhere in its
		// allocation (a model's weights packed in one) but on an element.
		return 0, bad("address %#x is not a multiple of its %v elements' %d bytes", t.Addr, t.DType, t.DType.Size())
	case !t.Residency.Bound() && t.Addr != 0:
		return 0, bad("a %v tensor lives in the graph's arena, but it names address %#x", t.Residency, t.Addr)
	}
	n := t.DType.Size()
	for d, dim := range t.Shape {
		if dim < 1 {
			return 0, bad("dimension %d of shape %v is %d, want at least 1", d, t.Shape, dim)
		}
		hi, lo := bits.Mul64(n, uint64(dim))
		if hi != 0 {
			return 0, bad("shape %v of %v holds more than 2^64 bytes", t.Shape, t.DType)
		}
		n = lo
	}
	return n, nil
}

// checkOp checks operation j of g, notes which tensors it uses, and marks
// those it writes in written, which says what earlier operations wrote.
func (c *CheckedGraph) checkOp(g *GraphDef, j int, catalog map[string]KernelInfo, written []bool) error {
	op := &g.Ops[j]
	k, ok := catalog[op.Kernel]
	if !ok {
		return fmt.Errorf("op %d: kernel %q is not in the catalog: %w", j, op.Kernel, ErrUnknownKernel)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("op %d (%s): "+format+": %w", append(append([]any{j, op.Kernel}, args...), ErrInvalidArgument)...)
	}
	if !op.Phase.Valid() {
		return bad("phase %v is not one of other, prefill, decode, forward, backward", op.Phase)
	}
	if len(op.Args) != len(k.Params) {
		names := make([]string, len(k.Params))
		for i, p := range k.Params {
			names[i] = p.Name
		}
		return bad("takes %d arguments (%s), %d given", len(k.Params), strings.Join(names, ", "), len(op.Args))
	}
	var writes []uint32
	for i, p := range k.Params {
		a := &op.Args[i]
		switch p.Kind {
		case ArgBuffer:
			if a.Kind != OpArgTensor {
				return bad("parameter %d (%s) takes a tensor, %v given", i, p.Name, a.Kind)
			}
			if err := c.checkTensorArg(g, j, &k, i, written); err != nil {
				return err
			}
			if p.Access == AccessWrite || p.Access == AccessReadWrite {
				writes = append(writes, a.Tensor)
			}
		case ArgI64:
			switch {
			case a.Kind == OpArgScalar && int(a.Scalar) >= len(g.Scalars):
				return bad("parameter %d (%s) takes scalar %d, the graph has %d", i, p.Name, a.Scalar, len(g.Scalars))
			case a.Kind != OpArgI64 && a.Kind != OpArgScalar:
				return bad("parameter %d (%s) takes an i64 constant or scalar, %v given", i, p.Name, a.Kind)
			}
		case ArgF32:
			if a.Kind != OpArgF32 {
				return bad("parameter %d (%s) takes an f32 constant, %v given", i, p.Name, a.Kind)
			}
		default:
			return bad("parameter %d (%s) is of kind %v, which graphs do not know", i, p.Name, p.Kind)
		}
	}
	// Reads were checked against what earlier operations wrote; what this
	// one writes counts from the next.
	for _, t := range writes {
		if g.Tensors[t].Residency == ResWeight {
			return bad("writes %s, a weight: weights are read-only", g.TensorName(int(t)))
		}
		written[t] = true
	}
	return nil
}

// checkTensorArg checks the tensor given for buffer parameter i of op j,
// whose kernel is k: its index, element type and element count, and, if
// the parameter reads it, that it is there to read.
func (c *CheckedGraph) checkTensorArg(g *GraphDef, j int, k *KernelInfo, i int, written []bool) error {
	op, p, a := &g.Ops[j], &k.Params[i], &g.Ops[j].Args[i]
	bad := func(format string, args ...any) error {
		return fmt.Errorf("op %d (%s) parameter %d (%s): "+format+": %w", append(append([]any{j, op.Kernel, i, p.Name}, args...), ErrInvalidArgument)...)
	}
	if int(a.Tensor) >= len(g.Tensors) {
		return bad("tensor %d, the graph has %d", a.Tensor, len(g.Tensors))
	}
	t := &g.Tensors[a.Tensor]
	name := g.TensorName(int(a.Tensor))
	want := p.DType
	if want == 0 {
		want = DTypeF32
	}
	if t.DType != want {
		return bad("%s is %v, the kernel takes %v", name, t.DType, want)
	}
	if p.Elem == 0 {
		return bad("the kernel declares no extent for it, which a graph needs")
	}
	// The extent: Elem times the constant arguments its Dims name.
	n := uint64(p.Elem)
	for _, dim := range p.Dims {
		d := slices.IndexFunc(k.Params, func(q Param) bool { return q.Name == dim && q.Kind == ArgI64 })
		if d < 0 {
			return bad("its extent names %q, which is no i64 parameter of the kernel", dim)
		}
		v := op.Args[d]
		switch v.Kind {
		case OpArgI64:
		case OpArgScalar:
			return bad("its extent takes %s (parameter %d) from a scalar input; a tensor's size is fixed, so dimensions must be constants", dim, d)
		default:
			return bad("its extent takes %s from parameter %d, given %v rather than an i64 constant", dim, d, v.Kind)
		}
		if v.I64 < 0 {
			return bad("its extent takes %s = %d (parameter %d), which is negative", dim, v.I64, d)
		}
		hi, lo := bits.Mul64(n, uint64(v.I64))
		if hi != 0 {
			return bad("its extent %s overflows", extentFormula(p.Dims))
		}
		n = lo
	}
	if size := t.DType.Size(); n != c.Bytes[a.Tensor] {
		return bad("%s holds %d elements, the kernel's extent %s is %d elements", name, c.Bytes[a.Tensor]/size, extentFormula(p.Dims), n/size)
	}
	if (p.Access == AccessRead || p.Access == AccessReadWrite) && !written[a.Tensor] {
		switch t.Residency {
		case ResInput, ResWeight, ResKVCache:
		default:
			return bad("reads %s (residency %v) before any earlier op writes it: it is used before it is produced (ops run in the order given; a cycle shows up as this)", name, t.Residency)
		}
	}
	if c.First[a.Tensor] < 0 {
		c.First[a.Tensor] = j
	}
	c.Last[a.Tensor] = j
	return nil
}

var opArgNames = [...]string{OpArgTensor: "a tensor", OpArgI64: "an i64 constant", OpArgF32: "an f32 constant", OpArgScalar: "a scalar input"}

func (k OpArgKind) String() string {
	if k > 0 && k < opArgEnd {
		return opArgNames[k]
	}
	return fmt.Sprintf("argument kind %d", uint8(k))
}

// extentFormula writes an extent's dimensions as docs/graphs.md does.
func extentFormula(dims []string) string {
	if len(dims) == 0 {
		return "1"
	}
	return strings.Join(dims, "·")
}
