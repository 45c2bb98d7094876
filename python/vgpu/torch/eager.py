"""Op by op: a torch module run on a vGPU the way driver-level remoting runs it.

`eager(module, client)` returns an `EagerModule`, called like the module,
whose every call runs forward under a `TorchDispatchMode` that sends each
aten operation to the mediator as it comes: one launch request per kernel
(lower.py's lowering of that one operation, with no view of what comes
next), pipelined on the session's stream, its inputs copied in and its
outputs copied back with a wait at the end. Weights and KV caches are
uploaded once, like a framework's parameters on a GPU, and activations
come from a pool reused by every call, like a caching allocator. Values
the host computes without the device (an arange, a mask) are copied in at
each call, as a framework creating them would.

What it does not have is the graph: no meaning (every buffer anonymous),
no phase, a request per operation. It exists to measure that difference
(examples/python/compare.py): it is the baseline, not a way to run models.

Shapes are computed on meta tensors, so the host does no model arithmetic.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import vgpu

from .capture import Node, Ref, capture, functional_call
from .lower import F32, Affine, Const, Dev, Emitter, F32Arg, Handle, Lowerer, contiguous_strides
from .remote import Store, _np_dtype, _pack, free_all, upload


class EagerEmitter(Emitter):
    """Launches each kernel at once on the client's default stream."""

    def __init__(self, client: "vgpu.Client", device: int):
        self.client = client
        self.device = device
        self.free: Dict[Tuple[str, int], List[Handle]] = {}  # pooled activations by (dtype, numel)
        self.used: List[Handle] = []  # taken by the call in progress
        self.recorded: Optional[List[Tuple[str, List[Any]]]] = None  # launches sent, when recording

    def _take(self, name: str, dtype: str, numel: int) -> Handle:
        pool = self.free.setdefault((dtype, numel), [])
        if pool:
            h = pool.pop()
        else:
            h = Handle(name, dtype, numel, "activation")
            h.addr = self.client.malloc(4 * numel, device=self.device, hint=vgpu.Hint.ACTIVATION)
        self.used.append(h)
        return h

    def activation(self, name: str, dtype: str, numel: int) -> Handle:
        return self._take(name, dtype, numel)

    def constant(self, name: str, value: torch.Tensor) -> Handle:
        dt = F32 if value.dtype == torch.float32 else "i32"
        h = self._take(name, dt, max(1, value.numel()))
        self.client.stream.copy_to_device(h.addr, np.ascontiguousarray(value.numpy().astype(_np_dtype(dt))))
        return h

    def launch(self, kernel: str, args: List[Any], where: str) -> None:
        out = []
        for a in args:
            if isinstance(a, Handle):
                out.append(vgpu.Ptr(a.addr))
            elif isinstance(a, F32Arg):
                out.append(vgpu.F32(a.value))
            elif isinstance(a, Affine):
                out.append(vgpu.I64(a.add))
            else:
                out.append(vgpu.I64(int(a)))
        self.client.stream.launch(kernel, *out)
        if self.recorded is not None:
            self.recorded.append((kernel, out))

    def end_call(self) -> None:
        for h in self.used:
            self.free.setdefault((h.dtype, h.numel), []).append(h)
        self.used = []


def _one_run(cs: List[int], what: str) -> Affine:
    return Affine(None, 0, cs[0])


class _Dispatch(TorchDispatchMode):
    """Lowers and launches each aten call; tensors the device holds are meta
    tensors here, named by object id."""

    def __init__(self, lowerer: Lowerer, names: Dict[int, Ref]):
        super().__init__()
        self.L = lowerer
        self.names = names
        self.n = 0
        self.keep: List[Any] = []  # tensors named here, alive for the call

    def _ref(self, t: torch.Tensor) -> Ref:
        r = self.names.get(id(t))
        if r is None:
            r = Ref("const", id(t))
            self.names[id(t)] = r
            self.L.set(r, Const([t]))
            self.keep.append(t)
        return r

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, spec = pytree.tree_flatten((args, kwargs))
        refs = [self._ref(a) if isinstance(a, torch.Tensor) else a for a in flat]
        on_device = any(isinstance(a, torch.Tensor) and a.is_meta for a in flat)
        if on_device:
            meta = [a.to("meta") if isinstance(a, torch.Tensor) and not a.is_meta else a for a in flat]
            margs, mkwargs = pytree.tree_unflatten(meta, spec)
            out = func(*margs, **mkwargs)
        else:
            out = func(*args, **kwargs)
        rargs, rkwargs = pytree.tree_unflatten(refs, spec)
        outs, out_spec = pytree.tree_flatten(out)
        kept = [o if isinstance(o, torch.Tensor) else None for o in outs]
        node = Node(func, tuple(rargs), dict(rkwargs), kept, out_spec, str(func))
        self.L.node(self.n, node, [kept])
        for i, o in enumerate(kept):
            if o is not None:
                self.names[id(o)] = Ref("node", (self.n, i))
        self.keep.append(outs)
        self.n += 1
        return out


