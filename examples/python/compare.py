"""Graph against op by op: the same torch GPT decoding on a vGPU both ways.

For each decode step of a greedy generation it measures, in one run,
three ways of running the model on the same mediator:

  graph      vgpu.torch.remote: the prefill and decode graphs, weights and
             KV cache registered once with their meaning; a step is one
             invocation.
  op-by-op   vgpu.torch.eager: each aten operation dispatched as it comes,
             one launch request per kernel, pipelined, weights uploaded
             once and activations pooled, no graph and no meaning — what a
             remoting layer under the framework sees. Its step time
             includes the host's work of dispatching each op in Python.
  replay     the launches of one op-by-op decode step, recorded and sent
             again by a loop that does nothing else: the same requests at
             the speed of the thinnest client, so what remains is the
             protocol's cost of a request per kernel.

and prints, per decode step: requests sent, round trips waited for, bytes
on the tenant's socket and on the mediator's link to the node (frames,
both ways, as the mediator counts them), and step time, each the median
over the steps. The runs repeat
(--runs) with the three interleaved, and the step-time ratios are reported
as median and range over the runs, because these machines are noisy.
Every way must generate the same tokens as CPU torch, or the run fails.

    VGPU_SOCKET=/run/vgpu/mediator.sock python3 examples/python/compare.py --tenant t1 [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vgpu  # noqa: E402
import vgpu.torch  # noqa: E402
from vgpu.torch.eager import eager  # noqa: E402

import gpt  # noqa: E402


def _link_bytes(c: "vgpu.Client") -> Tuple[int, int]:
    """Bytes of frames so far on the tenant's socket and on the mediator's
    links to nodes, both ways, as the mediator counts them."""
    st = c.stats()
    return st.socket_in + st.socket_out, st.net_in + st.net_out


def measure(name: str, c: "vgpu.Client", step: Callable[[int, int], Any], first: int, start: int, n: int) -> Dict[str, Any]:
    """Runs n greedy decode steps from token first at position start and
    measures each: its time, and the requests, waits and link bytes it
    took (counted between steps, less what the counting itself costs).
    The figures are medians over the steps, so that the first step's
    warm-up (a pool's first allocations) does not count."""
    b = _link_bytes(c)
    stats_bytes = _link_bytes(c)[0] - b[0]  # what one stats call adds to the socket by itself
    times, reqs, waits, link, node, tokens, tok = [], [], [], [], [], [], first
    for i in range(n):
        b0, r0, w0 = _link_bytes(c), c.requests, c.waits
        t = time.perf_counter()
        logits = step(tok, start + i)
        times.append(time.perf_counter() - t)
        b1 = _link_bytes(c)
        reqs.append(c.requests - r0 - 1)  # less the stats call
        waits.append(c.waits - w0 - 1)
        link.append(b1[0] - b0[0] - stats_bytes)
        node.append(b1[1] - b0[1])
        tok = int(logits[0, -1].argmax())
        tokens.append(tok)
    return {
        "mode": name,
        "step_ms": statistics.median(times) * 1e3,
        "requests_per_step": statistics.median(reqs),
        "waits_per_step": statistics.median(waits),
        "link_bytes_per_step": statistics.median(link),
        "node_bytes_per_step": statistics.median(node),
        "tokens": tokens,
    }


def run_once(args: argparse.Namespace, model: torch.nn.Module, prompt: torch.Tensor, want: List[int]) -> Dict[str, Dict[str, Any]]:
    t = prompt.shape[1]
    out: Dict[str, Dict[str, Any]] = {}
    with vgpu.Client(socket=args.socket, tenant=args.tenant) as c:
        g = vgpu.torch.remote(model, (prompt, 0), decode_inputs=(prompt[:, :1], t), client=c)
        first = int(g(prompt, 0)[0, -1].argmax())
        out["graph"] = measure("graph", c, lambda tok, pos: g(torch.tensor([[tok]]), pos), first, t, args.steps)
        g.close()
    with vgpu.Client(socket=args.socket, tenant=args.tenant) as c:
        e = eager(model, (prompt, 0), c)
        first = int(e(prompt, 0)[0, -1].argmax())
        out["op-by-op"] = measure("op-by-op", c, lambda tok, pos: e(torch.tensor([[tok]]), pos), first, t, args.steps)
        # One decode step's launches, recorded, then replayed by a bare loop.
        logits, launches, outputs = e.record(torch.tensor([[first]]), t)
        out_addr, out_len = outputs[0]

        def replay(tok: int, pos: int) -> torch.Tensor:
            for kernel, kargs in launches:
                c.stream.launch(kernel, *kargs)
            host = torch.empty(out_len, dtype=torch.float32)
            c.stream.copy_from_device(out_addr, host.numpy())
            c.stream.synchronize()
            return logits  # the recorded step's: replay measures the requests, not the tokens

        out["replay"] = measure("replay", c, replay, first, t, args.steps)
        out["replay"]["tokens"] = None
        e.close()
    for mode in ("graph", "op-by-op"):
        if out[mode]["tokens"] != want:
            raise SystemExit(f"{mode} generated {out[mode]['tokens']}, CPU torch {want}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", default=None, help="mediator socket (default $VGPU_SOCKET, else /run/vgpu/mediator.sock)")
    p.add_argument("--tenant", default=os.environ.get("VGPU_TENANT", "bench"))
    p.add_argument("--steps", type=int, default=32, help="decode steps per run")
    p.add_argument("--runs", type=int, default=10, help="repetitions, for the spread")
    p.add_argument("--prompt", type=int, default=8, help="prompt tokens")
    p.add_argument("--out", default=None, help="directory to write torch-compare.json and .txt into")
    p.add_argument("--command", default="python3 examples/python/compare.py", help="the command line recorded in the output")
    args = p.parse_args()

    model = gpt.make_model(seed=0)
    prompt = torch.randint(0, model.tok.num_embeddings, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    cpu = gpt.make_model(seed=0)
    with torch.no_grad():
        first = int(cpu(prompt, 0)[0, -1].argmax())
        want, tok = [], first
        for i in range(args.steps):
            tok = int(cpu(torch.tensor([[tok]]), args.prompt + i)[0, -1].argmax())
            want.append(tok)

    runs = [run_once(args, model, prompt, want) for _ in range(args.runs)]
    modes = ["graph", "op-by-op", "replay"]
    lines = [f"GPT decoder (vocab {model.tok.num_embeddings}, d {model.tok.embedding_dim}, {len(model.blocks)} layers, "
             f"capacity {model.capacity}), prompt {args.prompt}, {args.steps} greedy decode steps, {args.runs} runs, torch {torch.__version__}",
             "", f"{'per decode step':<18}" + "".join(f"{m:>14}" for m in modes)]
    for key, label, fmt in (("requests_per_step", "requests", "{:>14.1f}"), ("waits_per_step", "round trips", "{:>14.1f}"),
                            ("link_bytes_per_step", "socket bytes", "{:>14.0f}"),
                            ("node_bytes_per_step", "node link bytes", "{:>14.0f}"), ("step_ms", "step ms (median)", "{:>14.3f}")):
        vals = [statistics.median(r[m][key] for r in runs) for m in modes]
        lines.append(f"{label:<18}" + "".join(fmt.format(v) for v in vals))
    ratios = {}
    for base in ("op-by-op", "replay"):
        rs = sorted(r["graph"]["step_ms"] / r[base]["step_ms"] for r in runs)
        ratios[f"graph/{base}"] = {"median": statistics.median(rs), "min": rs[0], "max": rs[-1], "runs": rs}
        lines.append(f"step time graph/{base}: median {statistics.median(rs):.3f}, range {rs[0]:.3f}-{rs[-1]:.3f} over {len(rs)} runs")
    lines.append("graph and op-by-op tokens equal CPU torch's in every run")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "torch-compare.txt"), "w") as f:
            f.write(f"$ {args.command}\n{text}\n")
        with open(os.path.join(args.out, "torch-compare.json"), "w") as f:
            json.dump({"command": args.command, "torch": torch.__version__, "steps": args.steps, "ratios": ratios,
                       "runs": [{m: {k: v for k, v in r[m].items() if k != "tokens"} for m in modes} for r in runs]}, f, indent=1)


if __name__ == "__main__":
    main()
