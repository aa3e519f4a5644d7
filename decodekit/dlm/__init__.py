"""Parallel samplers for masked diffusion LMs: one step loop (:func:`generate`) with pluggable unmasking rules.

m = dk.dlm.load_model(hf_model, mask_token_id=M, shift_logits=False)
out = dk.dlm.generate(m, prompts, gen_length=128, block_length=32, steps=128)
out.sequences, out.stats.nfe, out.stats.tokens_per_forward
"""

from decodekit.dlm import rules
from decodekit.dlm.caches import BlockCausalCache, DKVCache, DKVGreedyCache, DualCache, PrefixCache, Recompute
from decodekit.dlm.drafts import SpiffyDrafts, calibrate_graph, canvas_cost
from decodekit.dlm.generate import DLMOutput, generate
from decodekit.dlm.interfaces import DLMCache, DLMDraft, RegionSchedule, UnmaskRule
from decodekit.dlm.model import DLMModel, load_model
from decodekit.dlm.rules import (
    DreamRule,
    EoTStop,
    FactorRule,
    FastDLLMv2Rule,
    LLaDARule,
    LocalLeapRule,
    ProphetRule,
    RandomOrderRule,
    SDARRule,
    ThresholdRule,
)
from decodekit.dlm.schedules import AdaBlock, DeferredWindow, FixedBlocks
from decodekit.dlm.state import DLMState, Proposal, SlotLogits, dense_logits, propose

__all__ = [
    "DLMCache",
    "DLMDraft",
    "RegionSchedule",
    "UnmaskRule",
    "AdaBlock",
    "DeferredWindow",
    "FixedBlocks",
    "BlockCausalCache",
    "DKVCache",
    "DKVGreedyCache",
    "DLMModel",
    "DualCache",
    "PrefixCache",
    "Recompute",
    "DLMOutput",
    "DLMState",
    "Proposal",
    "SpiffyDrafts",
    "calibrate_graph",
    "canvas_cost",
    "SlotLogits",
    "dense_logits",
    "generate",
    "load_model",
    "propose",
]
__all__ += rules.__all__  # the unmasking rules
