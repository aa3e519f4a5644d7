"""Exactness diagnostics: explain why a greedy output differs from plain greedy decoding.

Greedy speculative decoding is exact in exact arithmetic, but in floating point two correct computations of the
same logits (one token per forward vs a verified chain, batch 1 vs a padded batch, MKL vs oneDNN) round
differently. Where the target's top two logits are closer than that rounding, either token is a correct greedy
choice and two correct implementations may disagree; everywhere else a differing token is a bug.
:func:`first_divergence` tells the two apart: it finds the first position where two continuations differ,
recomputes the target's logits there and classifies the gap.

>>> from decodekit.spec.diagnostics import first_divergence, first_divergences
>>> print(first_divergence(model, prompt, plain.sequences[0], spec.sequences[0]))  # doctest: +SKIP
token 4: reference 32 / candidate 0; target top-2 32 4.23733 / 96 3.37131, margin 0.87 (1.82e+06 ulp float32,
tolerance 0.00012): MISMATCH, candidate 0 is 1.8 below the top

**The near-tie rule.** A gap is a near-tie when both tokens' logits lie within ``tolerance`` of the target's top
logit, where ``tolerance = near_tie * ulp``: ``ulp`` is the spacing of the model's floating-point type at the
position's logit scale (the largest ``|logit|`` there, ``eps * 2**floor(log2(scale))``), and ``near_tie`` a
number of such spacings, by default :data:`NEAR_TIE_ULPS` for the dtype:

* **16-bit floats (bf16, fp16): 8 ulps.** Every activation is rounded to the 16-bit grid after each op, so
  differences do not accumulate beyond a few grid steps. Measured on random Llamas (full-sequence vs prefix vs
  cached one-token forwards of the same tokens), the top-2 margin moved by up to 1.5 / 3 / 6 steps on 2 / 8 / 30
  layers; SmolLM2-135M's bf16 greedy mismatches all sat at a margin of 0 or 1 step.
* **float32 (and wider): 256 ulps.** The logits keep 24 bits, but rounding differences from different kernels
  and shapes are amplified layer after layer instead of being reset: the same measurement moved the margin by up
  to 6 / 11 / 30 ulps and single logits by up to 6 / 13 / 90 ulps on 2 / 8 / 30 layers, and SmolLM2-135M's logits
  (scale 16-37) differ by up to 1.3e-4 (35-70 ulps) between the MKL and oneDNN linear kernels. 256 ulps is
  1.5e-5 to 3e-5 of the logit scale: at a scale of 20, a window of 5e-4 logits.

A real bug (a wrong cache slot, mask or position) moves logits by far more than this in float32, so a float32
``mismatch`` is worth investigating. In 16-bit types the grid is coarse (a bf16 step is 0.125 at a scale of 20,
so the window is 1 logit) and greedy decoding itself is ill defined inside it. The verdict is a guide: the
evidence is ``margin`` and ``margin / ulp``, which the record carries and prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from decodekit.checks import int_list
from decodekit.errors import ConfigError, ConfigTypeError, EmptyPromptError
from decodekit.models import LanguageModel, load_model

__all__ = ["NEAR_TIE_ULPS", "Divergence", "first_divergence", "first_divergences", "logit_ulp"]

NEAR_TIE_ULPS: dict[torch.dtype, float] = {torch.bfloat16: 8.0, torch.float16: 8.0}
"""Default near-tie window in ulps of the logit scale, per dtype; any dtype not listed (float32, float64): 256."""

_WIDE_ULPS = 256.0


def logit_ulp(scale: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s floating-point grid at magnitude ``scale``: ``eps * 2**floor(log2(scale))``.

    E.g. ``logit_ulp(20.0, torch.bfloat16) == 0.125`` and ``logit_ulp(20.0, torch.float32) == 2**-19``.
    A zero scale is treated as 1 (a logit vector of zeros has no magnitude of its own).
    """
    _, exponent = math.frexp(abs(scale) or 1.0)  # scale = m * 2**exponent, 0.5 <= m < 1
    return torch.finfo(dtype).eps * 2.0 ** (exponent - 1)


