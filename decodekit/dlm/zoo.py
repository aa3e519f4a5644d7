"""Diffusion LMs in the zoo: a base zoo model plus a LoRA adapter shipped in ``decodekit/weights/``."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decodekit.checks import did_you_mean
from decodekit.errors import ModelNotFoundError
from decodekit.resources import shipped_weights


@dataclass(frozen=True)
class ZooDLM:
    base: str
    weights: str
    mask_token_id: int
    shift_logits: bool
    recipe: str


DLM_ZOO = {
    "smollm2-135m-dlm": ZooDLM(
        "smollm2-135m-instruct",
        "smollm2-135m-dlm.safetensors",
        16,
        True,
        "python -m decodekit train recipe=dlm_adapter",
    ),
    "smollm2-135m-bdlm": ZooDLM(
        "smollm2-135m-instruct",
        "smollm2-135m-bdlm.safetensors",
        16,
        True,
        "python -m decodekit train recipe=bdlm_adapter",
    ),
    "smollm2-135m-draft-dlm": ZooDLM(
        "smollm2-135m-instruct",
        "smollm2-135m-draft-dlm.safetensors",
        16,
        True,
        "python -m decodekit train recipe=draft_dlm",
    ),
}
"""Zoo diffusion LMs: SmolLM2-135M adapted by ``decodekit/train/dlm_adapter.py`` (mask ``<empty_output>``, shifted
logits): ``smollm2-135m-dlm`` bidirectional, ``smollm2-135m-bdlm`` block-causal (blocks of 32, self-distilled);
``smollm2-135m-draft-dlm`` block-causal and aligned to draft for SmolLM2 (``objective=draft``; not shipped yet: it
needs a GPU run of ``recipe=draft_dlm``)."""


def check_dlm_name(name: str) -> None:
    """Refuse a model name that is neither a zoo DLM, a base zoo model nor an existing local path, with the zoo's
    names and the closest one (a typo of a zoo DLM's name should not be asked for a mask id)."""
    from decodekit.models.zoo import ZOO

    if name in DLM_ZOO or name in ZOO or os.path.exists(name):
        return
    known = [*sorted(DLM_ZOO), *sorted(ZOO)]
    hint = did_you_mean(name.lower(), known)
    raise ModelNotFoundError(
        f"model {name!r} is not a zoo diffusion LM{hint} (available: {', '.join(sorted(DLM_ZOO))}), nor a zoo model "
        f"(with mask_token_id=...: {', '.join(sorted(ZOO))}), nor an existing local path"
    )


def weights_path(entry: ZooDLM) -> Path:
    return shipped_weights(entry.weights)


def load_zoo_dlm(name: str, **load_kwargs: Any) -> tuple[Any, ZooDLM, int | None]:
    """The adapted model (the LoRA merged into a fresh copy of the base) as a :class:`~decodekit.models.HFCausalLM`,
    its zoo entry, and the block length it was trained block-causally with (None: bidirectional), as the adapter file
    records it. Raises :class:`~decodekit.errors.ModelNotFoundError` when the adapter file is missing."""
    from peft import set_peft_model_state_dict
    from safetensors import safe_open

    import decodekit as dk

    entry = DLM_ZOO[name]
    path = weights_path(entry)
    if not path.is_file():
        raise ModelNotFoundError(
            f"{name}: no adapter at {path}; train it with `{entry.recipe}` and copy its {entry.weights} there"
        )
    with safe_open(str(path), framework="pt") as f:
        weights = {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        summary = json.loads(f.metadata()["summary"])
    base = dk.load_model(entry.base)
    targets = _targets(weights)
    for name, module in base.hf.named_modules():
        if name.rsplit(".", 1)[-1] in targets:  # the cached base is memory-mapped: merging into it in place would
            module.weight.data = module.weight.data.clone()  # fault in a private copy page by page (3 s here, 0.3 s so)
    peft_model = with_lora(base.hf, summary["lora_rank"], summary["lora_alpha"], targets)
    set_peft_model_state_dict(peft_model, weights)
    merged = peft_model.merge_and_unload().eval()
    return dk.load_model(merged, tokenizer=base.tokenizer, **load_kwargs), entry, summary.get("block_length")


def with_lora(model: Any, rank: int, alpha: float, targets: list[str]) -> Any:
    """``model`` (a transformers model) wrapped by peft with a fresh LoRA of ``rank`` / ``alpha`` on the linear
    layers named ``targets``: the adapter the DLM recipe trains and the zoo loads. peft reads transformers'
    deprecated ``is_gradient_checkpointing`` (a FutureWarning from transformers 5, not the caller's to act on);
    that one warning is silenced here."""
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets)))


def _targets(weights: dict[str, Any]) -> list[str]:
    """The projection names the adapter's tensors belong to (``...q_proj.lora_A.weight`` -> ``q_proj``)."""
    return sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in weights})
