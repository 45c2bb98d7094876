package mediator_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/mediator"
)

// tenantOps are the operations a tenant may send after its hello.
var tenantOps = []wire.Op{
	api.OpMalloc, api.OpFree, api.OpStreamCreate, api.OpStreamDestroy,
	api.OpCopyToDevice, api.OpCopyFromDevice, api.OpCopyDevice, api.OpMemset,
	api.OpLaunch, api.OpSynchronize, api.OpKernels, api.OpStatus, api.OpHello,
	// The data path and shared buffers; appended, so seeds keep their op.
	api.OpHostRegister, api.OpHostUnregister, api.OpCopyToDeviceHost, api.OpCopyFromDeviceHost,
	api.OpBatch, api.OpSeal, api.OpGraphCreate, api.OpGraphLaunch, api.OpGraphDestroy, api.OpSessionStats,
	api.OpExport, api.OpImport, api.OpRevoke, api.OpPublish, api.OpPin,
	api.OpGraphRegister, api.OpGraphInvoke, api.OpGraphRelease,
}

// FuzzCommandValidator sends arbitrary bodies as every tenant operation
// (op picks one of tenantOps; others go through as raw op numbers) over a
// real session, whose buffers sit at addresses the seeds name. Whatever the
// request, the mediator answers it with success or a typed error that is not
// internal, and the session goes on serving. The seed corpus is in
// testdata/fuzz/FuzzCommandValidator; `go test -run xxx -fuzz
// FuzzCommandValidator ./mediator/` explores from it.
func FuzzCommandValidator(f *testing.F) {
	s := startWith(f, 64<<20, func(c *mediator.Config) { c.TenantMemory = 16 << 20 })
	nc, err := net.Dial("unix", s.socket)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { nc.Close() })
	c := wire.NewConn(nc)
	call := func(op wire.Op, body []byte) ([]byte, error) {
		if err := c.WriteFrame(op, 0, 7, body); err != nil {
			return nil, err
		}
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		h, err := c.ReadHeader()
		if err != nil {
			return nil, err
		}
		b := make([]byte, h.Len)
		if err := c.ReadBody(b); err != nil {
			return nil, err
		}
		if h.ID != 7 || h.Flags&wire.FlagReply == 0 || h.Op != op {
			return nil, errors.New("reply header does not match the request")
		}
		if h.Flags&wire.FlagError != 0 {
			return nil, wire.DecodeError(b)
		}
		return b, nil
	}
	if _, err := call(api.OpHello, hello("fuzz", api.Version)); err != nil {
		f.Fatal(err)
	}
	for range 2 { // buffers at the space's first addresses, which seeds use
		if _, err := call(api.OpMalloc, api.Encode(&api.Malloc{Size: 1 << 20})); err != nil {
			f.Fatal(err)
		}
	}
	index := func(op wire.Op) uint16 {
		for i, o := range tenantOps {
			if o == op {
				return uint16(i)
			}
		}
		panic(op)
	}
	const buf0 = 1 << 32 // the first buffer
	memset := api.Encode(&api.Memset{Dst: buf0, Value: 1, Len: 64})
	launch := api.Encode(&api.Launch{Kernel: "fill_f32", Args: []api.Arg{{Kind: api.ArgBuffer, Bits: buf0}, {Kind: api.ArgI64, Bits: 4}, {Kind: api.ArgF32}}})
	f.Add(index(api.OpBatch), api.Encode(&api.Batch{Cmds: []api.Cmd{{Op: api.OpMemset, Body: memset}, {Op: api.OpLaunch, Body: launch}}}))
	f.Add(index(api.OpGraphCreate), api.Encode(&api.Batch{Cmds: []api.Cmd{{Op: api.OpLaunch, Body: launch}}}))
	f.Add(index(api.OpGraphLaunch), api.Encode(&api.GraphLaunch{Graph: 1}))
	f.Add(index(api.OpCopyToDeviceHost), api.Encode(&api.CopyHost{Addr: buf0, Region: 1, Len: 8}))
	f.Add(index(api.OpSeal), api.Encode(&api.Seal{Addr: buf0}))
	f.Add(index(api.OpExport), api.Encode(&api.Export{Addr: buf0, Mode: api.ModeCoherent, Grants: []api.Grant{{Tenant: "b"}}}))
	f.Add(index(api.OpImport), api.Encode(&api.Shared{Node: "x", Object: 1}))
	f.Add(index(api.OpPin), api.Encode(&api.At{Addr: buf0}))
	f.Add(index(api.OpGraphRegister), api.Encode(&api.GraphDef{
		Name: "acc",
		Tensors: []api.TensorDef{
			{Name: "x", DType: api.DTypeF32, Shape: []int64{16}, Residency: api.ResInput},
			{Name: "c", DType: api.DTypeF32, Shape: []int64{16}, Residency: api.ResKVCache, Addr: buf0},
			{Name: "s", DType: api.DTypeF32, Shape: []int64{1}, Residency: api.ResOutput},
		},
		Ops: []api.OpDef{
			{Kernel: "saxpy", Args: []api.OpArg{{Kind: api.OpArgI64, I64: 16}, {Kind: api.OpArgF32, F32: 1}, {Kind: api.OpArgTensor}, {Kind: api.OpArgTensor, Tensor: 1}}},
			{Kernel: "reduce_sum_f32", Args: []api.OpArg{{Kind: api.OpArgI64, I64: 16}, {Kind: api.OpArgTensor, Tensor: 1}, {Kind: api.OpArgTensor, Tensor: 2}}},
		},
	}))
	f.Add(index(api.OpGraphInvoke), api.Encode(&api.GraphInvoke{Graph: 1, Inputs: make([]byte, 64)}))
	f.Add(index(api.OpGraphRelease), api.Encode(&api.Graph{Graph: 1}))
	f.Fuzz(func(t *testing.T, opIndex uint16, body []byte) {
		op := wire.Op(opIndex)
		if int(opIndex) < len(tenantOps) {
			op = tenantOps[opIndex]
		}
		if op == api.OpHello && len(body) > 0 {
			body = body[:0] // a second hello is just an unknown request
		}
		_, err := call(op, body)
		var re *api.RemoteError
		switch {
		case err == nil:
		case errors.As(err, &re):
			if re.Code == api.CodeInternal {
				t.Fatalf("%v %x: internal error: %v", op, body, err)
			}
		case errors.Is(err, io.EOF):
			t.Fatalf("%v %x: the mediator closed the session", op, body)
		default:
			t.Fatalf("%v %x: %v", op, body, err)
		}
		if _, err := call(api.OpKernels, nil); err != nil {
			t.Fatalf("after %v %x: session no longer serves: %v", op, body, err)
		}
	})
}
