"""remote(): a torch module captured, lowered to tensor graphs and run on a vGPU.

`remote(module, example_inputs, decode_inputs=...)` captures the module's
forward (capture.py) once per graph — one graph for the example inputs, and
a second, of phase decode, for decode_inputs — lowers each to launches of
the kernel catalog (lower.py), uploads the weights once into one sealed
allocation and the module's KV caches into one allocation that both graphs
share, registers the graphs, and returns a `RemoteModule` that is called
like the module: torch tensors in, torch tensors out, one round trip per
call.

The meaning of each tensor comes from the module itself: parameters are
weights; buffers that forward writes (or that `kv_caches` names) are KV
caches, kept on the device between calls; other buffers are constants;
everything else is an activation. The phase of every operation is the
graph's: prefill and decode when the module is captured with both,
forward otherwise.

Integer arguments of forward (a decode position) become the graphs'
scalar inputs: the module is captured again with each such argument moved
by one and by two, and every integer of the operations that moved with it
must move as an affine function of it (a slice start, a cache position, a
causal mask's diagonal), which the mediator then evaluates at each call.
An integer the model cannot be captured at other values of is fixed to the
example's: calling with another value is refused.

Invariants:
  - Everything that can be refused is refused before anything is sent:
    capture, lowering and the checks of the graphs' sizes.
  - Loading is all or nothing: if any step fails (a quota exceeded while
    loading weights, say), what was allocated or registered is freed
    before the error is raised, so nothing stays charged to the tenant.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils._pytree as pytree

import vgpu
from vgpu.progress import Progress

from .capture import Node, Ref, Trace, TraceError, capture
from .lower import F32, I32, Affine, Const, Dev, Emitter, F32Arg, Handle, Lowerer, contiguous_strides

# Alignment of each tensor in the weight and cache allocations, as a GPU
# allocator aligns buffers; the weights' allocation is whole 2 MiB frames,
# which a node deduplicates frame by frame (docs/graphs.md).
_ALIGN = 256
_FRAME = 2 << 20

# An invocation's inputs, and its outputs, total at most this (docs/graphs.md).
_MAX_IO = 1 << 20


def _np_dtype(dt: str) -> Any:
    return np.float32 if dt == F32 else np.int32


class Store:
    """The tensors of a RemoteModule that live on the device for its whole
    life, shared by its graphs: weights (parameters and constants) and KV
    caches, each placed at an offset of one allocation."""

    def __init__(self) -> None:
        self.weights: List[Tuple[Handle, torch.Tensor]] = []
        self.caches: List[Tuple[Handle, torch.Tensor]] = []
        self.by_key: Dict[Any, Handle] = {}

    def weight(self, key: Any, name: str, value: torch.Tensor) -> Handle:
        h = self.by_key.get(key)
        if h is None:
            dt = F32 if value.dtype == torch.float32 else I32
            h = Handle(name, dt, max(1, value.numel()), "weight")
            h.shape = tuple(value.shape)
            self.weights.append((h, value))
            self.by_key[key] = h
        return h

    def cache(self, name: str, value: torch.Tensor) -> Handle:
        h = self.by_key.get(("cache", name))
        if h is None:
            h = Handle(name, F32, value.numel(), "kv-cache")
            h.shape = tuple(value.shape)
            self.caches.append((h, value))
            self.by_key[("cache", name)] = h
        return h


class GraphEmitter(Emitter):
    """Records a graph's tensors and launches for registration later."""

    def __init__(self, store: Store):
        self.store = store
        self.handles: List[Handle] = []  # tensors of the graph, in declaration order
        self.launches: List[Tuple[str, List[Any], str]] = []

    def use(self, h: Handle) -> Handle:
        if h not in self.handles:
            self.handles.append(h)
        return h

    def activation(self, name: str, dtype: str, numel: int) -> Handle:
        return self.use(Handle(f"{name}{len(self.handles)}", dtype, numel, "activation"))

    def constant(self, name: str, value: torch.Tensor) -> Handle:
        key = ("const", str(value.dtype), tuple(value.shape), hashlib.sha256(value.numpy().tobytes()).hexdigest())
        return self.use(self.store.weight(key, name, value))

    def launch(self, kernel: str, args: List[Any], where: str) -> None:
        for a in args:
            if isinstance(a, Handle):
                self.use(a)
        self.launches.append((kernel, args, where))


