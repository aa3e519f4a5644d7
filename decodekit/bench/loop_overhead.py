"""What the speculative loop itself costs, on random models where loop overhead dominates.

Prints, from one run: decodekit's autoregressive decoding vs transformers' own greedy ``generate`` on the same
model (the loop must not cost more than transformers'), and speculative decoding with a draft identical to the
target (every token accepted: mean acceptance length k + 1) and with an unrelated draft (almost nothing
accepted), so the cost of drafting, verifying and bookkeeping shows directly. ``--compile`` adds the same calls
with ``compile=True`` (decodekit/models/compiled.py) and transformers' static cache + ``torch.compile``: on a GPU,
where an eager forward is bound by kernel launches, ``--device cuda --sizes smollm2 --compile`` measures issue 55's
plain-decoding goals on SmolLM2-135M's shape with random weights (a forward's cost does not depend on the weights'
values), with nothing to download or carry but the package.

    python -m decodekit.bench.loop_overhead [--tokens 200] [--k 4] [--repeats 5] [--sizes tiny small]
        [--device cpu] [--compile] [--dlm]

``--dlm`` adds the diffusion half's forwards on the same model (eager and compiled: issue 55's "DLM forwards >= 5x
faster" on a GPU).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch

import decodekit as dk
from decodekit.models.tiny import tiny_llama
from decodekit.timing import median_time

SIZES = {  # name -> (title, tiny_llama's arguments)
    "tiny": ("tiny (d=64, 2 layers, V=128)", dict(hidden=64, layers=2, vocab=128)),
    "small": ("small (d=256, 4 layers, V=4096)", dict(hidden=256, layers=4, vocab=4096)),
    "smollm2": (
        "SmolLM2-135M's shape (d=576, 30 layers, 9 / 3 heads, V=49152), random weights",
        dict(hidden=576, layers=30, vocab=49152, init=0.02, intermediate_size=1536, num_attention_heads=9,
             num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5),
    ),
}  # fmt: skip


@dataclass
class Row:
    method: str
    batch: int
    seconds: float
    tokens: int
    stats: dk.SpecStats | None = None

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.seconds * self.batch / self.tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def measure(size: dict, tokens: int, k: int, repeats: int, batch: int, device: str, compile: bool) -> list[Row]:
    """Every row of one table: the calls of one model size at one batch size (module docstring)."""
    from decodekit.bench.methods import Setting, TransformersBaseline

    target = dk.load_model(tiny_llama(0, max_position_embeddings=1024, **size), device=device)
    unrelated = dk.load_model(tiny_llama(1, max_position_embeddings=1024, **size), device=device)
    prompts = [list(range(1, 33))] * batch  # same length: transformers needs no padding
    new, greedy = tokens * batch, Setting(name="greedy")

    def hf(kind: str) -> float:
        """The median wall time of transformers' ``generate`` of ``kind`` (its first call warms up, or compiles)."""
        baseline = TransformersBaseline(kind, kind=kind)  # type: ignore[arg-type]
        walls = [baseline.generate(target, prompts, greedy, tokens, 0).wall_s for _ in range(repeats + 1)]
        return statistics.median(walls[1:])

    def ours(drafter=None, compiled=False):
        return lambda: dk.generate(
            target, prompts, drafter, policy=dk.policies.FixedLength(k), max_new_tokens=tokens, eos_token_id=(),
            compile=compiled,
        )  # fmt: skip

    timed = {"device": target.device, "repeats": repeats}
    rows = [Row("transformers generate (greedy)", batch, hf("greedy"), new)]
    if compile:
        rows.append(Row("transformers static cache + compile", batch, hf("static_compiled"), new))
    calls = [  # (row, drafter, compiled): the compiled rows only with --compile
        ("decodekit autoregressive", None, False),
        ("decodekit autoregressive, compile=True", None, True),
        (f"decodekit spec, draft = target, k={k}", dk.drafters.ModelDrafter(target), False),
        (f"decodekit spec, draft = target, k={k}, compile=True", dk.drafters.ModelDrafter(target), True),
        (f"decodekit spec, unrelated draft, k={k}", dk.drafters.ModelDrafter(unrelated), False),
    ]
    for name, drafter, compiled in (c for c in calls if compile or not c[2]):
        out, seconds = median_time(ours(drafter, compiled), **timed)  # the warm-up call compiles
        rows.append(Row(name, batch, seconds, new, out.stats))
    return rows


