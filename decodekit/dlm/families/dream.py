"""Dream (Ye et al. 2025; ``Dream-org/Dream-v0-Base-7B`` / ``-Instruct-7B``) as transformers' Qwen2, bidirectional.

The released checkpoints (``model_type: Dream``, ``DreamModel``) are Qwen2 decoders initialised from Qwen2.5 and
trained as masked diffusion LMs: the same parameter names as ``Qwen2ForCausalLM`` (biases on q / k / v only), RMS
norms, rotary embeddings (``rope_theta``, ``rope_scaling``), attention made bidirectional (``is_causal = False``; here
by the 4-D masks :class:`~decodekit.dlm.DLMModel` passes). Its ``diffusion_generate`` reads slot ``j``'s logits at
position ``j - 1`` (shifted), and the mask token is ``config.json``'s ``mask_token_id`` (151666). Its tokenizer
is a Qwen2 byte-level BPE (``vocab.json`` / ``merges.txt``) behind the repository's own ``DreamTokenizer`` class:
read with transformers' ``Qwen2Tokenizer`` when no other class loads it.

Checked against the reference: ``tests/unit/test_dlm_families.py`` compares logits with a port of
``modeling_dream.py`` as NVlabs/Fast-dLLM vendors it (@ 24cc59e; the port gave that file's logits on the tiny
checkpoints, exactly in float32), and its ``diffusion_generate`` at temperature 0 with
:class:`~decodekit.dlm.DreamRule` (``alg`` ``maskgit_plus``, ``topk_margin``, ``entropy``) with a port of its
``_sample``: the same tokens. Its default ``alg="origin"`` draws the slots to commit with ``torch.rand`` and is not
implemented.
"""

from __future__ import annotations

from typing import Any

from decodekit.dlm.families import Family, mask_from
from decodekit.dlm.families.qwen import convert_qwen

__all__ = ["DREAM"]

MASK_TOKEN_ID = 151666  # Dream's <|mask|> (``mask_token_id`` in the released config.json)


def convert(config: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """Dream's ``config.json`` -> a ``Qwen2Config`` and ``{Qwen2 parameter: Dream tensor}`` (the same names)."""
    return convert_qwen(config, "Dream")


def tokenizer(root: Any) -> Any:
    """Dream's Qwen2 BPE files read by transformers' ``Qwen2Tokenizer`` (its special tokens from
    ``tokenizer_config.json``), for when no transformers class named by the checkpoint loads it."""
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(str(root), local_files_only=True)


DREAM = Family(
    name="Dream",
    model_types=("Dream",),
    architectures=("DreamModel",),
    convert=convert,
    mask_token_id=mask_from(MASK_TOKEN_ID, ask_tokenizer=False),
    shift_logits=True,
    tokenizer=tokenizer,
)
