"""Self-speculation as a strategy of the diffusion block loop (:func:`decodekit.dlm.generate` with ``draft=``).

After a forward's first step, :meth:`Drafting.walk` goes on stepping on the outputs of the drafted canvases that the
rows' canvases reached (each such step is the one the undrafted sampler would take after its own forward of that
canvas: same canvas, same positions and mask), and :meth:`Drafting.draft` asks the draft strategy for the canvases
the next forward runs beside the canvas. While the drafts may finish the block (:mod:`decodekit.dlm.lookahead`), a
row that finishes it on a drafted canvas keeps that canvas's logits of the next block for its first step.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.dlm.components import check_variants
from decodekit.dlm.lookahead import NextBlock, lookahead_block
from decodekit.dlm.parts import Parts
from decodekit.dlm.state import DLMState, output_at
from decodekit.dlm.step import Step, keep, take_step


class Drafting:
    """The drafted walk of one block: ``variants [1 + N, B, T]`` (the canvas and its drafts) for the next forward,
    None before the block's first forward or when the strategy drafted nothing.

    Args:
        parts: the call's parts (``parts.draft`` drafts; ``parts.declared.per_row_steps`` lets rows walk apart).
        ahead: what rows that finish the block on a drafted canvas keep for the next block's first step.
        checks: the call's output checks (``debug``, ``vocab_size``, ``drafts_unchecked``).
    """

    def __init__(self, parts: Parts, ahead: NextBlock, checks: Any) -> None:
        self.parts, self.ahead, self.checks = parts, ahead, checks
        self.variants: torch.Tensor | None = None

    def walk(self, state: DLMState, outputs: Any, last: Step, before: list[int], temperature: float) -> Step:
        """After the first step on a forward's ``outputs`` (None: a step on logits kept from the last block), take
        the steps the drafted canvases reached: rows step together while every row reached one, or each row while it
        does with ``per_row_steps``. ``before``: each row's masked slots in its block before ``last``. Returns each
        row's latest step (what its next drafts come from)."""
        variants, own = self.variants, self.parts.declared.per_row_steps
        if outputs is None or variants is None:
            return last
        left = last.left
        while max(left) or state.lookahead:
            node, on = on_graph(state, variants)
            if state.lookahead is not None:  # rows that finished on a drafted canvas: keep its next block
                self.ahead.keep(state, outputs, node, [o and b > 0 and k == 0 for o, b, k in zip(on, before, left)])
            live = [o and k > 0 for o, k in zip(on, left)] if own else [all(on) and max(left) > 0] * len(on)
            if not any(live):
                break
            before = left
            step = take_step(state, self.parts, output_at(outputs, node), temperature, left, live)
            last, left = (step if step.rows is None else keep(last, step, step.rows)), step.left
        return last

    def draft(self, state: DLMState, last: Step) -> None:
        """The canvases the next forward runs beside the canvas, drafted from each row's latest step ``last`` (none
        once the block is done); looks ahead into the next block when the drafts may finish this one."""
        self.variants = None
        if not max(last.left):
            return
        state.lookahead = lookahead_block(self.parts, state, last.left)
        variants = self.parts.draft.variants(state, last.proposal, last.commit, max(last.left))
        source, checks = f"{type(self.parts.draft).__name__}.variants", self.checks
        values = checks.debug or (checks.drafts_unchecked and variants is not None)
        self.variants = check_variants(source, variants, state, checks.vocab_size, values=values)
        checks.drafts_unchecked = checks.drafts_unchecked and self.variants is None
        if self.variants is not None and not values:  # checked once; from then on the canvas itself, whatever came
            self.variants = torch.cat([state.canvas[None], self.variants[1:]])  # (its logits are the step's)


def on_graph(state: DLMState, variants: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
    """``[B]``: the canvas of ``variants [1 + N, B, T]`` each row's canvas now equals (0 where none), and whether it
    equals one (host bools; one host read). Only where no draft was reached is a row's next step left to the next
    forward, computed from its own canvas as the undrafted sampler computes it."""
    match = (variants == state.canvas).all(-1)  # [1 + N, B]
    return match.int().argmax(0), match.any(0).tolist()


__all__ = ["Drafting", "on_graph"]