def report(title: str, rows: list[Row]) -> str:
    ar = next(r for r in rows if r.method == "decodekit autoregressive")
    lines = [
        f"\n{title}, batch {rows[0].batch}",
        "| method | tok/s | ms/token | vs transformers | vs decodekit AR | mean acc. len | "
        "draft / verify / other ms/token |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        split = acc = "-"
        if r.stats is not None:
            s = r.stats
            per = 1000 * r.batch / r.tokens
            split = f"{s.draft_time_s * per:.3f} / {s.verify_time_s * per:.3f} / {s.other_time_s * per:.3f}"
            acc = f"{s.mean_acceptance_length:.2f}"
        lines.append(
            f"| {r.method} | {r.tokens_per_s:.0f} | {r.ms_per_token:.3f} | {rows[0].seconds / r.seconds:.2f}x | "
            f"{ar.seconds / r.seconds:.2f}x | {acc} | {split} |"
        )
    return "\n".join(lines)


def measure_dlm(title: str, size: dict, repeats: int, batch: int, device: str, compile: bool) -> str:
    """The diffusion half on the same model as a DLM (the last id the mask): ``dk.dlm.generate`` (LLaDA's rule, 64
    tokens in blocks of 32, 64 steps) recomputing every forward and with the dual cache, eager and, with
    ``compile``, compiled; a table of time per model forward."""
    dlm = dk.dlm.load_model(tiny_llama(0, max_position_embeddings=1024, **size), mask_token_id=size["vocab"] - 1,
                            device=device)  # fmt: skip
    prompts = [list(range(1, 33))] * batch
    lines = [
        f"\n{title} as a diffusion LM, batch {batch}: 64 tokens, blocks of 32, 64 steps",
        "| cache | compile | s a call | forwards | ms a forward | vs eager |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for cache in ("recompute", "dual"):
        eager_ms = None
        for compiled in (False, True) if compile else (False,):

            def call(cache=cache, compiled=compiled):
                parts = {} if cache == "recompute" else {"cache": dk.build("dlm_cache", cache)}
                return dk.dlm.generate(dlm, prompts, gen_length=64, block_length=32, steps=64, compile=compiled,
                                       **parts)  # fmt: skip

            out, seconds = median_time(call, device=dlm.lm.device, repeats=repeats)  # the warm-up call compiles
            forwards = out.stats.nfe
            ms = 1000 * seconds / forwards
            eager_ms = eager_ms or ms
            lines.append(f"| {cache} | {compiled} | {seconds:.3f} | {forwards} | {ms:.2f} | {eager_ms / ms:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=200, help="new tokens per row")
    parser.add_argument("--k", type=int, default=4, help="draft length")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (median reported)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=list(SIZES))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--compile", action="store_true", help="also the compiled calls (compile=True)")
    parser.add_argument("--dlm", action="store_true", help="also the diffusion half's forwards (measure_dlm)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}; ms/token = wall time / tokens per row")
    for name in args.sizes:
        title, size = SIZES[name]
        for batch in args.batch:
            rows = measure(size, args.tokens, args.k, args.repeats, batch, args.device, args.compile)
            print(report(title, rows), flush=True)
            if args.dlm:
                print(measure_dlm(title, size, args.repeats, batch, args.device, args.compile), flush=True)


if __name__ == "__main__":
    main()
