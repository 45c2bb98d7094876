// Package kernels is the kernel catalog of the simulated accelerator: the
// kernels a node can launch, their signatures, and CPU implementations that
// run over the real bytes of device memory.
//
// A launch arrives as a kernel name and its materialised arguments (Value):
// scalars, and for each buffer the bytes from the address the tenant passed
// to the end of its allocation. Kernel.Run checks the arguments against the
// signature, then runs the kernel; Kernel.Plan checks them the same way and
// returns the launch cut into slices of bounded work (plan.go), which a
// scheduler interleaves with other tenants' slices.
//
// Invariants:
//   - Every check happens before the first byte is written: argument count
//     and kinds, sizes, overflow of the extents they imply, buffer lengths,
//     alignment, overlap of outputs with inputs, and the contents of index
//     buffers. A rejected launch leaves memory as it was and returns an error
//     that wraps api.ErrInvalidArgument (Lookup: api.ErrUnknownKernel) and
//     names the kernel, the parameter and the values.
//   - A kernel touches only the prefix of each buffer that its size
//     arguments imply; the rest of the allocation is neither read nor written.
//   - Data is little-endian float32 (int32 for indices), 4-byte aligned, as
//     on a GPU; every buffer parameter says which (api.Param.DType). Byte
//     slices become typed views only in view_unsafe.go, the package's only
//     unsafe code, and only after length and alignment checks.
//   - Results are deterministic and independent of GOMAXPROCS and of the
//     platform: each kernel's Doc states its summation order and rounding,
//     with no fused multiply-add, and the exponential and erf the kernels
//     take are computed the same way everywhere (fmath.go), so tenants can
//     check results against a reference bit for bit.
//   - Kernels that split work across goroutines (Kernel.Parallel: sgemm,
//     matmul, embedding_bag_sum, softmax, layer_norm, rms_norm, attention)
//     reject outputs that overlap their inputs, since the result would then
//     depend on scheduling; so do the serial kernels that would read an
//     element after writing it (the layout kernels, embedding, argmax).
//     Elementwise kernels (add, mul, relu, gelu, silu) may run exactly in
//     place, out the same elements as an input, and reject any other
//     overlap. A panic in a worker goroutine becomes an error wrapping
//     api.ErrInternal rather than taking down the node, which serves every
//     tenant.
//   - The catalog is built once at package initialisation and never changes;
//     a *Kernel is shared and safe for concurrent use.
//
// Tenants race with themselves: if another launch writes a kernel's inputs
// while it runs, the results are undefined, but the kernel still neither
// panics nor touches memory outside its arguments.
package kernels

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vgpu/vgpu/api"
)

// Value is one materialised kernel argument.
type Value struct {
	Kind api.ArgKind // api.ArgBuffer, api.ArgI64 or api.ArgF32
	I64  int64
	F32  float32
	// Buf, for api.ArgBuffer, holds the bytes the kernel may touch: from the
	// address the tenant passed to the end of its allocation.
	Buf []byte
}

// Scalar is node argument a as a Value: its scalar decoded, or for a
// buffer only the kind, whose bytes the device backend materialises.
func Scalar(a api.NodeArg) Value {
	v := Value{Kind: a.Kind}
	switch a.Kind {
	case api.ArgI64:
		v.I64 = int64(a.Bits)
	case api.ArgF32:
		v.F32 = api.F32FromBits(a.Bits)
	}
	return v
}

// Kernel is an entry of the catalog: a signature and its implementation.
// Kernels are shared by all callers and must not be modified.
type Kernel struct {
	Info api.KernelInfo
	// plan checks arguments whose count and kinds match Info.Params
	// (sizes, buffers) and returns the launch in slices of about maxWork
	// (≥ 1) element operations; it writes nothing.
	plan func(args []Value, maxWork int) (*Plan, error)
	// serial says its slices run on one goroutine whatever Plan.SetWorkers
	// allows, so a slice of maxWork takes as long as maxWork on one core.
	serial bool
}

