"""SpecDec++ (Huang, Guo, Wang; arXiv 2405.19715): an acceptance head on the draft model's hidden state stops a
chain draft once the predicted probability that some drafted token is rejected exceeds a threshold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from decodekit.checks import check_float, check_int
from decodekit.errors import ConfigError
from decodekit.registry import register
from decodekit.resources import shipped_weights
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget, DraftStep

DEFAULT_WEIGHTS = "threshold_head_smollm2-135m-instruct-int8.safetensors"  # the zoo's draft (drafter=model)
RETRAIN = "python -m decodekit train recipe=threshold_head (docs/training.md)"


class AcceptanceHead(nn.Module):
    """SpecDec++'s acceptance prediction head: ``blocks`` residual blocks ``x + SiLU(W_i x + b_i)`` then a linear
    map to one logit, ``sigmoid(logit) = P(the token at this position is accepted)``.

    The reference code (``wrap_model.py``) repeats one block object, so its blocks share weights; here each block
    has its own weights (untied), and the output is one logit instead of two (a two-class softmax over ``(l0, l1)``
    is ``sigmoid(l1 - l0)``, the same model).

    Args:
        hidden_size: ``H``, the draft model's hidden size.
        blocks: number of residual blocks (the paper's best: 3).
    """

    def __init__(self, hidden_size: int, blocks: int = 3) -> None:
        super().__init__()
        self.hidden_size = check_int("hidden_size", hidden_size, low=1)
        self.num_blocks = check_int("blocks", blocks, low=0)
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(blocks))
        self.out = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> acceptance logits ``[...]``."""
        x = hidden
        for block in self.blocks:
            x = x + nn.functional.silu(block(x))
        return self.out(x)[..., 0]

    def save(self, path: str | Path, metadata: dict[str, Any] | None = None) -> None:
        """Write the weights (float32) and ``metadata`` (JSON-encoded values) to a safetensors file."""
        from safetensors.torch import save_file

        meta = {"hidden_size": self.hidden_size, "blocks": self.num_blocks, **(metadata or {})}
        text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
        tensors = {k: v.detach().float().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(path), metadata=text)

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceHead:
        """A head from a file written by :meth:`save` (its ``metadata`` dict attached)."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"no acceptance head at {path}; train one with {RETRAIN} and pass weights=<its file>")
        try:
            with safe_open(str(path), "pt") as f:
                meta = f.metadata() or {}
            head = cls(int(meta["hidden_size"]), int(meta["blocks"]))
            head.load_state_dict(load_file(str(path)))
        except Exception as error:  # not safetensors, no metadata, other tensors
            raise ConfigError(f"{path} is not an acceptance head written by AcceptanceHead.save: {error}") from None
        head.metadata = meta
        return head.eval()


def default_weights() -> Path:
    """Path of the head shipped for the zoo's draft model (SmolLM2-135M-Instruct, int8 kernels)."""
    return shipped_weights(DEFAULT_WEIGHTS)


class HeadStopRule:
    """One round's stop rule (:attr:`DraftBudget.stop`): keeps the running product ``Π [B]`` of predicted
    acceptance probabilities; asks :class:`~decodekit.drafters.ModelDrafter` for hidden states
    (``needs_hidden``). No host sync."""

    needs_hidden = True

    def __init__(self, policy: ThresholdHeadStop) -> None:
        self.policy = policy
        self.product: torch.Tensor | None = None

    def __call__(self, step: DraftStep) -> torch.Tensor:
        """``[B]`` bool: stop after ``step.tokens`` (kept) when ``1 - Π_j > threshold`` and ``j + 1 >= min_len``;
        ``Π_j`` multiplies the head's ``p̂`` of the drafted tokens before ``x_j`` (read at ``x_{j-1}``'s hidden
        state; ``p̂ = 1`` at ``j = 0``, whose input is the verified pending token)."""
        if step.hidden is None:
            raise ConfigError(
                "ThresholdHeadStop needs the draft model's hidden states (DraftStep.hidden), which this drafter "
                "does not give; use it with drafter=model (ModelDrafter)"
            )
        if step.index == 0 or self.product is None:
            self.product = torch.ones(step.tokens.shape[0], device=step.hidden.device)
        else:
            head = self.policy.head_for(step.hidden)
            self.product = self.product * torch.sigmoid(head(step.hidden).float())
        stop = (1 - self.product) > self.policy.threshold
        return stop & (step.index + 1 >= self.policy.min_len)


@register("policy", "threshold_head")
class ThresholdHeadStop:
    """SpecDec++'s threshold policy (Huang, Guo, Wang 2024): draft step by step; after drafting ``x_j`` stop once
    the predicted probability that at least one of ``x_0 .. x_{j-1}`` is rejected, ``1 - Π_{i<j} p̂_i``, exceeds
    ``threshold`` (``x_j``, drafted by the same forward, is kept). ``p̂_i = sigmoid(head(h_i))`` with ``h_i`` the
    draft model's final hidden state at ``x_i``'s position. Never stops before ``min_len`` tokens, always at
    ``max_len``. Larger thresholds give longer drafts.

    Faithfulness: the rule, its index convention (``p̂ = 1`` for the step whose input is the verified token; the
    product taken after the step's token is drafted) and the bounds (both included) are those of the reference
    code (``specdec_pp/hf_generation.py``, schedule ``ada``), per row of a batch instead of batch 1. The reference
    also stops a draft at EOS; here the loop handles EOS. The head's blocks are untied (see
    :class:`AcceptanceHead`), and the shipped head is trained by this repository's recipe
    (``decodekit/train/threshold_head.py``), not the paper's checkpoint.

    Works with step-wise chain drafters that give hidden states (``ModelDrafter``); a step-wise drafter without
    them gets an error on its first step; drafters that draft no step-wise chain (n-gram, trees) never call the
    stop rule and are bounded by ``max_len`` only.

    Args:
        weights: a safetensors file written by :meth:`AcceptanceHead.save` (``python -m decodekit train
            recipe=threshold_head``), or an :class:`AcceptanceHead`; None = the head shipped for the zoo's draft
            model (``drafter=model``: SmolLM2-135M-Instruct with int8 kernels).
        threshold: ``h`` in [0, 1).
        min_len, max_len: the bounds ``[k_min, k_max]``.
    """

    def __init__(
        self,
        weights: str | Path | AcceptanceHead | None = None,
        threshold: float = 0.3,
        min_len: int = 2,
        max_len: int = 20,
    ) -> None:
        self.threshold = check_float("threshold", threshold, low=0, high=1, high_open=True, hint=" (a probability)")
        self.min_len = check_int("min_len", min_len, low=1)
        self.max_len = check_int("max_len", max_len, low=1)
        if self.min_len > self.max_len:
            raise ConfigError(f"min_len={self.min_len} exceeds max_len={self.max_len}; lower min_len")
        if isinstance(weights, AcceptanceHead):
            self.weights, self.head = None, weights.eval()
        else:
            path = default_weights() if weights is None else Path(weights)
            if not path.is_file():
                raise ConfigError(
                    f"no acceptance head at {path}; train one with {RETRAIN} and pass weights=<its file>"
                    + (" (or reinstall decodekit, which ships it)" if weights is None else "")
                )
            self.weights, self.head = str(path), AcceptanceHead.load(path)
        self.head.requires_grad_(False)

    def head_for(self, hidden: torch.Tensor) -> AcceptanceHead:
        """The head on ``hidden``'s device and dtype (moved once); refuses a draft of another hidden size."""
        if hidden.shape[-1] != self.head.hidden_size:
            where = self.weights or "the AcceptanceHead passed"
            raise ConfigError(
                f"the acceptance head ({where}) reads hidden size {self.head.hidden_size}, but the draft model's is "
                f"{hidden.shape[-1]}: train a head for this draft model with {RETRAIN} and pass weights=<its file>"
            )
        first = self.head.out.weight
        if first.device != hidden.device or first.dtype != hidden.dtype:
            self.head.to(device=hidden.device, dtype=hidden.dtype)
        return self.head

    def plan(self, state: DecodeState) -> DraftBudget:
        return DraftBudget.uniform(state.lengths, self.max_len, stop=HeadStopRule(self))
