"""EoT early stop: once a row commits an end-of-text token, the rest of its region is padding."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.checks import check_instance
from decodekit.dlm.components import check_commit, check_vocab, token_ids
from decodekit.dlm.interfaces import BeginsBlock, ChecksDLM, UnmaskRule, flag
from decodekit.dlm.rules.llada import LLaDARule
from decodekit.dlm.state import DLMState, Proposal
from decodekit.errors import ConfigError
from decodekit.registry import register


@register("dlm_rule", "eot_stop")
class EoTStop:
    """Wrap a rule: when a row has an end-of-text token committed at slot ``j`` (this step or earlier; a prompt's
    tail carried into the first block, ``state.prompt_tail``, does not count), every
    masked slot after ``j`` is committed as end-of-text in the same step, in every later block too, so the row's
    remaining blocks cost no forward (Learn2PD's EoTP; LLaDA's instruct models pad their answers with end-of-text
    ids, so the base sampler spends its last steps writing them one by one). Slots before ``j`` are decoded as usual.

    **Lossy** unless the model would have padded anyway: the base sampler may write text after an end-of-text token
    (a model trained on packed documents continues with the next one). Stats show the saving in ``nfe`` and in each
    row's ``row_nfe``.

    Faithfulness: the EoTP rule as the Learn2PD paper states it (stop at the end-of-text token, fill the tail);
    the paper's learned filter is not part of it.

    Args:
        rule: the rule that picks commits (None = the baseline :class:`~decodekit.dlm.rules.LLaDARule`).
        eot_token_ids: the ids that end a text; the first one fills the tail. None = the model's end-of-sequence ids
            (``DLMState.eos_token_ids``). Checked against the model's vocabulary when a call starts.
    """

    def __init__(self, rule: Any = None, eot_token_ids: int | list[int] | tuple[int, ...] | None = None) -> None:
        check_instance("EoTStop(rule=...)", rule, UnmaskRule, what="select(state, proposal, eligible)")
        self.rule = LLaDARule() if rule is None else rule
        self.eot_token_ids = token_ids("eot_token_ids", eot_token_ids)

    def check_model(self, dlm: Any) -> None:
        """When a call starts: the ids are inside the model's vocabulary (or the model declares some), and the wrapped
        rule can run on it."""
        if self.eot_token_ids is None and not tuple(dlm.lm.eos_token_ids):
            raise ConfigError("EoTStop: the model declares no end-of-sequence id; pass eot_token_ids=[...]")
        check_vocab("EoTStop", "eot_token_ids", self.eot_token_ids, dlm.vocab_size)
        if isinstance(self.rule, ChecksDLM):
            self.rule.check_model(dlm)

    @property
    def per_row_steps(self) -> bool:
        """Rows may take their own steps when the wrapped rule allows it (this wrapper reads no step counter)."""
        return flag(self.rule, "per_row_steps")

    @property
    def fixed_blocks(self) -> bool:
        """Whether the wrapped rule needs the same blocks in every row (then a schedule that gives rows their own is
        refused)."""
        return flag(self.rule, "fixed_blocks")

    def begin_block(self, state: DLMState) -> None:
        if isinstance(self.rule, BeginsBlock):
            self.rule.begin_block(state)

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        """The wrapped rule's commits, plus every masked slot after a committed end-of-text token (its proposal
        replaced by the first end-of-text id)."""
        ids = self.eot_token_ids or state.eos_token_ids
        if not ids:
            raise ConfigError("EoTStop: the model declares no end-of-sequence id; pass eot_token_ids=[...]")
        commit = check_commit(f"{type(self.rule).__name__}.select", self.rule.select(state, proposal, eligible), state)
        masked = state.masked
        after_step = torch.where(commit & masked, proposal.tokens, state.tokens)
        ended = torch.isin(after_step, torch.tensor(ids, device=state.device)) & (commit | ~masked)
        if state.prompt_tail is not None:  # a prompt's tail carried into the first block is prompt, not output
            ended &= torch.arange(ended.shape[1], device=state.device)[None] >= state.prompt_tail[:, None]
        fill = ((ended.long().cumsum(1) - ended.long()) > 0) & masked
        proposal.tokens = proposal.tokens.masked_fill(fill, ids[0])
        return commit | fill