@dataclass
class _Input:
    index: int  # position among forward's arguments
    shape: Tuple[int, ...]
    dtype: str
    handle: Optional[Handle]  # None when no operation reads it


@dataclass
class _Graph:
    """One captured and lowered graph, and once loaded, its registration."""

    phase: vgpu.Phase
    signature: List[Any]  # per forward argument: ("tensor", shape, dtype), ("scalar", name) or ("fixed", value)
    inputs: List[_Input]
    scalars: List[int]  # forward argument positions of the graph's scalars
    outputs: List[Any]  # flattened: ("dev", handle, shape, torch dtype), ("const", tensor) or ("value", v)
    out_spec: Any
    emitter: GraphEmitter
    registered: Any = None


def _is_scalar(a: Any) -> bool:
    return isinstance(a, int) and not isinstance(a, bool)


def _describe(sig: List[Any]) -> str:
    parts = []
    for s in sig:
        if s[0] == "tensor":
            parts.append(f"{list(s[1])} {s[2]}")
        elif s[0] == "scalar":
            parts.append(f"int {s[1]}")
        else:
            parts.append(repr(s[1]))
    return "(" + ", ".join(parts) + ")"


def _arg_names(module: torch.nn.Module, n: int) -> List[str]:
    """The names of forward's first n positional arguments, for messages and
    the graphs' tensors: those of *args are args[0], args[1], ..."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        if i < len(params) and params[i].kind == inspect.Parameter.VAR_POSITIONAL:
            names += [f"{params[i].name}[{k}]" for k in range(n - i)]
            break
        names.append(params[i].name if i < len(params) else f"arg{i}")
    return names


def _vary(module: torch.nn.Module, args: Sequence[Any], i: int) -> List[Tuple[int, Trace]]:
    """Traces with integer argument i moved by one and two (or minus one and
    two), or none if the module cannot run at either."""
    for step in (1, -1):
        try:
            out = []
            for k in (1, 2):
                a = list(args)
                a[i] = args[i] + step * k
                out.append((a[i], capture(module, a)))
            return out
        except TraceError:
            raise
        except Exception:  # the model refuses that value: the argument stays fixed
            continue
    return []


class _Fit:
    """Fits an integer's values over the capture runs to an Affine of the
    graph's scalars."""

    def __init__(self, values: List[List[int]], varied: Dict[int, List[int]], names: List[str]):
        self.values = values  # values[k][s]: scalar s in run k
        self.varied = varied  # scalar s -> the runs that moved it alone
        self.names = names

    def __call__(self, cs: List[int], what: str) -> Affine:
        c0 = cs[0]
        if all(c == c0 for c in cs):
            return Affine(None, 0, c0)
        found = None
        for s, runs in self.varied.items():
            v0 = self.values[0][s]
            k1, k2 = runs
            mul, rem = divmod(cs[k1] - c0, self.values[k1][s] - v0)
            if rem:
                raise TraceError(f"{what} moves by a fraction of {self.names[s]}")
            if c0 + mul * (self.values[k2][s] - v0) != cs[k2]:
                raise TraceError(f"{what} is not an affine function of {self.names[s]} "
                                 f"({c0}, {cs[k1]}, {cs[k2]} at {v0}, {self.values[k1][s]}, {self.values[k2][s]})")
            if mul:
                if found is not None:
                    raise TraceError(f"{what} depends on two integer arguments, {self.names[found[0]]} and {self.names[s]}")
                found = (s, mul)
        if found is None:
            raise TraceError(f"{what} changes between captures that change no integer argument")
        s, mul = found
        return Affine(s, mul, c0 - mul * self.values[0][s])


