"""Prompt-lookup / n-gram drafting: continue the pending suffix the way it continued earlier in the history."""

from __future__ import annotations

from typing import Literal

import torch

from decodekit.checks import check_int, describe
from decodekit.errors import ConfigError
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, SamplingParams


@register("drafter", "ngram")
class NGramDrafter:
    """Prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``), batched on device.

    For ``n = max_ngram .. min_ngram``, the last ``n`` tokens of each row (prompt + generated, pending token
    included) are searched for earlier in the same row; the tokens that followed the match are the draft. The
    longest n wins; among its matches the most recent one (``match="recent"``, usually better during generation)
    or the first one (``match="first"``, as transformers does). Rows without a match draft nothing.
    Drafts are deterministic, so any lossless verifier treats them as point masses.

    Args:
        max_ngram: longest suffix to match.
        min_ngram: shortest suffix to match.
        match: which occurrence to continue, ``"recent"`` or ``"first"``.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, match: Literal["recent", "first"] = "recent") -> None:
        max_ngram = check_int("max_ngram", max_ngram, low=1)
        min_ngram = check_int("min_ngram", min_ngram, low=1)
        if min_ngram > max_ngram:
            raise ConfigError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        if not isinstance(match, str) or match not in ("recent", "first"):
            raise ConfigError(f"match must be 'recent' or 'first', got {describe(match)}")
        self.max_ngram, self.min_ngram, self.match = max_ngram, min_ngram, match

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        return DraftKind.DETERMINISTIC

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        k = budget.max_len
        width = max(state.host_lengths)
        history = state.tokens[:, :width]
        lengths = state.lengths
        start = torch.full_like(lengths, -1)  # where the continuation begins, -1 = no match yet
        for n in range(min(self.max_ngram, width - 1), self.min_ngram - 1, -1):  # longer suffixes cannot match
            key = history.gather(1, (lengths[:, None] - n + torch.arange(n, device=history.device)).clamp(min=0))
            windows = history.unfold(1, n, 1)  # [B, width - n + 1, n]
            pos = torch.arange(windows.shape[1], device=history.device)
            # a match must end before the suffix itself so that at least one token follows it
            hit = (windows == key[:, None, :]).all(-1) & (pos + n < lengths[:, None]) & (lengths[:, None] > n)
            if self.match == "recent":
                found = torch.where(hit, pos, -1).max(-1).values
            else:
                found = torch.where(hit, pos, width).min(-1).values
                found = torch.where(found < width, found, -1)
            start = torch.where((start < 0) & (found >= 0), found + n, start)
        idx = start[:, None] + torch.arange(k, device=history.device)
        valid = (start >= 0)[:, None] & (idx < lengths[:, None]) & budget.mask(k)
        tokens = history.gather(1, idx.clamp(0, width - 1)).where(valid, 0)
        return Draft.chain(tokens, valid=valid)
