"""DFlash heads in the layout z-lab releases them and vLLM serves them (``method: "dflash"``): read and written.

The layout (z-lab/dflash ``DFlashDraftModel``; vLLM ``qwen3_dflash.py``): a directory with ``config.json``, a Qwen3
config (``architectures: ["DFlashDraftModel"]``, ``model_type: "qwen3"``, the head's sizes, ``num_hidden_layers``
its layers, ``block_size``, ``dflash_config: {mask_token_id, target_layer_ids}`` with 0-based decoder-layer ids: id
``i`` is the output of decoder layer ``i``, before the final norm; optionally ``draft_vocab_size``), and
``model.safetensors`` with ``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and ``layers.N.*`` under the Qwen3
decoder layer's names (``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm``, ``mlp.{gate,up,down}_proj``, the two
layer norms), no ``model.`` prefix. The embedding and output head are the target's. The mask slots read the
target's embedding of ``mask_token_id``, or the vector in ``mask_embedding.pt`` beside the config (vLLM's file for a
learned one: ``{"embedding": [H], "mask_token_id": id}``). A draft vocabulary comes as ``d2t`` (draft id ``d`` is
target id ``d + d2t[d]``) with ``lm_head.weight`` over it.

:func:`load_dflash_release` reads such a directory into :class:`~decodekit.drafters.dflash_head.DFlashHead` (the
``dflash`` drafter takes the directory as ``weights``); :func:`export_dflash` writes a decodekit head file in it
(``tests/unit/test_dflash.py``: the exported directory drafts what the file drafts, and reads as the layout says).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from decodekit.drafters.dflash_head import DFlashHead
from decodekit.drafters.head_files import check_release_sizes, load_tensors, on_target
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel

__all__ = ["export_dflash", "is_release", "load_dflash_release", "release_fields"]

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
_MLP = ("gate_proj", "up_proj", "down_proj")
_CONFIG_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps",
                "attention_bias", "max_position_embeddings", "vocab_size", "rope_theta", "rope_parameters",
                "rope_scaling")  # fmt: skip
HINT = "train a head for this target with python -m decodekit train recipe=dflash (docs/training.md)"


def _ours(key: str) -> str:
    """A release tensor name -> :class:`DFlashHead`'s."""
    return re.sub(r"^(layers\.\d+)\.(self_attn|mlp)\.", r"\1.", key)


def _theirs(key: str) -> str:
    """A :class:`DFlashHead` tensor name -> the release's."""
    match = re.match(r"^(layers\.\d+)\.([a-z_]+)\.(.+)$", key)
    if match is None:
        return key
    layer, part, rest = match.groups()
    group = "self_attn." if part in _ATTENTION else "mlp." if part in _MLP else ""
    return f"{layer}.{group}{part}.{rest}"


def is_release(path: str | Path) -> bool:
    """Whether ``path`` is a directory in the released DFlash layout."""
    config = Path(path) / "config.json"
    return config.is_file() and "dflash_config" in json.loads(config.read_text())


def release_fields(path: str | Path) -> dict[str, Any]:
    """What the drafter needs before loading: ``layers`` (1-based, decodekit's numbering) and ``block_size``."""
    config = json.loads((Path(path) / "config.json").read_text())
    ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    if not ids or "block_size" not in config:
        missing = "dflash_config.target_layer_ids" if not ids else "block_size"
        raise ConfigError(f"the DFlash head at {path} has no {missing} in its config.json: decodekit needs both")
    if int(config["block_size"]) < 2 or min(int(i) for i in ids) < 0:
        raise ConfigError(
            f"the DFlash head at {path} has block_size={config['block_size']} and target_layer_ids={ids}: a block "
            "holds the pending token and at least one slot (block_size >= 2), and layer ids count from 0"
        )
    return {"layers": [int(i) + 1 for i in ids], "block_size": int(config["block_size"])}