def _align(traces: List[Trace], what: List[str], fit: _Fit) -> List[Tuple[Node, List[List[Any]]]]:
    """The base trace's nodes with the integers that differ between runs
    replaced by Affines, and each node's outputs in every run."""
    base = traces[0]
    for k, tr in enumerate(traces[1:], 1):
        if len(tr.nodes) != len(base.nodes):
            i = next((i for i, (a, b) in enumerate(zip(base.nodes, tr.nodes)) if a.func != b.func), min(len(base.nodes), len(tr.nodes)))
            at = base.nodes[i].where if i < len(base.nodes) else tr.nodes[i].where
            raise TraceError(f"the model runs different operations {what[k]} than {what[0]}, from {at}: "
                             "control flow that depends on an integer argument; a graph has one path")
    out = []
    for i, n0 in enumerate(base.nodes):
        flat0, spec0 = pytree.tree_flatten((n0.args, n0.kwargs))
        flats = []
        for k, tr in enumerate(traces[1:], 1):
            n = tr.nodes[i]
            f, spec = pytree.tree_flatten((n.args, n.kwargs))
            if n.func != n0.func or spec != spec0:
                raise TraceError(f"the model runs {n.name} {what[k]} where it runs {n0.name} {what[0]} (at {n0.where}): "
                                 "control flow that depends on an integer argument; a graph has one path")
            for o0, o in zip(n0.outs, n.outs):
                if o0 is not None and tuple(o0.shape) != tuple(o.shape):
                    raise TraceError(f"the shape of {n0.name} at {n0.where} depends on an integer argument "
                                     f"({list(o0.shape)} {what[0]}, {list(o.shape)} {what[k]}): a graph's shapes are fixed; "
                                     "attend over the whole cache with a mask instead of a slice that grows")
            flats.append(f)
        new = []
        for j, a in enumerate(flat0):
            vals = [a] + [f[j] for f in flats]
            if _is_scalar(a):
                new.append(fit(vals, f"argument {j} of {n0.name} at {n0.where}"))
                if new[-1].const:
                    new[-1] = a
            elif any(type(v) is not type(a) or (v != a and not (isinstance(a, float) and math.isnan(a))) for v in vals[1:]):
                raise TraceError(f"argument {j} of {n0.name} at {n0.where} depends on an integer argument ({vals[0]!r}, {vals[1]!r}) "
                                 "in a way a graph cannot express")
            else:
                new.append(a)
        args, kwargs = pytree.tree_unflatten(new, spec0)
        node = Node(n0.func, tuple(args), dict(kwargs), n0.outs, n0.out_spec, n0.where)
        out.append((node, [tr.nodes[i].outs for tr in traces]))
    return out


