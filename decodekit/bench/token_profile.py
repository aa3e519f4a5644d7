"""Where a decoded token's time goes, and how far it is from the memory-bandwidth bound.

Plain greedy decoding of one prompt under ``torch.profiler``, eager or compiled (``dk.generate``'s ``compile=``),
split into the linear layers (eager: ``aten::linear``, the oneDNN kernels), attention, the compiled step (its own
kernels, linear layers included, in one region) and everything else (the loop, sampling, the cache's bookkeeping).
The bound: a token reads every weight once (``weight_mb``; the output head reads the embedding table when they
are tied), so at the machine's read bandwidth (a timed sum over a 512 MB tensor) it cannot take less than
``bound_ms``.

    python -m decodekit.bench.token_profile [--model smollm2-135m-instruct] [--kernels onednn|none]
        [--compile false|true|max-autotune] [--tokens 32]

docs/benchmarks.md ("Compiled forwards on the CPU") has our numbers.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

import decodekit as dk

CATEGORIES = {  # profiler event (its name's start) -> category; an event inside a listed one counts for the outer
    "Torch-Compiled Region": "compiled step",
    "aten::linear": "linear layers",
    "mkldnn::_linear_pointwise": "linear layers",
    "aten::scaled_dot_product_attention": "attention",
}


def read_bandwidth(megabytes: int = 512, repeats: int = 3) -> float:
    """The machine's read bandwidth in GB/s: the best of ``repeats`` timed sums over a float32 tensor of
    ``megabytes`` MB (larger than any cache, so it streams from memory)."""
    x = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best / 1e9


def weight_bytes(model: Any) -> int:
    """Bytes of the weights a token reads: each parameter once (a tied embedding and output head once)."""
    return sum(p.numel() * p.element_size() for p in model.hf.parameters())


def split(events: list[Any]) -> dict[str, float]:
    """Milliseconds per category (:data:`CATEGORIES`) from profiler ``events``: each listed event's total time,
    unless it runs inside another listed event (counted there)."""
    out = dict.fromkeys(CATEGORIES.values(), 0.0)
    for event in events:
        category = _category(event.name)
        if category is None:
            continue
        parent = event.cpu_parent
        while parent is not None and _category(parent.name) is None:
            parent = parent.cpu_parent
        if parent is None:
            out[category] += event.cpu_time_total / 1e3
    return out


def _category(name: str) -> str | None:
    return next((category for start, category in CATEGORIES.items() if name.startswith(start)), None)


def token_profile(model: Any, prompt: list[int], tokens: int = 32, compile: bool | str = False) -> dict[str, Any]:
    """Profile ``tokens`` greedy tokens of plain decoding of ``prompt`` (after an unprofiled warm-up call, which
    compiles). Returns ``ms_per_token`` (wall clock, profiler included), the categories' ms per token (``other`` the
    rest), ``weight_mb``, ``bandwidth_gbs`` (measured), ``bound_ms`` (weights / bandwidth) and ``of_bound`` (the
    bound's share of a token's time: 1.0 would be streaming the weights at the machine's bandwidth)."""
    from torch.profiler import ProfilerActivity, profile

    kwargs = dict(max_new_tokens=tokens, temperature=0.0, eos_token_id=(), compile=compile)
    dk.generate(model, [prompt], **kwargs)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        dk.generate(model, [prompt], **kwargs)
        wall = (time.perf_counter() - start) * 1e3 / tokens
    parts = {name: ms / tokens for name, ms in split(prof.events()).items()}
    parts["other"] = max(wall - sum(parts.values()), 0.0)
    bandwidth = read_bandwidth()
    megabytes = weight_bytes(model) / 1e6
    bound = megabytes / bandwidth  # MB / (GB/s) = ms
    return dict(
        ms_per_token=wall, **parts, weight_mb=megabytes, bandwidth_gbs=bandwidth, bound_ms=bound, of_bound=bound / wall
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--kernels", default="none", help="onednn, int8 or none (stock)")
    parser.add_argument("--compile", default="false", help="false, true or max-autotune")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args(argv)
    compile_arg = {"false": False, "true": True}.get(args.compile, args.compile)
    model = dk.load_model(args.model, kernels=None if args.kernels == "none" else args.kernels)
    prompt = model.tokenizer('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n').input_ids
    result = token_profile(model, prompt, args.tokens, compile_arg)
    print(f"{args.model}, kernels={args.kernels}, compile={args.compile}: {result['ms_per_token']:.1f} ms a token")
    for name in (*CATEGORIES.values(), "other"):
        if result[name]:
            print(f"  {name:14s} {result[name]:6.1f} ms")
    print(
        f"  bound: {result['weight_mb']:.0f} MB of weights at {result['bandwidth_gbs']:.1f} GB/s = "
        f"{result['bound_ms']:.1f} ms ({100 * result['of_bound']:.0f}% of the token's time)"
    )


if __name__ == "__main__":
    main()
