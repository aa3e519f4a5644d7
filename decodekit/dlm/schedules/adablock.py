"""AdaBlock: each block ends at a confidently predicted delimiter."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from decodekit.checks import check_float
from decodekit.dlm.components import check_vocab, token_ids
from decodekit.dlm.model import DLMModel
from decodekit.dlm.schedules.common import next_rounds, resolve_ids
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register


@register("dlm_schedule", "adablock")
class AdaBlock:
    """Adaptive block sizes (Lu et al. 2025, "AdaBlock-dLLM"): a block starts where the row's previous one ended; its
    first forward also predicts the slots of a window of ``window * G`` slots from there, and if the most confident
    predicted delimiter in it has probability ``>= threshold`` the block ends at that delimiter (inclusive), else
    after ``block_length`` slots. The same forward makes the block's first commits; the block is decoded until it
    has no masked slot. Rows choose their blocks independently (a row never waits for a batch mate's boundary, and
    its blocks do not depend on them).

    Faithfulness: the reference's ``compute_block_length`` (window ``min(int(0.25 G), remaining)``, the proposals'
    argmax/Gumbel tokens, the delimiter with the highest probability, ``>=``), per row instead of batch 1, delimiters
    counted only at masked slots; the reference pairs it with the threshold rule (``rule=ThresholdRule(0.9)``),
    any rule works here. Each block's step budget is ``steps / (G / block_length)``. Cache strategies: ``None``
    (recompute), ``prefix``, ``dual`` and ``dkv``; not the ones that read one block for every row (``block_causal``,
    ``dkv_greedy``).

    Args:
        delimiters: token ids that may end a block; None = the tokenizer's ids of ``"\\n"`` (the reference's 198).
            Checked against the model's vocabulary when a call starts.
        threshold: ``tau_D``, the delimiter probability needed (0.3 for LLaDA, 0.5 for Dream in the paper).
        window: the look-ahead as a fraction of ``G`` (0.25).
    """

    fixed_blocks = False

    def __init__(self, delimiters: list[int] | None = None, threshold: float = 0.3, window: float = 0.25) -> None:
        ids = token_ids("delimiters", delimiters)
        self.delimiters = None if ids is None else list(ids)
        self.threshold = check_float("threshold", threshold, low=0.0)
        self.window = check_float("window", window, low=0.0, high=1.0, low_open=True)
        self.start: torch.Tensor | None = None  # [B] each row's next block start
        self.ids: torch.Tensor | None = None

    def check_model(self, dlm: DLMModel) -> None:
        """When a call starts: the delimiters are inside the model's vocabulary (or its tokenizer can find them)."""
        check_vocab("AdaBlock", "delimiters", self.delimiters, dlm.vocab_size)
        if self.delimiters is None:
            resolve_ids(None, dlm, "\n", "AdaBlock(delimiters=[...])")

    def rounds(self, dlm: DLMModel, state: DLMState) -> Iterator[None]:
        self.ids = resolve_ids(self.delimiters, dlm, "\n", "AdaBlock(delimiters=[...])").to(state.device)
        self.start = torch.zeros(state.batch_size, dtype=torch.long, device=state.device)
        yield from next_rounds(state, lambda: self.start)

    def region(self, state: DLMState, proposal: Proposal) -> torch.Tensor:
        """At a block's first step: cut each row's block; every step: ``[B, G]`` the current blocks."""
        if state.step == 0:
            assert self.start is not None and self.ids is not None
            j = torch.arange(state.gen_length, device=state.device)
            start = self.start[:, None]
            look = max(int(self.window * state.gen_length), 1)
            window = (j >= start) & (j < start + look)
            delimiter = window & state.masked & torch.isin(proposal.tokens, self.ids)
            best, at = proposal.confidence.masked_fill(~delimiter, -1.0).max(1)
            end = torch.where(best >= self.threshold, at + 1, self.start + state.block_length)
            end = end.clamp(max=state.gen_length)
            state.region = (j >= start) & (j < end[:, None])
            self.start = end
        assert state.region is not None
        return state.region
