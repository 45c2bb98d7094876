"""vgpu.torch: ordinary torch modules on a vGPU, with their meaning.

    import vgpu.torch
    gpt = vgpu.torch.remote(model, (prompt, 0), decode_inputs=(token, 8))
    logits = gpt(prompt, 0)          # prefill graph: one round trip
    logits = gpt(next_token, 8)      # decode graph, same weights and KV cache

`remote` captures the module through the dispatcher (capture.py), lowers
its aten operations to the kernel catalog with each tensor's meaning —
parameters are weights, buffers forward writes are KV caches, the rest
activations — and each graph's phase (lower.py, remote.py), and runs it as
tensor graphs of the vgpu protocol. docs/torch.md lists the operations
that run.
"""

from .capture import TraceError
from .remote import RemoteModule, remote

__all__ = ["remote", "RemoteModule", "TraceError"]
