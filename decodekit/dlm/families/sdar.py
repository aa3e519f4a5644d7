"""SDAR (Cheng et al. 2025, "SDAR: A Synergistic Diffusion-AutoRegression Paradigm"; ``JetLM/SDAR-1.7B-Chat``,
``-4B-Chat``, ``-8B-Chat`` and their ``-b8`` ... ``-b64`` block-size variants) as transformers' Qwen3, block-causal.

The released checkpoints (``model_type: sdar``, ``SDARForCausalLM``) are Qwen3 decoders continued-pretrained as
block diffusion LMs: the same parameter names as ``Qwen3ForCausalLM`` (per-head q / k RMS norms, ``attention_bias``),
attention bidirectional within a block and causal across blocks on the absolute position grid (block ``k`` holds
positions ``[kL, (k + 1)L)``, the prompt's tail shares the first generated block), logits not shifted. The block
length is ``config.json``'s ``block_size`` (4 for the default models; a checkpoint without it gets 4, what SDAR's
``generate.py`` defaults to) and the mask token its ``mask_token_id`` (else the tokenizer's ``mask_token``, else
151669, ``<|MASK|>``). The 30B-A3B MoE release (``SDARMoeForCausalLM``) is refused.

Faithfulness: the MoE and the modeling file aside, SDAR publishes its modeling code only beside the weights; the
block-causal forward here follows its ``generate.py`` (JetAstra/SDAR @ c2041a8: the mask it builds and passes, the
positions, the KV it stores per finished block) and a public copy of its ``SDARAttention`` (Qwen3's attention with
``is_causal = False`` under that mask). ``tests/unit/test_dlm_families.py`` compares the logits with a port of that
forward and :class:`~decodekit.dlm.SDARRule`'s tokens with a port of ``block_diffusion_generate``.
"""

from __future__ import annotations

from typing import Any

from decodekit.dlm.families import Family, mask_from
from decodekit.dlm.families.qwen import convert_qwen
from decodekit.errors import UnsupportedModelError

__all__ = ["SDAR"]

MASK_TOKEN_ID = 151669  # SDAR's <|MASK|>
BLOCK_SIZE = 4  # generate.py's default block_length, the default models' block size


def convert(config: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """SDAR's ``config.json`` -> a ``Qwen3Config`` and ``{Qwen3 parameter: SDAR tensor}`` (the same names)."""
    if "SDARMoeForCausalLM" in (config.get("architectures") or ()) or config.get("num_experts"):
        raise UnsupportedModelError(
            "SDAR MoE checkpoint (SDARMoeForCausalLM): decodekit reads SDAR's dense releases (SDARForCausalLM) only"
        )
    return convert_qwen(config, "SDAR", qwen3=True)


SDAR = Family(
    name="SDAR",
    model_types=("sdar",),
    architectures=("SDARForCausalLM", "SDARMoeForCausalLM"),
    convert=convert,
    mask_token_id=mask_from(MASK_TOKEN_ID),
    shift_logits=False,
    block_length=lambda config: int(config.get("block_size") or BLOCK_SIZE),
    block_grid="absolute",
)