class EagerModule:
    """A module whose calls run op by op on a vGPU (see the module doc)."""

    def __init__(self, module: torch.nn.Module, example_inputs: Sequence[Any], client: "vgpu.Client", device: int = 0):
        self.module = module
        self.client = client
        self.emit = EagerEmitter(client, device)
        trace = capture(module, example_inputs)  # which buffers forward writes
        self.params = {n: p.detach() for n, p in module.named_parameters()}
        self.buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
        self.caches = {n for n in self.buffers if n in trace.mutated}
        store = Store()
        for n, t in self.params.items():
            store.weight(("param", n), n, t)
        for n in self.caches:
            store.cache(n, self.buffers[n])
        self._handles: Dict[str, Handle] = {}
        self._allocs: List[int] = []
        try:
            for items, hint in ((store.weights, vgpu.Hint.WEIGHT), (store.caches, vgpu.Hint.KV_CACHE)):
                if not items:
                    continue
                off, buf = _pack(items)
                addr = client.malloc(len(buf), device=device, hint=hint)
                self._allocs.append(addr)
                upload(client, addr, buf)
                for h, _ in items:
                    h.addr = addr + off[id(h)]
                    self._handles[h.name] = h
        except BaseException:
            self.close()  # the weights, when the caches do not fit
            raise

    def __call__(self, *args: Any) -> Any:
        return self._call(args, [])

    def record(self, *args: Any) -> Tuple[Any, List[Tuple[str, List[Any]]], List[Tuple[int, int]]]:
        """Calls the module and returns, with its result, the launches it
        sent (kernel and arguments) and where its outputs were (device
        address and element count): one step's requests, to replay."""
        self.emit.recorded = []
        outputs: List[Tuple[int, int]] = []
        try:
            result = self._call(args, outputs)
            return result, self.emit.recorded, outputs
        finally:
            self.emit.recorded = None

    def _call(self, args: Sequence[Any], outputs: List[Tuple[int, int]]) -> Any:
        try:
            return self._run(args, outputs)
        finally:
            # The call's activations go back to the pool even when it fails
            # part way (an operation without a kernel): the stream runs in
            # order, so the next call's work on them comes after this one's.
            self.emit.end_call()

    def _run(self, args: Sequence[Any], outputs: List[Tuple[int, int]]) -> Any:
        names: Dict[int, Ref] = {}
        L = Lowerer(self.emit, _one_run)
        state: Dict[str, torch.Tensor] = {}
        for n, t in list(self.params.items()) + [(n, self.buffers[n]) for n in self.caches]:
            m = torch.empty(t.shape, dtype=t.dtype, device="meta")
            names[id(m)] = Ref("param", n)
            L.set(Ref("param", n), Dev(self._handles[n], tuple(t.shape), contiguous_strides(t.shape), Affine.of(0)))
            state[n] = m
        for n, t in self.buffers.items():
            if n not in self.caches:
                state[n] = t
        call_args = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                t = a.detach()
                if t.dtype == torch.int64:
                    t = t.to(torch.int32)
                h = self.emit.constant(f"input{i}", t)
                m = torch.empty(a.shape, dtype=a.dtype, device="meta")
                names[id(m)] = Ref("input", i)
                L.set(Ref("input", i), Dev(h, tuple(a.shape), contiguous_strides(a.shape), Affine.of(0)))
                call_args.append(m)
            else:
                call_args.append(a)
        mode = _Dispatch(L, names)
        with torch.no_grad(), mode:
            out = functional_call(self.module, state, call_args)
        outs, spec = pytree.tree_flatten(out)
        results, reads = [], []
        for o in outs:
            if not isinstance(o, torch.Tensor):
                results.append(o)
                continue
            r = names.get(id(o))
            if r is None:  # a host tensor no operation made (a constant buffer returned as it is)
                results.append(o)
                continue
            v = L.get(r)
            if isinstance(v, Const):
                results.append(v.values[0])
                continue
            d = L.contiguous(v, "an output")
            host = np.empty(d.numel, dtype=_np_dtype(d.dtype))
            self.client.stream.copy_from_device(d.base.addr, host)
            outputs.append((d.base.addr, d.numel))
            reads.append((len(results), host, o))
            results.append(None)
        self.client.stream.synchronize()
        for i, host, o in reads:
            results[i] = torch.from_numpy(host).reshape(o.shape).to(o.dtype)
        return pytree.tree_unflatten(results, spec)

    def close(self) -> None:
        for pool in self.emit.free.values():
            for h in pool:
                self._allocs.append(h.addr)
        free_all(self.client, self._allocs)
        self._allocs = []
        self.emit.free = {}


def eager(module: torch.nn.Module, example_inputs: Sequence[Any], client: "vgpu.Client", device: int = 0) -> EagerModule:
    """module on client's vGPU, op by op (the driver-level-remoting baseline)."""
    return EagerModule(module, example_inputs, client, device)


