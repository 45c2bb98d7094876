package models

import (
	"errors"
	"fmt"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// OpByOp runs a GraphDef without registering it: every operation is a
// stream launch of the same kernel with the same arguments, and every
// tensor that is not bound (activations, inputs, outputs) an ordinary
// allocation of its own, without hints. It is what driver-level remoting
// can do with a model: the mediator sees anonymous buffers and launches.
// An invocation copies the inputs in, queues the launches, copies the
// outputs back and synchronizes: the launches travel batched, and the
// outputs' copies need a reply each (client.Stream).
type OpByOp struct {
	c      *client.Client
	s      *client.Stream
	def    *api.GraphDef
	ptrs   []client.Ptr // per tensor: its address
	bytes  []uint64     // per tensor: its size
	owned  []client.Ptr // what NewOpByOp allocated, to free
	ins    []int        // input tensors, in order
	outs   []int        // output tensors, in order
	launch [][]client.Arg
}

// NewOpByOp allocates b's unbound tensors on device 0 of c and prepares
// its launches on the default stream. Arguments taken from scalars are
// filled in by each invocation.
func NewOpByOp(c *client.Client, b *client.GraphDef) (*OpByOp, error) {
	def := b.Def()
	o := &OpByOp{c: c, s: c.Stream(), def: def, ptrs: make([]client.Ptr, len(def.Tensors)), bytes: make([]uint64, len(def.Tensors))}
	for i, t := range def.Tensors {
		n, err := client.TensorBytes(t.DType, t.Shape)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%s: %w", def.TensorName(i), err), o.Release())
		}
		o.bytes[i] = n
		switch t.Residency {
		case api.ResWeight, api.ResKVCache:
			o.ptrs[i] = client.Ptr(t.Addr)
			continue
		case api.ResInput:
			o.ins = append(o.ins, i)
		case api.ResOutput:
			o.outs = append(o.outs, i)
		}
		if o.ptrs[i], err = c.Malloc(0, n); err != nil {
			return nil, errors.Join(fmt.Errorf("%s: %w", def.TensorName(i), err), o.Release())
		}
		o.owned = append(o.owned, o.ptrs[i])
	}
	o.launch = make([][]client.Arg, len(def.Ops))
	for j, op := range def.Ops {
		o.launch[j] = make([]client.Arg, len(op.Args))
		for i, a := range op.Args {
			switch a.Kind {
			case api.OpArgTensor:
				if int(a.Tensor) >= len(o.ptrs) {
					return nil, errors.Join(fmt.Errorf("op %d (%s) argument %d: tensor %d, the graph has %d: %w",
						j, op.Kernel, i, a.Tensor, len(o.ptrs), api.ErrInvalidArgument), o.Release())
				}
				o.launch[j][i] = client.Buf(o.ptrs[a.Tensor])
			case api.OpArgI64:
				o.launch[j][i] = client.I64(a.I64)
			case api.OpArgF32:
				o.launch[j][i] = client.F32(a.F32)
			}
		}
	}
	return o, nil
}

// Invoke runs the operations with scalars and inputs as
// client.TensorGraph.Invoke does, and returns the outputs the same way.
func (o *OpByOp) Invoke(scalars []int64, inputs ...[]byte) ([][]byte, error) {
	if len(scalars) != len(o.def.Scalars) {
		return nil, fmt.Errorf("graph %q takes %d scalars, got %d: %w", o.def.Name, len(o.def.Scalars), len(scalars), api.ErrInvalidArgument)
	}
	if len(inputs) != len(o.ins) {
		return nil, fmt.Errorf("graph %q takes %d inputs, got %d: %w", o.def.Name, len(o.ins), len(inputs), api.ErrInvalidArgument)
	}
	for k, i := range o.ins {
		if uint64(len(inputs[k])) != o.bytes[i] {
			return nil, fmt.Errorf("graph %q: input %s holds %d bytes, got %d: %w", o.def.Name, o.def.TensorName(i), o.bytes[i], len(inputs[k]), api.ErrInvalidArgument)
		}
		o.s.CopyToDevice(o.ptrs[i], inputs[k])
	}
	for j, op := range o.def.Ops {
		args := o.launch[j]
		for i, a := range op.Args {
			if a.Kind == api.OpArgScalar {
				if int(a.Scalar) >= len(scalars) {
					return nil, fmt.Errorf("op %d (%s) argument %d: scalar %d, the graph has %d: %w", j, op.Kernel, i, a.Scalar, len(scalars), api.ErrInvalidArgument)
				}
				args[i] = client.I64(a.Mul*scalars[a.Scalar] + a.I64)
			}
		}
		o.s.Launch(op.Kernel, args...)
	}
	out := make([][]byte, len(o.outs))
	for k, i := range o.outs {
		out[k] = make([]byte, o.bytes[i])
		o.s.CopyFromDevice(out[k], o.ptrs[i])
	}
	if err := o.s.Synchronize(); err != nil {
		return nil, fmt.Errorf("graph %q, op by op: %w", o.def.Name, err)
	}
	return out, nil
}

// Release frees what NewOpByOp allocated.
func (o *OpByOp) Release() error {
	var errs []error
	for _, p := range o.owned {
		errs = append(errs, o.c.Free(p))
	}
	o.owned = nil
	return errors.Join(errs...)
}
