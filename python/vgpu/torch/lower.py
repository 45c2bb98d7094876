"""Lowering: aten operations to launches of the kernel catalog.

A `Lowerer` walks a model's aten operations in order (from a capture, or one
at a time as they are dispatched) and emits kernel launches through an
emitter: `GraphEmitter` (graph.py of this package) records them as a tensor
graph, `EagerEmitter` (eager.py) launches each at once. Each torch value
becomes one of:

  - `Dev`: a strided view of a tensor the emitter holds (a weight, a KV
    cache, an input, an activation). Views — view/reshape, transpose,
    permute, slice, split, select, expand — only change its shape, strides
    and offset; a kernel that needs its operand contiguous gets it through
    `contiguous`, which emits a `slice` and/or a `permute` when the view is
    not already laid out so. A matrix product takes a transposed operand as
    it is (trans_a / trans_b) and a weight broadcast over a batch once
    (b_batch = 1).
  - `Const`: a value that depends on no input, weight or cache (a causal
    mask, an arange): computed on CPU, once per capture run, and uploaded
    as a weight only if a kernel reads it.
  - `Scaled`, `Masked`: a value times a number, and scores with a causal
    mask filled in, kept pending so that a following softmax takes the
    scale and the mask as its own parameters instead of two more launches.

Integers may be `Affine` in a graph's scalar inputs (a decode position):
slice starts of the KV cache and of position tables become kernel
arguments computed by the mediator at each invocation. Shapes never do: a
graph's shapes are fixed.

Every refusal is a `TraceError` naming the operation and the line of model
code it came from; it happens before anything is sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .capture import Node, Ref, TraceError

F32, I32 = "f32", "i32"


@dataclass(frozen=True)
class Affine:
    """mul × scalars[scalar] + add; a constant when scalar is None."""

    scalar: Optional[int]
    mul: int = 0
    add: int = 0

    @staticmethod
    def of(v: "Int") -> "Affine":
        return v if isinstance(v, Affine) else Affine(None, 0, int(v))

    @property
    def const(self) -> bool:
        return self.scalar is None or self.mul == 0

    def __add__(self, other: "Int") -> "Affine":
        o = Affine.of(other)
        if self.const:
            return Affine(o.scalar, o.mul, o.add + self.add)
        if o.const:
            return Affine(self.scalar, self.mul, self.add + o.add)
        if o.scalar != self.scalar:
            raise ValueError("sum of two different scalars")
        return Affine(self.scalar, self.mul + o.mul, self.add + o.add)

    def times(self, k: int) -> "Affine":
        return Affine(self.scalar, self.mul * k, self.add * k)

    def divisible(self, k: int) -> bool:
        return self.mul % k == 0 and self.add % k == 0

    def div(self, k: int) -> "Affine":
        return Affine(self.scalar, self.mul // k, self.add // k)


Int = Any  # int or Affine


@dataclass(frozen=True)
class F32Arg:
    """A float argument of a kernel (an f32 parameter)."""

    value: float


class Handle:
    """A tensor the emitter holds: its name, element type, element count and
    kind ("weight", "kv-cache", "input", "activation")."""

    def __init__(self, name: str, dtype: str, numel: int, kind: str):
        self.name, self.dtype, self.numel, self.kind = name, dtype, numel, kind


@dataclass
class Dev:
    """A strided view of a Handle; offset and strides in elements."""

    base: Handle
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    offset: Affine

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> str:
        return self.base.dtype


@dataclass
class Const:
    """A value that depends on no input, weight or cache: one tensor per
    capture run (they differ when it depends on a scalar)."""

    values: List[torch.Tensor]

    @property
    def varies(self) -> bool:
        v0 = self.values[0]
        return any(v.shape != v0.shape or not torch.equal(v, v0) for v in self.values[1:])


@dataclass
class Scaled:
    """src × factor, not yet computed."""

    src: Any
    factor: float


@dataclass
class Masked:
    """src (scores, [..., q, k]) with the columns j > i + offset of each
    block of q rows filled with -inf, not yet computed."""

    src: Any
    q: int
    offset: Affine


@dataclass
class Missing:
    """An output the catalog does not compute (layer_norm's mean, say)."""

    why: str


def contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


def view_strides(shape: Sequence[int], strides: Sequence[int], new: Sequence[int]) -> Optional[Tuple[int, ...]]:
    """The strides of new as a view of (shape, strides) without copying, or
    None if the layout does not allow it (torch's rule for Tensor.view)."""
    if math.prod(shape) == 0:
        return contiguous_strides(new)
    out = [0] * len(new)
    vd = len(new) - 1
    base_stride = strides[-1] if strides else 1
    tnum, vnum = 1, 1
    for td in range(len(shape) - 1, -1, -1):
        tnum *= shape[td]
        if td == 0 or (shape[td - 1] != 1 and strides[td - 1] != tnum * base_stride):
            while vd >= 0 and (vnum < tnum or new[vd] == 1):
                out[vd] = vnum * base_stride
                vnum *= new[vd]
                vd -= 1
            if vnum != tnum:
                return None
            if td > 0:
                base_stride = strides[td - 1]
                tnum, vnum = 1, 1
    if vd != -1:
        return None
    return tuple(out)


def _dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


class Emitter:
    """Where a Lowerer's tensors and launches go (GraphEmitter, EagerEmitter)."""

    def activation(self, name: str, dtype: str, numel: int) -> Handle:
        raise NotImplementedError

    def constant(self, name: str, value: torch.Tensor) -> Handle:
        """A weight holding value (float32 or int32), uploaded with the model's."""
        raise NotImplementedError

    def launch(self, kernel: str, args: List[Any], where: str) -> None:
        """Appends a launch; args are Handles, ints or Affines, and F32Args."""
        raise NotImplementedError


# Fill values of masked_fill that a softmax turns into exact zeros.
_MASK_FILL_MAX = -1e9


class Lowerer:
    """Lowers aten nodes in order into an Emitter's launches.

    fit turns the values an integer took in each capture run into an Affine
    of the graph's scalars (or refuses, naming what); an eager lowering has
    one run and every integer constant.
    """

    def __init__(self, emit: Emitter, fit: Callable[[List[int], str], Affine]):
        self.emit = emit
        self.fit = fit
        self.vals: Dict[Ref, Any] = {}
        self.where = ""
        self._rows: Dict[Tuple[float, int], Handle] = {}
        # Uploaded constants by id of their tensor, which each entry keeps
        # alive: an id is unique only while its object lives, and a rule's
        # constants (layer_norm's ones) die as it returns.
        self._consts: Dict[int, Tuple[torch.Tensor, Handle]] = {}

    # ---- values

    def set(self, ref: Ref, val: Any) -> None:
        self.vals[ref] = val

    def get(self, ref: Ref) -> Any:
        v = self.vals[ref]
        if isinstance(v, Missing):
            self.fail(v.why)
        return v

    def fail(self, msg: str) -> None:
        raise TraceError(f"{msg} (at {self.where})")

    def const_int(self, v: Any, what: str) -> int:
        if isinstance(v, Affine):
            if not v.const:
                self.fail(f"{what} depends on a scalar input; only slice starts and positions may")
            return v.add
        return int(v)

    def as_dev(self, v: Any, what: str) -> Dev:
        """v as a device view: a constant is uploaded, pending work is done."""
        if isinstance(v, Dev):
            return v
        if isinstance(v, Scaled):
            return self.scale(self.as_dev(v.src, what), v.factor)
        if isinstance(v, Masked):
            self.fail(f"{what}: masked_fill is supported only on scores that go straight into softmax over their last dimension")
        if isinstance(v, Const):
            if v.varies:
                self.fail(f"{what} is a constant that depends on a scalar input, and no kernel takes it as such")
            t = v.values[0]
            known = self._consts.get(id(t))
            if known is not None:
                h = known[1]
            else:
                if t.dtype == torch.float32:
                    c = t.contiguous()
                elif t.dtype in (torch.int64, torch.int32) and t.numel() > 0 and int(t.min()) >= -(2**31) and int(t.max()) < 2**31:
                    c = t.to(torch.int32).contiguous()
                else:
                    self.fail(f"{what} is a constant of dtype {t.dtype}; kernels take float32, and int32 indices")
                h = self.emit.constant(f"const{len(self._consts)}", c)
                self._consts[id(t)] = (t, h)
            return Dev(h, tuple(t.shape), contiguous_strides(t.shape), Affine.of(0))
        self.fail(f"{what} is {type(v).__name__}, not a tensor")

    # ---- layout

    def plain(self, v: Dev) -> bool:
        """Whether v is its whole base, laid out contiguously."""
        if v.numel != v.base.numel or not v.offset.const or v.offset.add != 0:
            return False
        return all(s == c for s, c, d in zip(v.strides, contiguous_strides(v.shape), v.shape) if d != 1)

    def fresh(self, name: str, dtype: str, shape: Sequence[int]) -> Dev:
        shape = tuple(int(d) for d in shape)
        h = self.emit.activation(name, dtype, max(1, math.prod(shape)))
        return Dev(h, shape, contiguous_strides(shape), Affine.of(0))

    def contiguous(self, v: Any, what: str) -> Dev:
        """v laid out contiguously as a whole tensor: when its view is not,
        copied by a slice launch per dimension it narrows, then one permute
        launch if its dimensions are not in memory order."""
        v = self.as_dev(v, what)
        if self.plain(v):
            return v
        if v.dtype != F32:
            # slice and permute move float32 only: the mediator would refuse the graph.
            self.fail(f"{what}: a view of shape {list(v.shape)} of the int32 tensor {v.base.name} {list(getattr(v.base, 'shape', [v.base.numel]))} "
                      "would have to be copied, and no kernel copies int32; pass it to forward as a tensor of its own")
        dims = [(d, s) for d, s in zip(v.shape, v.strides) if d != 1]
        if any(s == 0 for _, s in dims):
            self.fail(f"{what}: a broadcast (expanded) view of shape {list(v.shape)} would have to be copied; no kernel does that here")
        order = sorted(range(len(dims)), key=lambda i: -dims[i][1])
        sizes = [dims[i][0] for i in order]
        strides = [dims[i][1] for i in order]
        # Merge runs that are contiguous in memory: (size, stride) groups.
        groups: List[List[int]] = []
        for d, s in zip(sizes, strides):
            if groups and groups[-1][1] == d * s:
                groups[-1] = [groups[-1][0] * d, s]
            else:
                groups.append([d, s])
        src = v
        if v.numel != v.base.numel or not (v.offset.const and v.offset.add == 0):
            src = self._gather(v, groups, what)
        # The elements are now contiguous in stride order; permute to the view's order.
        kept = [i for i, d in enumerate(v.shape) if d != 1]
        perm = [kept[i] for i in order]  # memory order of the view's dims
        if perm == sorted(perm):
            return Dev(src.base, v.shape, contiguous_strides(v.shape), Affine.of(0))
        return self.permute(src.base, [v.shape[i] for i in perm], [perm.index(i) for i in kept], v.shape)

    def _gather(self, v: Dev, groups: List[List[int]], what: str) -> Dev:
        """A fresh tensor of v's elements in memory order, copied by slice
        launches; groups are v's (size, stride) runs, strides decreasing."""
        if not groups or groups[-1][1] != 1:
            groups = groups + [[1, 1]]  # runs of single elements (a column)
        base, n = v.base, v.numel
        off = v.offset
        if not off.const:
            # A start that moves with a scalar (a KV cache read at pos): one
            # slice of outer runs of inner elements, stride apart, over the
            # whole base, its start in units that divide the scalar's step.
            inner = groups[-1][0]
            outer, stride = groups[0] if len(groups) == 2 else (1, base.numel)
            if len(groups) > 2 or outer * stride != base.numel:
                self.fail(f"{what}: a view of shape {list(v.shape)} of {base.name} whose start moves with a scalar "
                          "would have to be copied, which takes one slice: it may narrow one dimension only")
            unit = math.gcd(inner, stride, off.mul, off.add)
            out = self.fresh("slice", v.dtype, [n])
            self.emit.launch("slice", [outer, stride // unit, unit, off.div(unit), inner // unit, base, out.base], self.where)
            return out
        # The base as a row-major array whose dimensions have the groups'
        # strides (the first as many rows as it holds): mids[i] long, of
        # which v takes sizes[i] from starts[i].
        strides = [s for _, s in groups]
        sizes = [d for d, _ in groups]
        if any(a % b for a, b in zip(strides, strides[1:])):
            self._not_a_slice(v, what)
        mids = [base.numel // strides[0]] + [a // b for a, b in zip(strides, strides[1:])]
        starts, rem = [], off.add
        for s in strides:
            starts.append(rem // s)
            rem %= s
        if any(k + d > m for k, d, m in zip(starts, sizes, mids)):
            self._not_a_slice(v, what)
        # One slice per dimension v narrows, outermost first; the first as a
        # run of the whole base (whose length a slice must give exactly).
        src = base
        if starts[0] or sizes[0] != mids[0] or mids[0] * strides[0] != base.numel:
            out = self.fresh("slice", v.dtype, [sizes[0] * strides[0]])
            self.emit.launch("slice", [1, base.numel, 1, starts[0] * strides[0], sizes[0] * strides[0], src, out.base], self.where)
            src = out.base
        for i in range(1, len(groups)):
            if starts[i] or sizes[i] != mids[i]:
                outer, inner = math.prod(sizes[:i]), math.prod(mids[i + 1:])
                out = self.fresh("slice", v.dtype, [outer * sizes[i] * inner])
                self.emit.launch("slice", [outer, mids[i], inner, starts[i], sizes[i], src, out.base], self.where)
                src = out.base
        return Dev(src, (n,), (1,), Affine.of(0))

    def _not_a_slice(self, v: Dev, what: str) -> None:
        self.fail(f"{what}: a view of shape {list(v.shape)} (strides {list(v.strides)}) of {v.base.name} "
                  "is not a slice of it")

    def permute(self, base: Handle, mem_shape: List[int], perm: List[int], shape: Sequence[int]) -> Dev:
        """A launch of permute: base holds mem_shape contiguously; the result
        is its dims in order perm, reshaped to shape."""
        # Merge dims adjacent in both orders, so at most 4 remain.
        groups: List[List[int]] = []  # runs of consecutive memory dims, in output order
        for p in perm:
            if groups and groups[-1][-1] + 1 == p:
                groups[-1].append(p)
            else:
                groups.append([p])
        if len(groups) > 4:
            self.fail(f"a permutation of {len(groups)} dimensions; the permute kernel takes at most 4")
        mem_groups = sorted(groups)
        d = [math.prod(mem_shape[i] for i in g) for g in mem_groups] + [1] * (4 - len(groups))
        p = [mem_groups.index(g) for g in groups] + list(range(len(groups), 4))
        out = self.fresh("permute", base.dtype, shape)
        self.emit.launch("permute", d + p + [base, out.base], self.where)
        return out

    def scale(self, v: Dev, factor: float) -> Dev:
        if factor == 1.0:
            return v
        v = self.contiguous(v, "scaled operand")
        cols = v.shape[-1] if v.shape else 1
        out = self.fresh("scale", F32, v.shape)
        self.emit.launch("mul", [v.numel // cols, cols, 1, v.base, self.row(factor, cols), out.base], self.where)
        return out

    def row(self, value: float, cols: int) -> Handle:
        """A weight of cols copies of value (broadcast over rows by add and mul)."""
        key = (float(value), cols)
        h = self._rows.get(key)
        if h is None:
            h = self.emit.constant(f"fill{value:g}x{cols}", torch.full((cols,), float(value), dtype=torch.float32))
            self._rows[key] = h
        return h

    # ---- nodes

    def node(self, index: int, node: Node, runs: List[List[Optional[torch.Tensor]]]) -> None:
        """Lowers node, whose outputs in each capture run are runs[k]."""
        self.where = f"{node.name}, {node.where}"
        refs = [Ref("node", (index, i)) for i in range(len(node.outs))]
        args = self._resolve(node.args)
        kwargs = {k: self._resolve(v) for k, v in node.kwargs.items()}
        tensors = [a for a in _leaves((args, kwargs)) if isinstance(a, (Dev, Const, Scaled, Masked))]
        name = node.func.overloadpacket.__name__
        if all(isinstance(a, Const) for a in tensors):
            if name.endswith("_") and name not in _IN_PLACE_VIEWS:
                # Its tensor, which every earlier use of the value refers to
                # too, holds only the last value it was given in the run.
                self.fail(f"in-place operation {node.name} on a value computed on the host; "
                          f"write it out of place (x = x.{name[:-1]}(...))")
            for i, r in enumerate(refs):
                if node.outs[i] is not None:
                    self.set(r, Const([run[i] for run in runs]))
            return
        rule = _RULES.get(name)
        if rule is None:
            self.fail(f"operation {node.name} has no kernel in the catalog (see docs/torch.md for what runs)")
        outs = rule(self, node, args, kwargs, runs)
        for r, o in zip(refs, outs):
            self.set(r, o)

    def check_host_reads(self, nodes: Sequence[Node]) -> None:
        """Refuses, before anything is lowered, a read on the host (if
        tensor:, .item()) of a value computed from an input, weight or
        cache: data-dependent control flow. Lowering in order would
        otherwise stop at the first operation without a kernel on the way
        to it (a sum, a comparison) and name that instead. The leaves must
        be set."""
        live = set()
        for i, node in enumerate(nodes):
            refs = [a for a in _leaves((node.args, node.kwargs)) if isinstance(a, Ref)]
            if any(r in live if r.kind == "node" else not isinstance(self.vals.get(r), Const) for r in refs):
                if node.func.overloadpacket.__name__ in _HOST_READS:
                    self.where = f"{node.name}, {node.where}"
                    _data_dependent(self, node, node.args, node.kwargs, [])
                live.update(Ref("node", (i, k)) for k in range(len(node.outs)))

    def before_write(self, cache: Handle) -> None:
        """Computes now the pending values that read cache (its rows scaled),
        which torch computed before the write about to change it."""
        for ref, v in self.vals.items():
            chain = []
            while isinstance(v, (Scaled, Masked)):
                chain.append(v)
                v = v.src
            if not (chain and isinstance(v, Dev) and v.base is cache):
                continue
            if any(isinstance(c, Masked) for c in chain):
                self.fail(f"a write into buffer {cache.name} between a masked_fill of it and the softmax that takes the mask")
            self.vals[ref] = self.as_dev(chain[0], "a value read from a KV cache before a write into it")

    def _resolve(self, a: Any) -> Any:
        if isinstance(a, Ref):
            return self.get(a)
        if isinstance(a, (list, tuple)):
            return type(a)(self._resolve(x) for x in a)
        return a

    def out_shape(self, node: Node) -> Tuple[int, ...]:
        return tuple(node.outs[0].shape)


def _leaves(x: Any) -> List[Any]:
    if isinstance(x, (list, tuple)):
        return [y for e in x for y in _leaves(e)]
    if isinstance(x, dict):
        return [y for e in x.values() for y in _leaves(e)]
    return [x]


Rule = Callable[[Lowerer, Node, Sequence[Any], Dict[str, Any], List[List[Any]]], List[Any]]
_RULES: Dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    def reg(f: Rule) -> Rule:
        for n in names:
            _RULES[n] = f
        return f

    return reg


# ---- views


@rule("alias", "detach", "lift_fresh", "clone", "contiguous", "_to_copy", "to")
def _same(L: Lowerer, node: Node, args, kwargs, runs):
    """Copies and conversions that change nothing the device holds: values
    are immutable once computed (but for KV caches, which only kv_append
    writes), and float32 stays float32."""
    v = args[0]
    if isinstance(v, Dev):
        dt = node.outs[0].dtype
        if dt == torch.float32 and v.dtype != F32:
            L.fail("conversion of integer indices to float32 has no kernel")
        if dt not in (torch.float32, torch.int64, torch.int32):
            L.fail(f"conversion to {dt}: kernels take float32 (and int32 indices)")
        if v.base.kind == "kv-cache" and node.func.overloadpacket.__name__ in ("clone", "_to_copy"):
            # A copy of a KV cache keeps what it holds now, through later writes.
            if L.plain(v):
                out = L.fresh("clone", v.dtype, v.shape)
                L.emit.launch("slice", [1, v.numel, 1, 0, v.numel, v.base, out.base], L.where)
                return [out]
            return [L.contiguous(v, "a copy of a KV cache")]
    return [v]


def _view_of(L: Lowerer, v: Any, shape: Tuple[int, ...]) -> Any:
    if isinstance(v, Scaled):
        return Scaled(_view_of(L, v.src, shape), v.factor)
    v = L.as_dev(v, "reshaped operand")
    st = view_strides(v.shape, v.strides, shape)
    if st is None:
        v = L.contiguous(v, "reshaped operand")
        st = contiguous_strides(shape)
    return Dev(v.base, shape, st, v.offset)


# In place, but on a value of torch's own making that nothing else reads
# (torch.matmul's result for a vector): a new view of it.
_IN_PLACE_VIEWS = ("squeeze_", "unsqueeze_")


@rule("view", "_unsafe_view", "_reshape_alias", "reshape", "unsqueeze", "squeeze", "flatten", "view_copy", "unflatten",
      *_IN_PLACE_VIEWS)
def _view(L, node, args, kwargs, runs):
    return [_view_of(L, args[0], L.out_shape(node))]


def _permuted(L: Lowerer, v: Any, perm: Sequence[int]) -> Any:
    if isinstance(v, Scaled):
        return Scaled(_permuted(L, v.src, perm), v.factor)
    v = L.as_dev(v, "permuted operand")
    return Dev(v.base, tuple(v.shape[p] for p in perm), tuple(v.strides[p] for p in perm), v.offset)


@rule("t", "transpose", "permute", "numpy_T")
def _transpose(L, node, args, kwargs, runs):
    v = args[0]
    n = len(node.outs[0].shape)
    perm = list(range(n))
    name = node.func.overloadpacket.__name__
    if name == "permute":
        perm = [_dim(L.const_int(p, "a permuted dimension"), n) for p in args[1]]
    elif n >= 2:
        a, b = (0, 1) if name in ("t", "numpy_T") else (_dim(L.const_int(args[1], "dim"), n), _dim(L.const_int(args[2], "dim"), n))
        perm[a], perm[b] = perm[b], perm[a]
    return [_permuted(L, v, perm)]


def _sliced(L: Lowerer, v: Any, dim: int, start: Any, length: int, drop: bool = False) -> Dev:
    v = L.as_dev(v, "sliced operand")
    dim = _dim(dim, len(v.shape))
    shape = list(v.shape)
    strides = list(v.strides)
    shape[dim] = length
    off = v.offset + Affine.of(start).times(v.strides[dim])
    if drop:
        del shape[dim], strides[dim]
    return Dev(v.base, tuple(shape), tuple(strides), off)


@rule("slice")
def _slice(L, node, args, kwargs, runs):
    v = args[0]
    dim = L.const_int(args[1] if len(args) > 1 else kwargs.get("dim", 0), "slice dimension")
    start = args[2] if len(args) > 2 else kwargs.get("start", 0)
    step = L.const_int(args[4] if len(args) > 4 else kwargs.get("step", 1), "slice step")
    if step != 1:
        L.fail(f"a slice with step {step}; only step 1 is supported")
    start = 0 if start is None else start
    shape = L.out_shape(node)
    dim = _dim(dim, len(shape))
    if not isinstance(start, Affine):
        # As torch does: from the end if negative, then clamped to the dimension.
        size = L.as_dev(v, "sliced operand").shape[dim]
        start = min(max(start + size if start < 0 else start, 0), size)
    return [_sliced(L, v, dim, start, shape[dim])]


@rule("select")
def _select(L, node, args, kwargs, runs):
    v = L.as_dev(args[0], "selected operand")
    dim = _dim(L.const_int(args[1], "select dimension"), len(v.shape))
    idx = args[2]
    if not isinstance(idx, Affine) and idx < 0:
        idx += v.shape[dim]
    return [_sliced(L, v, dim, idx, 1, drop=True)]


@rule("split", "split_with_sizes", "unbind", "chunk", "tensor_split")
def _split(L, node, args, kwargs, runs):
    v = L.as_dev(args[0], "split operand")
    name = node.func.overloadpacket.__name__
    if name == "unbind":
        dim = _dim(L.const_int(args[1] if len(args) > 1 else kwargs.get("dim", 0), "dim"), len(v.shape))
        return [_sliced(L, v, dim, i, 1, drop=True) for i in range(v.shape[dim])]
    dim = L.const_int(args[2] if len(args) > 2 else kwargs.get("dim", 0), "split dimension")
    dim = _dim(dim, len(v.shape))
    outs, start = [], 0
    for o in node.outs:
        n = o.shape[dim]
        outs.append(_sliced(L, v, dim, start, n))
        start += n
    return outs


@rule("expand")
def _expand(L, node, args, kwargs, runs):
    v = args[0]
    shape = L.out_shape(node)
    if isinstance(v, Scaled):
        return [Scaled(_expand(L, node, [v.src] + list(args[1:]), kwargs, runs)[0], v.factor)]
    v = L.as_dev(v, "expanded operand")
    if tuple(v.shape) == shape:
        return [v]
    lead = len(shape) - len(v.shape)
    strides = [0] * lead + [s if d == n else 0 for d, n, s in zip(v.shape, shape[lead:], v.strides)]
    return [Dev(v.base, shape, tuple(strides), v.offset)]


# ---- arithmetic


def _elementwise_operands(L: Lowerer, a: Dev, b: Dev, shape: Tuple[int, ...], what: str):
    """(rows, cols, a, b) for add/mul of a full-shape a and b, which is full
    too or one block broadcast over a's leading dimensions: fewer
    dimensions, dimensions of 1, or dimensions expanded (stride 0). b is
    then one row of cols (b_rows = 1): a full b is one row of all of a."""
    a = L.contiguous(a, what)
    n = math.prod(shape)
    # b right-aligned with shape; a dimension it repeats counts as 1.
    lead = len(shape) - len(b.shape)
    bs = [1] * lead + [1 if st == 0 else d for d, st in zip(b.shape, b.strides)]
    bst = [0] * lead + list(b.strides)
    k = len(shape)
    while k > 0 and bs[k - 1] == shape[k - 1]:
        k -= 1
    if any(d != 1 for d in bs[:k]):
        L.fail(f"{what}: broadcasting {list(b.shape)} to {list(shape)}: only a trailing block (a bias row) broadcasts")
    cols = math.prod(shape[k:])
    bb = Dev(b.base, tuple(shape[k:]) or (1,), tuple(bst[k:]) or (1,), b.offset)
    return n // cols, cols, a, L.contiguous(bb, what)


def _full(v: Dev, shape: Tuple[int, ...]) -> bool:
    """Whether v has an element of its own for each of shape's (not expanded)."""
    return v.numel == math.prod(shape) and all(s != 0 or d == 1 for d, s in zip(v.shape, v.strides))


def _binary(L: Lowerer, kernel: str, a: Any, b: Any, shape: Tuple[int, ...]) -> Dev:
    what = f"{kernel} operand"
    a, b = L.as_dev(a, what), L.as_dev(b, what)
    if not _full(a, shape) and _full(b, shape):
        a, b = b, a  # both kernels commute
    if not _full(a, shape):
        L.fail(f"{kernel}: broadcasting both operands ({list(a.shape)}, {list(b.shape)}) to {list(shape)} is not supported")
    rows, cols, a, b = _elementwise_operands(L, a, b, shape, what)
    out = L.fresh(kernel, F32, shape)
    L.emit.launch(kernel, [rows, cols, 1, a.base, b.base, out.base], L.where)
    return out


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@rule("add", "sub", "rsub")
def _add(L, node, args, kwargs, runs):
    a, b = args[0], args[1]
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    name = node.func.overloadpacket.__name__
    if name == "sub":
        alpha = -alpha
    elif name == "rsub":  # b - alpha * a (`1 - x` reaches aten as rsub(x, 1))
        a, alpha = Scaled(a, -float(alpha)), 1
    shape = L.out_shape(node)
    if _number(b):
        if b * alpha == 0:
            return [a]
        a = L.contiguous(a, "add operand")
        cols = shape[-1] if shape else 1
        out = L.fresh("add", F32, shape)
        L.emit.launch("add", [a.numel // cols, cols, 1, a.base, L.row(float(b * alpha), cols), out.base], L.where)
        return [out]
    if alpha != 1:
        b = Scaled(b, float(alpha))
    return [_binary(L, "add", a, b, shape)]


@rule("mul", "div", "neg", "true_divide")
def _mul(L, node, args, kwargs, runs):
    name = node.func.overloadpacket.__name__
    a = args[0]
    if name == "neg":
        return [Scaled(a, -1.0)]
    b = args[1]
    mode = kwargs.get("rounding_mode")
    if mode is not None:
        L.fail(f"division with rounding_mode={mode!r}")
    if _number(a) and not _number(b):
        a, b = b, a
    if _number(b):
        f = 1.0 / b if name in ("div", "true_divide") else float(b)
        if isinstance(a, Scaled):
            return [Scaled(a.src, a.factor * f)]
        return [Scaled(a, f)]
    if name in ("div", "true_divide"):
        if isinstance(b, Const) and not b.varies:
            b = Const([1.0 / b.values[0]])
        else:
            L.fail("division by a tensor computed on the device has no kernel (a reciprocal)")
    return [_binary(L, "mul", a, b, L.out_shape(node))]


# ---- matrix products


def _mat(L: Lowerer, v: Any, batch_ok: bool, what: str) -> Tuple[Handle, int, int]:
    """(handle, trans, batch) of a [batch,] rows x cols operand of matmul:
    laid out as is (trans 0), transposed (trans 1), or materialised; a
    weight broadcast over the batch gives batch 1 where batch_ok."""
    v = L.as_dev(v, what)
    shape, strides = list(v.shape), list(v.strides)
    if len(shape) == 2:
        shape, strides = [1] + shape, [0] + strides
    b, r, c = shape
    if b > 1 and strides[0] == 0 and batch_ok:
        one = Dev(v.base, (r, c), tuple(strides[1:]), v.offset)
        if L.plain(one):
            return v.base, 0, 1
        tr = Dev(v.base, (c, r), (strides[2], strides[1]), v.offset)
        if L.plain(tr):
            return v.base, 1, 1
    if L.plain(v):
        return v.base, 0, b
    tr = Dev(v.base, (b, c, r), (strides[0], strides[2], strides[1]), v.offset)
    if L.plain(tr):
        return v.base, 1, b
    return L.contiguous(v, what).base, 0, b


def _matmul(L: Lowerer, a: Any, b: Any, shape: Tuple[int, ...]) -> Dev:
    av, bv = L.as_dev(a, "matmul operand"), L.as_dev(b, "matmul operand")
    m, k = av.shape[-2], av.shape[-1]
    n = bv.shape[-1]
    batch = av.shape[0] if len(av.shape) == 3 else 1
    ha, ta, _ = _mat(L, av, False, "matmul left operand")
    hb, tb, bb = _mat(L, bv, True, "matmul right operand")
    out = L.fresh("matmul", F32, shape)
    L.emit.launch("matmul", [batch, m, n, k, ta, tb, bb, ha, hb, out.base], L.where)
    return out


@rule("mm", "bmm", "mv", "dot")
def _mm(L, node, args, kwargs, runs):
    a, b = args[0], args[1]
    fa = fb = 1.0
    if isinstance(a, Scaled):
        a, fa = a.src, a.factor
    if isinstance(b, Scaled):
        b, fb = b.src, b.factor
    shape = L.out_shape(node)
    if node.func.overloadpacket.__name__ in ("mv", "dot"):
        # A vector on the right is a matrix of one column; on the left (dot), of one row.
        a, b = L.as_dev(a, "matmul operand"), L.as_dev(b, "matmul operand")
        if len(a.shape) == 1:
            a = _view_of(L, a, (1, a.shape[0]))
        b = _view_of(L, b, (b.shape[0], 1))
        out = _matmul(L, a, b, (a.shape[0], 1))
        out = Dev(out.base, shape, contiguous_strides(shape), Affine.of(0))
    else:
        out = _matmul(L, a, b, shape)
    return [out if fa * fb == 1.0 else Scaled(out, fa * fb)]


@rule("addmm")
def _addmm(L, node, args, kwargs, runs):
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
        L.fail("addmm with alpha or beta other than 1")
    shape = L.out_shape(node)
    prod = _matmul(L, args[1], args[2], shape)
    bias = L.as_dev(args[0], "addmm bias")
    rows, cols, a, b = _elementwise_operands(L, prod, bias, shape, "addmm bias")
    L.emit.launch("add", [rows, cols, 1, a.base, b.base, a.base], L.where)  # in place: prod is the addmm's own
    return [prod]


# ---- rows


@rule("native_layer_norm")
def _layer_norm(L, node, args, kwargs, runs):
    x = L.contiguous(args[0], "layer_norm input")
    cols = math.prod(L.const_int(d, "normalized shape") for d in args[1])
    w = args[2] if args[2] is not None else Const([torch.ones(cols)])
    b = args[3] if args[3] is not None else Const([torch.zeros(cols)])
    w, b = L.contiguous(w, "layer_norm weight"), L.contiguous(b, "layer_norm bias")
    out = L.fresh("layer_norm", F32, x.shape)
    L.emit.launch("layer_norm", [x.numel // cols, cols, F32Arg(float(args[4])), x.base, w.base, b.base, out.base], L.where)
    miss = Missing("layer_norm's mean and inverse deviation are not computed on the device")
    return [out, miss, miss]


@rule("_softmax", "softmax")
def _softmax(L, node, args, kwargs, runs):
    v = args[0]
    shape = L.out_shape(node)
    dim = _dim(L.const_int(args[1], "softmax dimension"), len(shape))
    if dim != len(shape) - 1:
        L.fail(f"softmax over dimension {dim} of {len(shape)}; only the last is supported")
    scale, q, causal, offset = 1.0, 1, 0, Affine.of(0)
    while isinstance(v, (Scaled, Masked)):
        if isinstance(v, Scaled):
            scale *= v.factor
        else:
            if causal:
                L.fail("two masks on one softmax")
            if scale <= 0:
                # The kernel scales, then masks: the same only if the scale keeps -inf at -inf.
                L.fail(f"masked scores multiplied by {scale:g} before softmax; only a positive scale keeps the mask")
            q, causal, offset = v.q, 1, v.offset
        v = v.src
    x = L.contiguous(v, "softmax input")
    cols = shape[-1] if shape else 1
    out = L.fresh("softmax", F32, shape)
    L.emit.launch("softmax", [x.numel // cols, cols, q, causal, offset, F32Arg(scale), x.base, out.base], L.where)
    return [out]


@rule("masked_fill")
def _masked_fill(L, node, args, kwargs, runs):
    x, mask, value = args[0], args[1], args[2]
    if isinstance(value, Const):
        value = float(value.values[0])
    if not isinstance(mask, Const):
        L.fail("masked_fill with a mask computed on the device; only a constant causal mask is supported")
    if not (_number(value) and value <= _MASK_FILL_MAX):
        L.fail(f"masked_fill with value {value}; only -inf (or below {_MASK_FILL_MAX:g}) before a softmax is supported")
    shape = L.out_shape(node)
    if len(shape) < 2:
        L.fail("masked_fill of a tensor of fewer than 2 dimensions")
    q = shape[-2]
    offsets = [_causal_offset(L, m, shape) for m in mask.values]
    off = L.fit(offsets, "the causal mask's diagonal")
    if not off.const or off.add >= 0:
        return [Masked(x, q, off)]
    L.fail("a causal mask that hides column 0 of some row")


def _causal_offset(L: Lowerer, m: torch.Tensor, shape: Tuple[int, ...]) -> int:
    """off such that m (broadcast to shape) hides exactly the columns j > i + off of row i."""
    q, k = shape[-2], shape[-1]
    m = m.broadcast_to(shape).reshape(-1, q, k).to(torch.bool)
    first = m[0]
    if not all(torch.equal(first, x) for x in m[1:]):
        L.fail("masked_fill with a mask that differs across batch or head; only a causal mask is supported")
    known = None
    for i in range(q):
        row = first[i]
        hidden = row.nonzero().flatten()
        j0 = int(hidden[0]) if len(hidden) else k
        if not bool(row[j0:].all()) or bool(row[:j0].any()):
            L.fail("masked_fill with a mask that is not causal (row %d hides columns that are not a suffix)" % i)
        if j0 == k:
            continue  # nothing hidden: any offset from k - 1 - i up fits
        off = j0 - 1 - i
        if known is not None and known != off:
            L.fail("masked_fill with a mask that is not causal (its diagonal moves between rows)")
        known = off
    if known is None:
        known = k - 1  # nothing hidden in any row
    return known


@rule("gelu", "relu", "silu")
def _unary(L, node, args, kwargs, runs):
    name = node.func.overloadpacket.__name__
    x = L.contiguous(args[0], f"{name} input")
    out = L.fresh(name, F32, x.shape)
    extra: List[Any] = []
    if name == "gelu":
        approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
        if approx not in ("none", "tanh"):
            L.fail(f"gelu with approximate={approx!r}")
        extra = [1 if approx == "tanh" else 0]
    L.emit.launch(name, [x.numel] + extra + [x.base, out.base], L.where)
    return [out]


@rule("argmax")
def _argmax(L, node, args, kwargs, runs):
    x = L.contiguous(args[0], "argmax input")
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None or _dim(L.const_int(dim, "argmax dimension"), len(x.shape)) != len(x.shape) - 1:
        L.fail("argmax over other than the last dimension")
    cols = x.shape[-1]
    out = L.fresh("argmax", I32, L.out_shape(node))
    L.emit.launch("argmax", [x.numel // cols, cols, x.base, out.base], L.where)
    return [out]


# ---- gathers


@rule("embedding")
def _embedding(L, node, args, kwargs, runs):
    table = L.contiguous(args[0], "embedding table")
    ids = args[1]
    vocab, dim = table.shape
    shape = L.out_shape(node)
    if isinstance(ids, Const) and ids.varies:
        starts = []
        for t in ids.values:
            t = t.flatten()
            if len(t) == 0 or not torch.equal(t, torch.arange(int(t[0]), int(t[0]) + len(t), dtype=t.dtype)):
                L.fail("an embedding of indices that depend on a scalar input and are not a range (torch.arange(pos, pos + t))")
            starts.append(int(t[0]))
        n = ids.values[0].numel()
        out = L.fresh("embedding", F32, shape)
        L.emit.launch("slice", [1, vocab, dim, L.fit(starts, "the range's start"), n, table.base, out.base], L.where)
        return [out]
    idv = L.contiguous(ids, "embedding indices")
    if idv.dtype != I32:
        L.fail("embedding indices that are not integers")
    out = L.fresh("embedding", F32, shape)
    L.emit.launch("embedding", [idv.numel, vocab, dim, idv.base, table.base, out.base], L.where)
    return [out]


@rule("_embedding_bag", "_embedding_bag_forward_only")
def _embedding_bag(L, node, args, kwargs, runs):
    table = L.contiguous(args[0], "embedding_bag table")
    idx = L.contiguous(args[1], "embedding_bag indices")
    offs = L.contiguous(args[2], "embedding_bag offsets")
    mode = args[4] if len(args) > 4 else kwargs.get("mode", 0)
    psw = args[6] if len(args) > 6 else kwargs.get("per_sample_weights")
    last = args[7] if len(args) > 7 else kwargs.get("include_last_offset", False)
    if mode != 0 or psw is not None or last:
        L.fail("embedding_bag other than mode='sum' without per_sample_weights and include_last_offset")
    rows, dim = table.shape
    shape = L.out_shape(node)
    out = L.fresh("embedding_bag", F32, shape)
    L.emit.launch("embedding_bag_sum", [table.base, rows, dim, idx.base, idx.numel, offs.base, offs.numel, out.base], L.where)
    miss = Missing("embedding_bag's bookkeeping outputs are not computed on the device")
    return [out, miss, miss, miss]


@rule("cat", "concat")
def _cat(L, node, args, kwargs, runs):
    parts = [p for p in args[0] if not (isinstance(p, Dev) and p.numel == 0)]
    shape = L.out_shape(node)
    dim = _dim(L.const_int(args[1] if len(args) > 1 else kwargs.get("dim", 0), "cat dimension"), len(shape))
    outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    parts = [L.contiguous(p, "cat operand") for p in parts]
    if len(parts) > 1 and any(p.dtype != F32 for p in parts):
        L.fail("a concatenation of int32 ids: concat moves float32 only; pass the ids to forward concatenated")
    acc = parts[0]
    for p in parts[1:]:
        ma, mb = acc.numel // (outer * inner), p.numel // (outer * inner)
        nshape = list(shape)
        nshape[dim] = ma + mb
        out = L.fresh("cat", acc.dtype, nshape)
        L.emit.launch("concat", [outer, ma, mb, ma + mb, inner, acc.base, p.base, out.base], L.where)
        acc = out
    return [acc]


# ---- writes


@rule("copy_")
def _copy(L, node, args, kwargs, runs):
    """A write into a KV cache: rows start..start + len of one of its
    dimensions, across the others (a slice or a select of it), by
    kv_append."""
    dst, src = args[0], args[1]
    if not isinstance(dst, Dev) or dst.base.kind != "kv-cache":
        L.fail("an in-place copy into a tensor other than a module buffer (a KV cache)")
    cache = dst.base
    s = L.as_dev(src, "written value")
    if s.numel != dst.numel:
        L.fail(f"a write of shape {list(s.shape)} into a view of shape {list(dst.shape)} of buffer {cache.name}: "
               "broadcasting writes are not supported")
    # The view's dimensions in memory order, merged where contiguous: one
    # run (rows of the cache's first dimension), or outer runs, stride apart.
    dims = [(d, st) for d, st in zip(dst.shape, dst.strides) if d != 1]
    if any(a[1] <= b[1] for a, b in zip(dims, dims[1:])):
        L.fail(f"a write to a permuted view of buffer {cache.name}")
    groups: List[List[int]] = []
    for d, st in dims:
        if groups and groups[-1][1] == d * st:
            groups[-1] = [groups[-1][0] * d, st]
        else:
            groups.append([d, st])
    run = groups[-1][0] if groups else 1
    outer, stride = groups[0] if len(groups) == 2 else (1, cache.numel)
    if (groups and groups[-1][1] != 1) or len(groups) > 2 or outer * stride != cache.numel:
        L.fail(f"a write to a view of shape {list(dst.shape)} of buffer {cache.name} {list(_cache_shape(L, dst))}: "
               "only a slice along one dimension")
    unit = math.gcd(run, stride, dst.offset.mul, dst.offset.add)
    L.before_write(cache)
    s = L.contiguous(s, "written value")
    L.emit.launch("kv_append", [outer, stride // unit, run // unit, unit, dst.offset.div(unit), s.base, cache], L.where)
    return [dst]


def _cache_shape(L: Lowerer, v: Dev) -> Tuple[int, ...]:
    shape = getattr(v.base, "shape", None)
    if shape is None:
        L.fail(f"a write into {v.base.name}, which is not a module buffer")
    return tuple(shape)


# ---- control flow on values the device computes


_HOST_READS = ("_local_scalar_dense", "is_nonzero", "equal", "allclose", "item")


@rule(*_HOST_READS)
def _data_dependent(L, node, args, kwargs, runs):
    L.fail("data-dependent control flow or a read of a value on the host (.item(), if tensor:): the graph would keep "
           "the branch the example took; compute it outside the module or with tensor operations")


@rule("zeros_like", "ones_like", "full_like", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty")
def _like(L, node, args, kwargs, runs):
    return [Const([r[0] for r in runs])]