def _capture_runs(module: torch.nn.Module, args: Sequence[Any], names: List[str]
                  ) -> Tuple[List[Trace], List[str], List[Any], List[int], _Fit]:
    """Captures module(*args), and again with each integer argument moved
    (_vary). Returns the traces (the example's first), what each run was
    (for messages), the call signature, the arguments that became the
    graph's scalars, and the fit of integers over the runs to them."""
    traces, varied, what = [capture(module, args)], {}, ["at the example"]
    signature: List[Any] = [("tensor", tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else ("fixed", a) for a in args]
    graph_scalars: List[int] = []
    moved_values: List[Tuple[int, int]] = []  # (scalar, value) of each run after the first
    for i in [i for i, a in enumerate(args) if _is_scalar(a)]:
        moved = _vary(module, args, i)
        if not moved:
            continue
        s = len(graph_scalars)
        graph_scalars.append(i)
        signature[i] = ("scalar", names[i])
        varied[s] = []
        for v, tr in moved:
            traces.append(tr)
            varied[s].append(len(traces) - 1)
            what.append(f"with {names[i]}={v}")
            moved_values.append((s, v))
    values = [[args[i] for i in graph_scalars] for _ in traces]
    for k, (s, v) in enumerate(moved_values, 1):
        values[k][s] = v
    return traces, what, signature, graph_scalars, _Fit(values, varied, [names[i] for i in graph_scalars])


def lower_module(module: torch.nn.Module, args: Sequence[Any], phase: vgpu.Phase, store: Store,
                 kv_caches: Sequence[str] = ()) -> _Graph:
    """Captures module(*args) and lowers it to a graph of phase, sharing store."""
    names = _arg_names(module, len(args))
    # Element types before the module runs: torch would fail a float64 input
    # of a float32 model without naming it, and a float64 weight must not
    # be uploaded as anything else.
    for name, p in module.named_parameters():
        if p.dtype != torch.float32:
            raise TraceError(f"parameter {name} of {type(module).__name__} is {p.dtype}; weights are float32 (module.float())")
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.dtype not in (torch.float32, torch.int64, torch.int32):
            raise TraceError(f"input {i} ({names[i]}) is {a.dtype}; inputs are float32, or integer ids")
    traces, what, signature, graph_scalars, fit = _capture_runs(module, args, names)
    base = traces[0]
    aligned = _align(traces, what, fit)

    emitter = GraphEmitter(store)
    L = Lowerer(emitter, fit)
    for name, t in base.params.items():
        h = store.weight(("param", name), name, t)
        L.set(Ref("param", name), Dev(h, tuple(t.shape), contiguous_strides(t.shape), Affine.of(0)))
    held = dict(module.named_buffers())
    for name, t in base.buffers.items():
        if name in base.mutated or name in kv_caches:
            if t.dtype != torch.float32:
                raise TraceError(f"buffer {name} is written by forward ({base.mutated.get(name, 'named a KV cache')}) "
                                 f"but holds {t.dtype}; KV caches hold float32")
            # The cache starts as the module holds it, not as the example's run left the clone it wrote.
            h = store.cache(name, held[name].detach().clone())
            L.set(Ref("buffer", name), Dev(h, tuple(t.shape), contiguous_strides(t.shape), Affine.of(0)))
        else:
            L.set(Ref("buffer", name), Const([tr.buffers[name] for tr in traces]))
    for k, c in enumerate(base.consts):
        L.set(Ref("const", k), Const([tr.consts[k] for tr in traces]))
    inputs = []
    for j, t in enumerate(base.inputs):
        pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)][j]
        dt = F32 if t.dtype == torch.float32 else I32  # checked above
        h = Handle(names[pos], dt, max(1, t.numel()), "input")
        h.shape = tuple(t.shape)
        emitter.use(h)
        inputs.append(_Input(pos, tuple(t.shape), dt, h))
        L.set(Ref("input", j), Dev(h, tuple(t.shape), contiguous_strides(t.shape), Affine.of(0)))
    L.check_host_reads([node for node, _ in aligned])
    for i, (node, runs) in enumerate(aligned):
        L.node(i, node, runs)
    outputs = []
    taken = set()
    L.where = f"the outputs of {type(module).__name__}.forward"
    for o in base.outputs:
        if not isinstance(o, Ref):
            outputs.append(("value", o))
            continue
        v = L.get(o)
        t = base.value(o)
        if isinstance(v, Const):
            if v.varies:
                raise TraceError(f"an output of {type(module).__name__}.forward is a constant that depends on an integer argument")
            outputs.append(("const", v.values[0]))
            continue
        d = L.contiguous(v, "an output")
        if d.base.kind != "activation" or id(d.base) in taken:
            copy = L.fresh("output", d.dtype, d.shape)
            emitter.launch("slice", [1, d.numel, 1, 0, d.numel, d.base, copy.base], L.where)
            d = copy
        taken.add(id(d.base))
        d.base.kind = "output"
        d.base.shape = tuple(t.shape)  # declared with the module's shape, for the mediator's messages
        outputs.append(("dev", d.base, tuple(t.shape), t.dtype))
    used = {id(a) for _, args_, _ in emitter.launches for a in args_ if isinstance(a, Handle)}
    for inp in inputs:
        if id(inp.handle) not in used:
            emitter.handles.remove(inp.handle)
            inp.handle = None
    g = _Graph(phase, signature, inputs, graph_scalars, outputs, base.out_spec, emitter)
    in_bytes = sum(4 * i.handle.numel for i in inputs if i.handle is not None)
    out_bytes = sum(4 * o[1].numel for o in outputs if o[0] == "dev")
    for what_, n in (("inputs", in_bytes), ("outputs", out_bytes)):
        if n > _MAX_IO:
            raise TraceError(f"the graph's {what_} total {n} bytes; an invocation carries at most 1 MiB of each")
    return g