@dataclass(frozen=True)
class Divergence:
    """Where two greedy continuations of one prompt first differ, and how the target ranks the two tokens there.

    Attributes:
        position: index of the first differing token in the generated continuations (0 = first generated token).
        reference_token: the reference's token there (e.g. plain autoregressive decoding).
        candidate_token: the candidate's token there (the method under test).
        top_tokens: the target's two highest-ranked tokens at that position, recomputed on prompt + the common
            prefix.
        top_logits: their logits.
        margin: ``top_logits[0] - top_logits[1]`` (>= 0).
        reference_logit: the logit the target gives ``reference_token``.
        candidate_logit: the logit the target gives ``candidate_token``.
        ulp: the dtype's floating-point spacing at the position's logit scale (largest ``|logit|``).
        tolerance: the near-tie window, ``near_tie * ulp``.
        dtype: the floating-point type the target computed in (e.g. ``"float32"``).
        verdict: ``"near_tie"`` when both tokens are within ``tolerance`` of the top logit (either is a correct
            greedy choice up to rounding), else ``"mismatch"`` (a token the target clearly did not rank first).
    """

    position: int
    reference_token: int
    candidate_token: int
    top_tokens: tuple[int, int]
    top_logits: tuple[float, float]
    margin: float
    reference_logit: float
    candidate_logit: float
    ulp: float
    tolerance: float
    dtype: str
    verdict: Literal["near_tie", "mismatch"]

    @property
    def suspect(self) -> Literal["reference", "candidate", "both"] | None:
        """Which side chose a token more than ``tolerance`` below the top logit (None for a near-tie)."""
        top = self.top_logits[0]
        ref_off = top - self.reference_logit > self.tolerance
        cand_off = top - self.candidate_logit > self.tolerance
        if ref_off and cand_off:
            return "both"
        return "reference" if ref_off else "candidate" if cand_off else None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (tuples become lists), with :attr:`suspect`."""
        return asdict(self) | {
            "top_tokens": list(self.top_tokens),
            "top_logits": list(self.top_logits),
            "suspect": self.suspect,
        }

    def __str__(self) -> str:
        (t1, t2), (l1, l2) = self.top_tokens, self.top_logits
        head = (
            f"token {self.position}: reference {self.reference_token} / candidate {self.candidate_token}; "
            f"target top-2 {t1} {l1:.6g} / {t2} {l2:.6g}, margin {self.margin:.2g} "
            f"({self.margin / self.ulp:.3g} ulp {self.dtype}, tolerance {self.tolerance:.2g})"
        )
        if self.verdict == "near_tie":
            return f"{head}: near-tie (float rounding can flip it)"
        logits = {
            "reference": (self.reference_token, self.reference_logit),
            "candidate": (self.candidate_token, self.candidate_logit),
        }
        sides = ("reference", "candidate") if self.suspect in ("both", None) else (self.suspect,)
        off = [
            f"{side} {logits[side][0]} is {self.top_logits[0] - logits[side][1]:.3g} below the top" for side in sides
        ]
        return f"{head}: MISMATCH, {' and '.join(off)}"


def first_divergence(
    model: LanguageModel | torch.nn.Module,
    prompt: Sequence[int],
    reference: Sequence[int],
    candidate: Sequence[int],
    *,
    near_tie: float | None = None,
) -> Divergence | None:
    """Find where ``candidate`` first departs from ``reference`` and judge it against the target's logits there.

    Args:
        model: the target, a decodekit :class:`~decodekit.models.LanguageModel` or anything
            :func:`decodekit.load_model` accepts (a transformers causal LM, a zoo name, a path).
        prompt: the prompt's token ids.
        reference: generated token ids of the reference run (e.g. plain greedy decoding), prompt excluded.
        candidate: generated token ids of the run under test, prompt excluded.
        near_tie: the near-tie window in ulps of the logit scale (see the module docstring); None = the dtype's
            default, :data:`NEAR_TIE_ULPS` (8 for bf16/fp16, 256 otherwise).

    Returns:
        None when the two agree on every position both have: equal, or one a strict prefix of the other. A prefix
        is not a token divergence: the shorter run stopped (EOS, ``max_new_tokens``, a stop string) where the
        other went on, so there is no pair of tokens for the target to rank; compare lengths to catch a stopping
        difference (the benchmark reports those as ``length``). Otherwise a :class:`Divergence`; the target's
        logits come from one batch-1 forward over ``prompt + reference[:position]`` in the model's own dtype.
    """
    return first_divergences(model, [prompt], [reference], [candidate], near_tie=near_tie)[0]


def first_divergences(
    model: LanguageModel | torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    references: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[int]],
    *,
    near_tie: float | None = None,
) -> list[Divergence | None]:
    """:func:`first_divergence` for each row of a batch: ``result[i]`` compares ``candidates[i]`` with
    ``references[i]`` after ``prompts[i]`` (e.g. ``first_divergences(model, prompts, plain.sequences,
    spec.sequences)``). Only rows that differ run the target, one batch-1 forward each."""
    if not len(prompts) == len(references) == len(candidates):
        raise ConfigError(
            f"need one reference and one candidate per prompt, got {len(prompts)} prompts, "
            f"{len(references)} references and {len(candidates)} candidates"
        )
    target = load_model(model)
    rows = [
        tuple(_ids(f"{name}[{i}]", ids, target.vocab_size) for name, ids in zip(NAMES, row))
        for i, row in enumerate(zip(prompts, references, candidates))
    ]
    return [_diagnose(target, p, r, c, near_tie) for p, r, c in rows]


NAMES = ("prompts", "references", "candidates")


def _ids(name: str, ids: Any, vocab_size: int) -> list[int]:
    """``ids`` as token ids of the model's vocabulary, or a clear refusal naming ``name``."""
    if isinstance(ids, (str, bytes)):
        raise ConfigTypeError(f"{name} must be token ids, got the string {ids!r}: tokenize it first")
    listed = int_list(name, ids, "a sequence of token ids")
    outside = next((t for t in listed if not 0 <= t < vocab_size), None)
    if outside is not None:
        raise ConfigError(f"{name} holds {outside}, outside the model's vocabulary [0, {vocab_size})")
    return listed


