"""What the speculative loop itself costs, on tiny random models where loop overhead dominates.

Prints, from one run: decodekit's autoregressive decoding vs transformers' own greedy ``generate`` on the same
model (the loop must not cost more than transformers'), and speculative decoding with a draft identical to the
target (every token accepted: mean acceptance length k + 1) and with an unrelated draft (almost nothing
accepted), so the cost of drafting, verifying and bookkeeping shows directly.

    python -m decodekit.bench.loop_overhead [--tokens 200] [--k 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

import decodekit as dk
from decodekit.models.tiny import tiny_llama
from decodekit.timing import median_time

SIZES = {
    "tiny (d=64, 2 layers, V=128)": dict(hidden=64, layers=2, vocab=128),
    "small (d=256, 4 layers, V=4096)": dict(hidden=256, layers=4, vocab=4096),
}


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


def measure(size: dict, tokens: int, k: int, repeats: int, batch: int) -> list[Row]:
    target = tiny_llama(0, max_position_embeddings=1024, **size)
    unrelated = tiny_llama(1, max_position_embeddings=1024, **size)
    prompts = [list(range(1, 33))] * batch  # same length: transformers needs no padding
    new = tokens * batch

    def hf() -> None:
        target.generate(
            torch.tensor(prompts), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0
        )

    def ours(drafter=None):
        return lambda: dk.generate(
            target, prompts, drafter, policy=dk.policies.FixedLength(k), max_new_tokens=tokens, eos_token_id=()
        )

    rows = [Row("transformers generate (greedy)", batch, median_time(hf, repeats=repeats)[1], new)]
    for name, drafter in (
        ("decodekit autoregressive", None),
        (f"decodekit spec, draft = target, k={k}", dk.drafters.ModelDrafter(target)),
        (f"decodekit spec, unrelated draft, k={k}", dk.drafters.ModelDrafter(unrelated)),
    ):
        out, seconds = median_time(ours(drafter), repeats=repeats)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=200, help="new tokens per row")
    parser.add_argument("--k", type=int, default=4, help="draft length")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (median reported)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms/token = wall time / tokens per row")
    for title, size in SIZES.items():
        for batch in args.batch:
            print(report(title, measure(size, args.tokens, args.k, args.repeats, batch)))


if __name__ == "__main__":
    main()