def load_dflash_release(path: str | Path, target: LanguageModel) -> tuple[DFlashHead, dict[str, Any]]:
    """The released DFlash head in the directory ``path`` for ``target``, and its fields (module docstring).

    Raises:
        ConfigError: a head for another target (hidden size or vocabulary named), one with its own embedding or
            output rows that differ from the target's, a missing or misshapen tensor.
    """
    from transformers import AutoConfig

    from decodekit.drafters.eagle3_release import draft_vocab
    from decodekit.drafters.eagle_release import read_tensors
    from decodekit.drafters.head_files import head_rows

    root = Path(path)
    config = json.loads((root / "config.json").read_text())
    fields = release_fields(root)
    check_release_sizes(root, "DFlash", config.get("hidden_size"), config.get("vocab_size"), target)
    tensors = {_ours(k): v for k, v in read_tensors(root).items()}
    vocab = torch.arange(target.vocab_size)
    if "d2t" in tensors:
        vocab = draft_vocab(root, tensors.pop("d2t"), target.vocab_size)
    shared = {"lm_head.weight": lambda: head_rows(target, vocab.to(target.device))[0],
              "embed_tokens.weight": lambda: target.hf.get_input_embeddings().weight}  # fmt: skip
    for name, rows in shared.items():  # the target's own (vLLM shares them): anything else is not this head
        theirs = tensors.pop(name, None)
        if theirs is not None and not torch.allclose(theirs.float(), rows().detach().float().cpu(), atol=1e-2):
            raise ConfigError(f"the DFlash head at {root} ships its own {name}, not the target's: not read here")
    mask_id = int(config["dflash_config"].get("mask_token_id", 0))
    if not 0 <= mask_id < target.vocab_size:
        raise ConfigError(f"the DFlash head at {root} names mask_token_id={mask_id}, outside the target's vocabulary")
    trained_on = config.get("num_target_layers")
    if (trained_on is not None and int(trained_on) != target.num_layers) or max(fields["layers"]) > target.num_layers:
        raise ConfigError(
            f"the DFlash head at {root} reads target layers {fields['layers']} of a {trained_on}-layer target; this "
            f"target has {target.num_layers} layers: pass a head released for this model"
        )
    learned = root / "mask_embedding.pt"
    if learned.is_file():
        saved = torch.load(learned, map_location="cpu", weights_only=True)
        tensors["mask_embedding"] = saved["embedding"] if isinstance(saved, dict) else saved
    else:
        tensors["mask_embedding"] = target.embed(torch.tensor([mask_id], device=target.device))[0].detach().cpu()
    tensors["vocab"] = vocab
    rest = {k: v for k, v in config.items() if k not in ("architectures", "dflash_config", "model_type")}
    head_config = AutoConfig.for_model("qwen3", **rest)
    head = DFlashHead(head_config, fields["layers"], int(config["num_hidden_layers"]), fields["block_size"], vocab)
    what = "a released DFlash head"
    load_tensors(head, tensors, root, what, HINT, advice="it does not fit this target's DFlash head")
    fields.update(release="dflash", head_layers=len(head.layers), mask_token_id=mask_id)
    return on_target(head, target, bf16=False), fields  # type: ignore[return-value]


def export_dflash(head: str | Path, out_dir: str | Path, target: Any, *, mask_token_id: int | None = None) -> Path:
    """Write the DFlash head file ``head`` (``train recipe=dflash``'s) for ``target`` to ``out_dir`` in the released
    layout (module docstring), its learned mask embedding in ``mask_embedding.pt`` under ``mask_token_id`` (None:
    the vocabulary's last id; vLLM gives that vector to every draft input equal to it, so pick a token the target
    rarely emits); returns ``out_dir``.

    To serve with vLLM: ``vllm serve <target> --speculative-config '{"method": "dflash", "model": "<out_dir>",
    "num_speculative_tokens": <block_size - 1>}'`` (docs/hub.md).

    Raises:
        ConfigError: an ``out_dir`` holding files, a head file for another target.
    """
    from safetensors.torch import save_file

    from decodekit.drafters.dflash import load_dflash
    from decodekit.drafters.head_files import head_rows
    from decodekit.models import load_model

    target = load_model(target)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"out_dir={out} already exists and is not an empty directory: name a new one")
    loaded, _ = load_dflash(head, target)
    hf = target.config
    mask_id = target.vocab_size - 1 if mask_token_id is None else int(mask_token_id)
    config = {k: getattr(hf, k) for k in _CONFIG_KEYS if getattr(hf, k, None) is not None}
    config.update(
        architectures=["DFlashDraftModel"], model_type="qwen3", num_hidden_layers=len(loaded.layers),
        head_dim=loaded.layers[0].head_dim, hidden_act="silu", tie_word_embeddings=False, torch_dtype="float16",
        block_size=loaded.block_size, num_target_layers=target.num_layers,
        dflash_config={"mask_token_id": mask_id, "target_layer_ids": [i - 1 for i in loaded.target_layers]},
    )  # fmt: skip
    state = {_theirs(k): v.detach().cpu().half() for k, v in loaded.state_dict().items()
             if k not in ("vocab", "mask_embedding")}  # fmt: skip
    if len(loaded.vocab) < target.vocab_size:  # a draft vocabulary: its rows in ascending target ids, d2t offsets
        ids = loaded.vocab.long().sort().values
        state["lm_head.weight"] = head_rows(target, ids.to(target.device))[0].detach().cpu().half()
        state["d2t"] = ids.cpu() - torch.arange(len(ids))
        config["draft_vocab_size"] = len(ids)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    torch.save({"embedding": loaded.mask_embedding.detach().float().cpu(), "mask_token_id": mask_id},
               out / "mask_embedding.pt")  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