def _diagnose(
    model: LanguageModel, prompt: list[int], reference: list[int], candidate: list[int], near_tie: float | None
) -> Divergence | None:
    position = next((i for i, (r, c) in enumerate(zip(reference, candidate)) if r != c), None)
    if position is None:
        return None
    if not prompt:
        raise EmptyPromptError("first_divergence needs the prompt the continuations were generated from")
    logits = _next_token_logits(model, prompt + reference[:position])  # [V]
    dtype = _compute_dtype(model, logits.dtype)
    values = logits.float()
    top = values.topk(2)
    ulp = logit_ulp(values.abs().max().item(), dtype)
    tolerance = (NEAR_TIE_ULPS.get(dtype, _WIDE_ULPS) if near_tie is None else near_tie) * ulp
    ref_token, cand_token = reference[position], candidate[position]
    (l1, l2), (t1, t2) = top.values.tolist(), top.indices.tolist()
    ref_logit, cand_logit = values[ref_token].item(), values[cand_token].item()
    worst_gap = l1 - min(ref_logit, cand_logit)
    return Divergence(
        position=position,
        reference_token=ref_token,
        candidate_token=cand_token,
        top_tokens=(t1, t2),
        top_logits=(l1, l2),
        margin=l1 - l2,
        reference_logit=ref_logit,
        candidate_logit=cand_logit,
        ulp=ulp,
        tolerance=tolerance,
        dtype=str(dtype).removeprefix("torch."),
        verdict="near_tie" if worst_gap <= tolerance else "mismatch",
    )


@torch.no_grad()
def _next_token_logits(model: LanguageModel, context: list[int]) -> torch.Tensor:
    """The target's ``[V]`` next-token logits after ``context``: one batch-1 forward, in the model's dtype."""
    tokens = torch.tensor([context], device=model.device)  # [1, T]
    cache = model.new_cache(1, len(context))
    counts = torch.tensor([len(context)], device=model.device)  # [1]
    return model.extend(cache, tokens, counts).logits[0]


def _compute_dtype(model: LanguageModel, logits_dtype: torch.dtype) -> torch.dtype:
    """The coarser of the model's compute dtype and its logits' dtype (a head may upcast its output)."""
    dtype = getattr(model, "dtype", None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return logits_dtype
    return max(dtype, logits_dtype, key=lambda d: torch.finfo(d).eps)
