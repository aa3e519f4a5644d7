"""Lossless verifiers compared on the same drafts: each one's expected acceptance length, paired.

Two sampled runs with different verifiers follow different texts, so their mean acceptance lengths differ by
several tenths of a token from run to run, more than the verifiers' true differences. Here one ``generate`` call
per drafter verifies every round with a primary verifier (which decides the text) and, on the very same draft and
target logits, runs each compared verifier ``repeats`` times with its own seeded generators (the same seeds for
every verifier: common random numbers). Their mean accepted tokens per row and round estimate each verifier's
expected acceptance length on identical contexts and drafts, and the paired differences have a small standard
error after a few hundred rounds.

    python -m decodekit.bench.verifier_order --prompts 8 --tokens 64 --repeats 16

(CPU: about 10 minutes per temperature with the int8 SmolLM2 draft model; ``docs/benchmarks.md``.)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from decodekit.checks import check_int
from decodekit.draft import Draft
from decodekit.errors import ConfigError
from decodekit.interfaces import Verifier
from decodekit.sampling import Generator
from decodekit.types import SamplingParams, Verdict


@dataclass
class PairedVerifiers:
    """A verifier that decides with ``verifiers[primary]`` and measures every verifier of ``verifiers`` on the same
    draft and logits, ``repeats`` times each (diagnostic: one host read per verifier and repeat).

    Attributes:
        samples: per verifier, one value per row and round: its mean accepted draft tokens over the repeats.
    """

    verifiers: Mapping[str, Verifier]
    primary: str
    repeats: int = 16
    seed: int = 0
    samples: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0

    def __post_init__(self) -> None:
        if self.primary not in self.verifiers:
            raise ConfigError(f"primary {self.primary!r} must be one of the verifiers: {sorted(self.verifiers)}")
        if not all(v.lossless for v in self.verifiers.values()):
            raise ConfigError("PairedVerifiers compares lossless verifiers only (a lossy one changes the target law)")
        self.repeats = check_int("repeats", self.repeats, low=1)
        self.samples = {name: [] for name in self.verifiers}

    @property
    def accepts(self) -> frozenset:  # type: ignore[override]
        return frozenset.intersection(*(frozenset(v.accepts) for v in self.verifiers.values()))

    lossless = True

    def verify(self, draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator) -> Verdict:
        for name, verifier in self.verifiers.items():
            total = torch.zeros(draft.batch_size, dtype=torch.float64)
            for r in range(self.repeats):
                coins = torch.Generator(device=logits.device).manual_seed(self.seed + 100_003 * self.rounds + r)
                total += verifier.verify(draft, logits, sampling, coins).num_accepted.double().cpu()
            self.samples[name].extend((total / self.repeats).tolist())
        self.rounds += 1
        return self.verifiers[self.primary].verify(draft, logits, sampling, generator)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per verifier: mean acceptance length (accepted draft tokens + the bonus token) with its standard error,
        and the paired difference to the primary with its standard error, over ``n`` row-rounds."""
        base = torch.tensor(self.samples[self.primary], dtype=torch.float64)
        out = {}
        for name, values in self.samples.items():
            x = torch.tensor(values, dtype=torch.float64)
            d = x - base
            n = len(values)
            out[name] = {
                "acceptance_length": float(x.mean()) + 1.0,
                "se": float(x.std()) / math.sqrt(n) if n > 1 else float("nan"),
                "minus_primary": float(d.mean()),
                "diff_se": float(d.std()) / math.sqrt(n) if n > 1 else float("nan"),
                "n": n,
            }
        return out


def run(
    temperatures: tuple[float, ...] = (0.7, 1.0),
    num_prompts: int = 8,
    max_new_tokens: int = 64,
    repeats: int = 16,
    task: str = "mixed",
    seed: int = 0,
) -> str:
    """The paired table on SmolLM2 with its int8 draft model, one tree budget for all (``FixedLength(8, depth=4)``):
    chains (``ModelDrafter``: ``rejection`` decides; ``block``, ``traversal`` measured) and i.i.d. trees of 2
    rollouts (``ModelTreeDrafter(shape="iid")``: ``traversal`` decides; ``specinfer``, ``spectr`` measured).
    Returns a markdown table."""
    import decodekit as dk
    from decodekit.bench.tasks import load_task
    from decodekit.drafters import ModelDrafter, ModelTreeDrafter
    from decodekit.models.zoo import load_zoo_model
    from decodekit.policies import FixedLength
    from decodekit.verifiers import (
        BlockVerifier,
        RejectionVerifier,
        SpecInferVerifier,
        SpecTrVerifier,
        TraversalVerifier,
    )

    target = dk.load_model("smollm2-135m-instruct")
    draft = load_zoo_model("smollm2-135m-instruct", kernels="int8")
    rows = load_task(task, target.tokenizer, num_prompts=num_prompts, seed=seed)
    prompts = [list(r["input_ids"]) for r in rows]
    setups = {
        "chain of 4": (
            ModelDrafter(draft),
            {"rejection": RejectionVerifier(), "block": BlockVerifier(), "traversal": TraversalVerifier()},
            "rejection",
        ),
        "i.i.d. tree 2x4": (
            ModelTreeDrafter(draft, shape="iid", branches=2),
            {"traversal": TraversalVerifier(), "specinfer": SpecInferVerifier(), "spectr": SpecTrVerifier()},
            "traversal",
        ),
    }
    lines = [
        "| temperature | draft | verifier | acceptance length | minus the deciding verifier (paired) | row-rounds |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for temperature in temperatures:
        for label, (drafter, verifiers, primary) in setups.items():
            paired = PairedVerifiers(verifiers, primary, repeats, seed)
            for i, prompt in enumerate(prompts):
                dk.generate(
                    target, [prompt], drafter=drafter, verifier=paired, policy=FixedLength(8, depth=4),
                    temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + i,
                )  # fmt: skip
            for name, s in paired.summary().items():
                diff = "(decides)" if name == primary else f"{s['minus_primary']:+.3f} ± {s['diff_se']:.3f}"
                lines.append(
                    f"| {temperature} | {label} | `{name}` | {s['acceptance_length']:.3f} ± {s['se']:.3f} | {diff} | "
                    f"{s['n']} |"
                )
            print(lines[-1], flush=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=16)
    parser.add_argument("--task", default="mixed")
    args = parser.parse_args(argv)
    print(run(tuple(args.temperatures), args.prompts, args.tokens, args.repeats, args.task))


if __name__ == "__main__":
    main()
