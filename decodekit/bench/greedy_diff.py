"""Why a method's greedy output differs from the reference's: a floating-point near-tie, a wrong token or a
different stop (:class:`GreedyDiff`, built by :func:`greedy_diffs` after all timing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decodekit.models import LanguageModel
from decodekit.spec.diagnostics import Divergence, first_divergences


@dataclass(frozen=True)
class GreedyDiff:
    """A prompt whose greedy output differs from the reference's.

    Attributes:
        prompt: the prompt's id (its task id when the runner was given ``prompt_ids``, else its index).
        divergence: the first differing token and the target's ranking there; None when one output is a strict
            prefix of the other (a stopping difference: EOS or length, verdict ``"length"``).
        reference_length: generated tokens of the reference's output.
        candidate_length: generated tokens of this method's output.
    """

    prompt: int | str
    divergence: Divergence | None
    reference_length: int
    candidate_length: int

    @property
    def verdict(self) -> str:
        """``"near_tie"`` (float rounding), ``"mismatch"`` (a bug) or ``"length"`` (stopped at a different point)."""
        return self.divergence.verdict if self.divergence else "length"

    @property
    def position(self) -> int:
        """The first generated position where the outputs differ (for ``length``: where the shorter one ends)."""
        return self.divergence.position if self.divergence else min(self.reference_length, self.candidate_length)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(prompt=self.prompt, position=self.position, verdict=self.verdict)
        out.update(margin=self.divergence.margin if self.divergence else None)
        out.update(reference_length=self.reference_length, candidate_length=self.candidate_length)
        if self.divergence:
            out.update({k: v for k, v in self.divergence.to_dict().items() if k not in out})
        return out

    def __str__(self) -> str:
        if self.divergence:
            return f"prompt {self.prompt}, {self.divergence}"
        return (
            f"prompt {self.prompt}: same tokens, different length (reference {self.reference_length}, "
            f"candidate {self.candidate_length}): LENGTH"
        )


def greedy_diffs(
    model: LanguageModel,
    prompts: list[list[int]],
    ids: list[int | str],
    references: list[list[int]],
    candidates: list[list[int]],
) -> list[GreedyDiff]:
    """Explain every prompt whose output differs from the reference's (untimed: target forwards)."""
    rows = [i for i, (r, c) in enumerate(zip(references, candidates)) if r != c]
    pick = [[seqs[i] for i in rows] for seqs in (prompts, references, candidates)]
    divergences = first_divergences(model, *pick)
    return [GreedyDiff(ids[i], d, len(references[i]), len(candidates[i])) for i, d in zip(rows, divergences)]