def _pack(items: List[Tuple[Handle, torch.Tensor]]) -> Tuple[Dict[int, int], np.ndarray]:
    """Offsets of each tensor in one buffer, _ALIGN apart, and the buffer."""
    offsets, size = {}, 0
    for h, t in items:
        offsets[id(h)] = size
        size += -(-4 * h.numel // _ALIGN) * _ALIGN
    buf = np.zeros(max(size, _ALIGN), dtype=np.uint8)
    for h, t in items:
        a = t.detach().contiguous().numpy().astype(_np_dtype(h.dtype), copy=False).reshape(-1)
        buf[offsets[id(h)]:offsets[id(h)] + a.nbytes] = a.view(np.uint8)
    return offsets, buf


# A drawn upload goes in about this many copies, each whole frames, so
# that its line moves; an undrawn one is a single copy.
_UPLOAD_STEPS = 64


def upload(client: "vgpu.Client", addr: int, data: np.ndarray, progress: Optional[Progress] = None) -> None:
    """Copies data to device address addr through host memory shared with
    the mediator (host_alloc), so that a model's weights do not cross the
    socket, and waits for it. With a progress line that draws, the copy
    goes in pieces of whole frames, each awaited and drawn."""
    staging = client.host_alloc(len(data))
    try:
        staging[:] = data
        step = len(data)
        if progress is not None and progress.enabled:
            step = max(1, -(-len(data) // _UPLOAD_STEPS // _FRAME)) * _FRAME
        for off in range(0, len(data), step):
            client.stream.copy_to_device(addr + off, staging[off:off + step])
            client.stream.synchronize()
            if progress is not None:
                progress.update(min(off + step, len(data)))
    finally:
        client.host_free(staging)
        if progress is not None:
            progress.close()


def free_all(client: "vgpu.Client", addrs: Sequence[int]) -> None:
    """Frees each allocation, going on past errors: a close after the
    session failed (the mediator gone) has nothing left to free, and must
    not hide the error that led to it."""
    for a in addrs:
        try:
            client.free(a)
        except vgpu.VgpuError:
            pass


class RemoteModule:
    """A module's graphs loaded on a vGPU; call it like the module.

    Each call picks the graph whose example its arguments match (the shapes
    and element types of its tensors, the fixed values of its other
    arguments), sends the input tensors and integer arguments, and returns
    the outputs as CPU torch tensors shaped as the module returns them:
    one request and one wait. The KV caches stay on the device between
    calls; `reset_caches` puts back the buffers' contents at loading.
    """

    def __init__(self, module: torch.nn.Module, graphs: List[_Graph], store: Store, client: "vgpu.Client",
                 owns_client: bool, device: int, progress: Optional[bool] = None):
        self.module_name = type(module).__name__
        self.graphs = graphs
        self.store = store
        self.client = client
        self._owns_client = owns_client
        self.device = device
        self._allocs: List[int] = []
        self.weights_addr = 0
        self.caches_addr = 0
        self._cache_buf: Optional[np.ndarray] = None
        self._load(progress)

    def _load(self, progress: Optional[bool]) -> None:
        try:
            w_off, wbuf = _pack(self.store.weights)
            size = -(-len(wbuf) // _FRAME) * _FRAME
            self.weights_addr = self._alloc(size, vgpu.Hint.WEIGHT)
            upload(self.client, self.weights_addr, wbuf,
                   Progress(f"vgpu.torch: weights of {self.module_name}", len(wbuf), enabled=progress))
            self.client.seal(self.weights_addr)
            c_off: Dict[int, int] = {}
            if self.store.caches:
                c_off, self._cache_buf = _pack(self.store.caches)
                self.caches_addr = self._alloc(len(self._cache_buf), vgpu.Hint.KV_CACHE, near=self.weights_addr)
                upload(self.client, self.caches_addr, self._cache_buf)
            addr = {}
            for h, _ in self.store.weights:
                addr[id(h)] = self.weights_addr + w_off[id(h)]
            for h, _ in self.store.caches:
                addr[id(h)] = self.caches_addr + c_off[id(h)]
            for g in self.graphs:
                g.registered = self.client.register_graph(self._graph_def(g, addr))
        except BaseException:
            self.close()
            raise

    def _alloc(self, size: int, hint: "vgpu.Hint", near: Optional[int] = None) -> int:
        a = self.client.malloc(size, device=self.device, hint=hint, near=near)
        self._allocs.append(a)
        return a

    def _graph_def(self, g: _Graph, addr: Dict[int, int]) -> "vgpu.GraphDef":
        gd = vgpu.GraphDef(f"{self.module_name}.{g.phase.name.lower()}")
        scalars = [gd.scalar(g.signature[i][1]) for i in g.scalars]
        ids: Dict[int, Any] = {}
        for h in g.emitter.handles:
            dt = vgpu.DType.F32 if h.dtype == F32 else vgpu.DType.I32
            shape = list(getattr(h, "shape", ())) or [h.numel]
            if len(shape) > 4 or math.prod(shape) != h.numel:
                shape = [h.numel]
            if h.kind == "weight":
                ids[id(h)] = gd.weight(h.name, dt, addr[id(h)], shape)
            elif h.kind == "kv-cache":
                ids[id(h)] = gd.kv_cache(h.name, dt, addr[id(h)], shape)
            elif h.kind == "input":
                ids[id(h)] = gd.input(h.name, dt, shape)
            elif h.kind == "output":
                ids[id(h)] = gd.output(h.name, dt, shape)
            else:
                ids[id(h)] = gd.activation(h.name, dt, shape)

        def arg(a: Any) -> Any:
            if isinstance(a, Handle):
                return ids[id(a)]
            if isinstance(a, F32Arg):
                return float(a.value)
            if isinstance(a, Affine):
                return a.add if a.const else scalars[a.scalar] * a.mul + a.add
            return int(a)

        for kernel, args, _ in g.emitter.launches:
            gd.op(g.phase, kernel, *[arg(a) for a in args])
        return gd

    def reset_caches(self) -> None:
        """Puts the KV caches back to what the module's buffers held when it
        was loaded."""
        if self._cache_buf is not None:
            upload(self.client, self.caches_addr, self._cache_buf)

    def _match(self, args: Sequence[Any]) -> _Graph:
        for g in self.graphs:
            if len(args) != len(g.signature):
                continue
            ok = True
            for a, s in zip(args, g.signature):
                if s[0] == "tensor":
                    ok = isinstance(a, torch.Tensor) and tuple(a.shape) == s[1] and (a.dtype == s[2] or (
                        a.dtype in (torch.int32, torch.int64) and s[2] in (torch.int32, torch.int64)))
                elif s[0] == "scalar":
                    ok = _is_scalar(a)
                else:
                    ok = type(a) is type(s[1]) and a == s[1]
                if not ok:
                    break
            if ok:
                return g
        got = _describe([("tensor", tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else ("fixed", a) for a in args])
        takes = " or ".join(f"{_describe(g.signature)} ({g.phase.name.lower()})" for g in self.graphs)
        raise vgpu.InvalidArgument(f"{self.module_name} on the vGPU was called with {got}; its captured graphs take {takes}")

    def __call__(self, *args: Any) -> Any:
        g = self._match(args)
        if g.registered is None:
            raise vgpu.Unavailable(f"{self.module_name} on the vGPU was closed")
        inputs = []
        for inp in g.inputs:
            if inp.handle is None:
                continue
            t = args[inp.index].detach()
            if inp.dtype == I32:
                lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 0)
                if lo < -(2**31) or hi >= 2**31:
                    raise vgpu.InvalidArgument(f"input {inp.index} of {self.module_name} holds ids outside int32 "
                                               f"(from {lo} to {hi})")
                a = t.to(torch.int32).contiguous().numpy()
            else:
                a = t.contiguous().numpy()
            inputs.append(a)
        outs = g.registered.invoke([int(args[i]) for i in g.scalars], *inputs)
        it = iter(outs)
        flat = []
        for o in g.outputs:
            if o[0] == "dev":
                a = next(it)
                flat.append(torch.from_numpy(np.array(a)).reshape(o[2]).to(o[3]))
            elif o[0] == "const":
                flat.append(o[1].clone())
            else:
                flat.append(o[1])
        return pytree.tree_unflatten(flat, g.out_spec)

    def close(self) -> None:
        """Releases the graphs and frees the device memory (or, for a client
        of its own, ends the session, which frees everything)."""
        for g in self.graphs:
            if g.registered is not None:
                try:
                    g.registered.release()
                except vgpu.VgpuError:
                    pass
                g.registered = None
        free_all(self.client, self._allocs)
        self._allocs = []
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> "RemoteModule":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def remote(module: torch.nn.Module, example_inputs: Sequence[Any], *, decode_inputs: Optional[Sequence[Any]] = None,
           client: Optional["vgpu.Client"] = None, socket: Optional[str] = None, tenant: Optional[str] = None,
           device: int = 0, kv_caches: Sequence[str] = (), progress: Optional[bool] = None) -> RemoteModule:
    """Runs module on a vGPU: captured from example_inputs (and, for a
    second graph of phase decode that shares the weights and the KV
    caches, from decode_inputs), uploaded once, and returned as a
    RemoteModule called like the module.

    Without decode_inputs the graph's phase is forward; with them, the
    example's is prefill. kv_caches names buffers to keep on the device
    as KV caches even if forward does not write them. The session is
    client's, or a new one on socket (default $VGPU_SOCKET, else
    /run/vgpu/mediator.sock) as tenant.

    progress: the weights' upload draws a progress line on stderr when it
    is a terminal (None, the default), always (True) or never (False).
    """
    if not isinstance(module, torch.nn.Module):
        raise vgpu.InvalidArgument(f"remote takes a torch.nn.Module, not {type(module).__name__}")
    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    store = Store()
    if decode_inputs is None:
        graphs = [lower_module(module, example_inputs, vgpu.Phase.FORWARD, store, kv_caches)]
    else:
        decode_inputs = tuple(decode_inputs) if isinstance(decode_inputs, (list, tuple)) else (decode_inputs,)
        graphs = [lower_module(module, example_inputs, vgpu.Phase.PREFILL, store, kv_caches),
                  lower_module(module, decode_inputs, vgpu.Phase.DECODE, store, kv_caches)]
    owns = client is None
    if owns:
        client = vgpu.Client(socket=socket, tenant=tenant)
    try:
        return RemoteModule(module, graphs, store, client, owns, device, progress)
    except BaseException:
        if owns:
            client.close()
        raise
