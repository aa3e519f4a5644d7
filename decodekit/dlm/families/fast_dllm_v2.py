"""Fast-dLLM v2 (Wu et al. 2025, "Fast-dLLM v2: Efficient Block-Diffusion LLM";
``Efficient-Large-Model/Fast_dLLM_v2_7B`` / ``_1.5B``) as transformers' Qwen2, block-causal.

The released checkpoints (``model_type: Fast_dLLM_Qwen``, ``Fast_dLLM_QwenForCausalLM``) are Qwen2.5 decoders
fine-tuned as block diffusion LMs: Qwen2's parameter names (biases on q / k / v), attention bidirectional within a
block and causal across blocks on the absolute position grid (its ``eval_block_diff_mask``: query block ``>=`` key
block, blocks of ``config.json``'s ``bd_size``, 32), logits shifted one slot (the token shift it keeps from its AR
parent). The mask token is ``|<MASK>|``, 151665 in the released tokenizer: ``config.json``'s ``mask_token_id`` if
present, else the tokenizer's ``|<MASK>|``, else 151665 (its ``generate`` default).

Faithfulness: the modeling file is published beside the weights only; the forward here was checked against a public
copy of it (``modeling.py`` as Satgoy152/DualDiffusion vendors ``Fast_dLLM_v2_7B`` @ 1aeb3d4: its inference path is
Qwen2's attention under ``eval_block_diff_mask``; the training-only flex-attention path and split rotary halves are
not used at inference). ``tests/unit/test_dlm_families.py`` compares logits with a port of that forward and
:class:`~decodekit.dlm.FastDLLMv2Rule`'s tokens with a port of its ``generate`` (no sub-block cache).
"""

from __future__ import annotations

from typing import Any

from decodekit.dlm.families import Family, mask_from
from decodekit.dlm.families.qwen import convert_qwen

__all__ = ["FAST_DLLM_V2"]

MASK_TOKEN = "|<MASK>|"
MASK_TOKEN_ID = 151665
BLOCK_SIZE = 32  # bd_size of every release


def convert(config: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """Fast-dLLM v2's ``config.json`` -> a ``Qwen2Config`` and ``{Qwen2 parameter: tensor}`` (the same names)."""
    return convert_qwen(config, "Fast-dLLM v2")


FAST_DLLM_V2 = Family(
    name="Fast-dLLM v2",
    model_types=("Fast_dLLM_Qwen",),
    architectures=("Fast_dLLM_QwenForCausalLM",),
    convert=convert,
    mask_token_id=mask_from(MASK_TOKEN_ID, token=MASK_TOKEN),  # config.json's, the tokenizer's |<MASK>|, 151665
    shift_logits=True,
    block_length=lambda config: int(config.get("bd_size") or BLOCK_SIZE),
    block_grid="absolute",
)
