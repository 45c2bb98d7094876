"""Capture: what a torch module does, as a list of aten operations.

`capture` runs the module's forward once on CPU, for real, on the example
inputs, under a `TorchDispatchMode` that records every aten operation that
reaches the dispatcher: its overload, its arguments (tensors replaced by
references), its outputs and the line of model code that called it. Tracing
through the dispatcher, not symbolically, is what lets ordinary Python in
`forward` work — shape unpacking, `split`, loops over layers — and the real
execution gives every value of the example (the constants folded later, the
shapes of everything).

This is the one place that depends on how a torch version exposes the
dispatcher (`torch.utils._python_dispatch.TorchDispatchMode`, present in
1.13 and 2.x) and module state (`functional_call`). Nothing here talks to a
mediator.

Invariants:
  - The module is not modified: its buffers are swapped for clones during
    the run, so a forward that writes a KV cache writes the clones.
  - Every tensor a node refers to is kept alive by the trace, so Python
    object ids, which name tensors while recording, are never reused.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import InvalidArgument

# Frames in these directories are library code, not the model's: a node's
# location is the innermost frame outside them.
_LIBRARY_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.__file__) + os.sep,
)


class TraceError(InvalidArgument):
    """The model cannot be captured or lowered: the message says what and where."""


@dataclass(frozen=True)
class Ref:
    """A tensor argument: a leaf ("param", "buffer", "input", "const") or a
    node's output ("node"), with its name or (node, output) index."""

    kind: str
    key: Any


@dataclass
class Node:
    """One aten operation of a trace."""

    func: Any  # torch._ops.OpOverload
    args: Tuple[Any, ...]  # tensors replaced by Ref
    kwargs: Dict[str, Any]
    outs: List[Optional[torch.Tensor]]  # flattened outputs; None where not a tensor
    out_spec: Any  # pytree spec of the outputs
    where: str  # "file.py:42: code" of the model line that called it

    @property
    def name(self) -> str:
        return str(self.func)


@dataclass
class Trace:
    """One run of a forward: its nodes, leaves and outputs."""

    nodes: List[Node] = field(default_factory=list)
    params: Dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: Dict[str, torch.Tensor] = field(default_factory=dict)  # the clones the run used
    inputs: List[torch.Tensor] = field(default_factory=list)
    consts: List[torch.Tensor] = field(default_factory=list)  # tensors from outside the module's state
    outputs: List[Any] = field(default_factory=list)  # flattened: Ref, or a non-tensor value
    out_spec: Any = None
    mutated: Dict[str, str] = field(default_factory=dict)  # buffer name -> where it is first written

    def value(self, ref: Ref) -> torch.Tensor:
        """The example value of ref in this run."""
        if ref.kind == "node":
            n, i = ref.key
            return self.nodes[n].outs[i]
        if ref.kind == "param":
            return self.params[ref.key]
        if ref.kind == "buffer":
            return self.buffers[ref.key]
        if ref.kind == "input":
            return self.inputs[ref.key]
        return self.consts[ref.key]


def _where() -> str:
    """The innermost frame of model code on the stack, as "file:line: code"."""
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_LIBRARY_DIRS) and not fn.startswith("<"):
            line = linecache.getline(fn, f.f_lineno).strip()
            return f"{os.path.basename(fn)}:{f.f_lineno}: {line}"
        f = f.f_back
    return "(no model code on the stack)"


# Operations that write their first argument in place.
def _mutates(func: Any) -> bool:
    schema = func._schema
    return bool(schema.arguments) and schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write


class _Recorder(TorchDispatchMode):
    """Records each aten call into a Trace, naming tensors by object id."""

    def __init__(self, trace: Trace, names: Dict[int, Ref]):
        super().__init__()
        self.trace = trace
        self.names = names  # id(tensor) -> Ref
        self.bases: Dict[int, str] = {}  # id(view of a buffer) -> buffer name

    def _ref(self, t: torch.Tensor) -> Ref:
        r = self.names.get(id(t))
        if r is None:
            # A tensor from outside the module's state and the inputs: a
            # constant (a plain attribute, a literal torch.tensor).
            self.trace.consts.append(t.detach().clone())
            r = Ref("const", len(self.trace.consts) - 1)
            self.names[id(t)] = r
        return r

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        where = _where()
        flat, spec = pytree.tree_flatten((args, kwargs))
        refs = [self._ref(a) if isinstance(a, torch.Tensor) else a for a in flat]
        out = func(*args, **kwargs)
        rargs, rkwargs = pytree.tree_unflatten(refs, spec)
        outs, out_spec = pytree.tree_flatten(out)
        n = len(self.trace.nodes)
        kept = []
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                self.names[id(o)] = Ref("node", (n, i))
                kept.append(o)
            else:
                kept.append(None)
        self.trace.nodes.append(Node(func, tuple(rargs), dict(rkwargs), kept, out_spec, where))
        self._note_buffer_writes(func, flat, refs, outs, where)
        return out

    def _note_buffer_writes(self, func: Any, flat: List[Any], refs: List[Any], outs: List[Any], where: str) -> None:
        """Follows views of buffers, so that a write through one marks the
        buffer. refs are flat's names before the call: an in-place
        operation's output, its first argument itself, is named since as
        the node's."""
        first = flat[0] if flat else None
        if not isinstance(first, torch.Tensor):
            return
        base = self.bases.get(id(first))
        r = refs[0]
        if base is None and r.kind == "buffer":
            base = r.key
        if base is None:
            return
        if _mutates(func):
            self.trace.mutated.setdefault(base, where)
        for o in outs:
            if isinstance(o, torch.Tensor) and _storage(o) == _storage(first):
                self.bases[id(o)] = base


def _storage(t: torch.Tensor) -> int:
    """The address of t's storage: views of one tensor share it."""
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return st.data_ptr()


def functional_call(module: torch.nn.Module, state: Dict[str, torch.Tensor], args: Sequence[Any]) -> Any:
    """module(*args) with its parameters and buffers replaced by state."""
    func = getattr(getattr(torch, "func", None), "functional_call", None)
    if func is None:
        from torch.nn.utils import stateless

        func = stateless.functional_call
    return func(module, state, tuple(args))


def capture(module: torch.nn.Module, args: Sequence[Any]) -> Trace:
    """Runs module(*args) on CPU under the recorder and returns its trace.

    Tensor arguments become the trace's inputs (in order); other arguments
    are passed as they are. Gradients are off: this captures inference.
    """
    trace = Trace()
    names: Dict[int, Ref] = {}
    params = dict(module.named_parameters())
    for name, p in params.items():
        t = p.detach()
        trace.params[name] = t
        names[id(t)] = Ref("param", name)
    for name, b in module.named_buffers():
        t = b.detach().clone()
        trace.buffers[name] = t
        names[id(t)] = Ref("buffer", name)
    call_args = []
    for a in args:
        if isinstance(a, torch.Tensor):
            t = a.detach()
            names[id(t)] = Ref("input", len(trace.inputs))
            trace.inputs.append(t)
            call_args.append(t)
        else:
            call_args.append(a)
    state = {**trace.params, **trace.buffers}
    rec = _Recorder(trace, names)
    with torch.no_grad(), rec:
        out = functional_call(module, state, call_args)
    outs, trace.out_spec = pytree.tree_flatten(out)
    for o in outs:
        if isinstance(o, torch.Tensor):
            r = names.get(id(o))
            if r is None:
                raise TraceError(f"an output of {type(module).__name__}.forward is a tensor made outside the traced operations")
            trace.outputs.append(r)
        else:
            trace.outputs.append(o)
    return trace