// Parallel says whether a slice of k spreads over the workers its Plan is
// given (Plan.SetWorkers), so that a caller may size its slices' work to
// them: a serial kernel's slice of that work would take as many times
// longer.
func (k *Kernel) Parallel() bool { return !k.serial }

// all lists the catalog; catalog and sorted are indexes over it.
var all = []*Kernel{
	embeddingBagSum, fillF32, reduceSumF32, saxpy, sgemm,
	// For models (docs/graphs.md).
	matmul, add, mul, relu, gelu, silu, softmax, layerNorm, rmsNorm, embedding,
	permute, slice, concat, kvAppend, attention, argmax,
}

var catalog = func() map[string]*Kernel {
	m := make(map[string]*Kernel, len(all))
	for _, k := range all {
		m[k.Info.Name] = k
	}
	return m
}()

var sorted = func() []api.KernelInfo {
	infos := make([]api.KernelInfo, len(all))
	for i, k := range all {
		infos[i] = k.Info
	}
	slices.SortFunc(infos, func(a, b api.KernelInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos
}()

// Lookup returns the kernel called name.
func Lookup(name string) (*Kernel, error) {
	if k, ok := catalog[name]; ok {
		return k, nil
	}
	return nil, fmt.Errorf("kernel %q: %w", name, api.ErrUnknownKernel)
}

// Catalog describes every kernel, sorted by name. The result is the
// caller's to keep or modify.
func Catalog() []api.KernelInfo {
	out := make([]api.KernelInfo, len(sorted))
	for i, info := range sorted {
		out[i] = info
		out[i].Params = slices.Clone(info.Params)
	}
	return out
}

// CheckKinds checks the number and kinds of arguments against k's signature,
// so a node can reject a launch before it materialises any buffer.
func (k *Kernel) CheckKinds(kinds []api.ArgKind) error {
	return k.checkKinds(len(kinds), func(i int) api.ArgKind { return kinds[i] })
}

// Run checks args against k's signature and the sizes they imply, then runs
// the kernel. It writes nothing unless every check passes.
func (k *Kernel) Run(args []Value) error {
	p, err := k.Plan(args, unbounded)
	if err != nil {
		return err
	}
	for more := p.Len() > 0; more; {
		if more, err = p.Step(); err != nil {
			return err
		}
	}
	return nil
}

func (k *Kernel) checkKinds(n int, kind func(i int) api.ArgKind) error {
	ps := k.Info.Params
	if n != len(ps) {
		names := make([]string, len(ps))
		for i, p := range ps {
			names[i] = p.Name
		}
		return fmt.Errorf("%s takes %d arguments (%s), got %d: %w",
			k.Info.Name, len(ps), strings.Join(names, ", "), n, api.ErrInvalidArgument)
	}
	for i, p := range ps {
		if got := kind(i); got != p.Kind {
			return fmt.Errorf("%s: argument %d (%s) is %v, want %v: %w",
				k.Info.Name, i, p.Name, got, p.Kind, api.ErrInvalidArgument)
		}
	}
	return nil
}

// Signature helpers, so each kernel's parameter list reads like its C
// prototype.

// bufParam is a float32 buffer of which the kernel touches elem bytes times
// the product of the scalar parameters dims: the extent a mediator needs
// resident.
func bufParam(name string, access api.Access, elem uint8, dims ...string) api.Param {
	return api.Param{Name: name, Kind: api.ArgBuffer, Access: access, Elem: elem, Dims: dims, DType: api.DTypeF32}
}

// i32Param is bufParam for a buffer of int32 indices (token ids, rows of a
// table), which a graph must bind to an i32 tensor.
func i32Param(name string, access api.Access, dims ...string) api.Param {
	return api.Param{Name: name, Kind: api.ArgBuffer, Access: access, Elem: elemSize, Dims: dims, DType: api.DTypeI32}
}

func i64Param(name string) api.Param {
	return api.Param{Name: name, Kind: api.ArgI64, Access: api.AccessNone}
}

func f32Param(name string) api.Param {
	return api.Param{Name: name, Kind: api.ArgF32, Access: api.AccessNone}
}
