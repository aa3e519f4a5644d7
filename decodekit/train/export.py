"""Export a decodekit EAGLE-3 head to the layouts vLLM serves it from.

:func:`export_head` writes a head of EAGLE-3's own architecture (``python -m decodekit train recipe=eagle3``,
``architecture=eagle3``: :class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead`) as a directory in

- ``format="eagle"``: the EAGLE authors' release layout (``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``): ``config.json``
  (Llama keys, one layer, ``draft_vocab_size``) and ``model.safetensors`` with ``fc.weight``, ``midlayer.*``,
  ``norm.weight``, ``lm_head.weight`` over the draft vocabulary in ascending target ids, ``d2t`` (draft id ``d`` is
  target id ``d + d2t[d]``) and ``t2d`` (which target ids are drafted);
- ``format="speculators"``: vLLM ``speculators``' (``Eagle3Speculator.save_pretrained``): the same tensors with the
  layer under ``layers.0.*``, and a ``config.json`` holding ``speculators_model_type: eagle3``, the layer's Llama
  config as ``transformer_layer_config``, ``draft_vocab_size``, ``norm_before_residual: false`` and
  ``speculators_config`` (algorithm, a greedy proposal of 3 tokens, the verifier).

Both name the target layers the head reads (``eagle_aux_hidden_state_layer_ids``, numbered as vLLM and decodekit
number them: ``i`` is the output of the ``i``-th decoder layer). No embedding table is written: the head shares the
target's, as the authors' releases do. :func:`decodekit.drafters.eagle_release.load_release` reads both back
(``EagleDrafter(weights=<the directory>)``), drafting what the head file drafts (``tests/unit/test_export.py``).

To serve with vLLM: ``vllm serve <target> --speculative-config '{"method": "eagle3", "model": "<the directory>",
"num_speculative_tokens": 3}'`` (docs/hub.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from decodekit.checks import check_choice, describe
from decodekit.drafters.eagle3_release import NAMES
from decodekit.drafters.eagle_head import RELEASE
from decodekit.drafters.head_files import read_metadata
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.models.checkpoint_files import read_state
from decodekit.resources import shipped_weights

__all__ = ["FORMATS", "export_head"]

FORMATS = ("eagle", "speculators")
RETRAIN = "python -m decodekit train recipe=eagle3 architecture=eagle3 (docs/training.md)"


def export_head(head: Any, out_dir: str | Path, format: str = "speculators", *, verifier: str | None = None) -> Path:
    """Write the EAGLE-3 head ``head`` to ``out_dir`` in ``format`` (module docstring); returns ``out_dir``.

    Args:
        head: a head file written by the ``eagle3`` recipe (``architecture=eagle3``), the name of one shipped in
            ``decodekit/weights``, or an :class:`~decodekit.drafters.eagle.EagleDrafter` holding such a file.
        out_dir: the directory to write (created; refused when it already holds files).
        format: ``"speculators"`` (vLLM's) or ``"eagle"`` (the EAGLE authors').
        verifier: the target's name or path for the speculators config (``speculators_config.verifier``); None =
            the ``base`` the head was trained for.

    Raises:
        ConfigError: an unknown ``format``, an ``out_dir`` holding files, a head that is not an EAGLE-3 head of
            the released architecture (an ``fc`` head, the shipped one included until it is retrained: it has no
            EAGLE-3 layout to be written in), with the command that trains one.
    """
    check_choice("format", format, FORMATS)
    if verifier is not None and not isinstance(verifier, str):
        raise ConfigTypeError(f"verifier must be the target's name or path (a string), got {describe(verifier)}")
    path = _head_path(head)
    meta = read_metadata(path)
    if not meta:  # not a safetensors file, or one without the metadata decodekit writes
        raise ConfigError(
            f"{path} is not a head file decodekit wrote (a safetensors file with its recipe's metadata): pass a "
            "file from python -m decodekit train, or a shipped head's name"
        )
    if meta.get("architecture") != RELEASE:
        kind = "an EAGLE-3 head" if meta.get("layers") else "an EAGLE-1 head"
        raise ConfigError(
            f"{path.name} is {kind} of decodekit's fc architecture (EAGLE-1's fc([embed ; feature]) input, the "
            f"target's output rows): vLLM's EAGLE-3 layout cannot hold it. Train an EAGLE-3 head of the released "
            f"architecture with {RETRAIN} and export that file"
        )
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"out_dir={out} already exists and is not an empty directory: name a new one")
    config = dict(meta["head_config"])
    tensors = _release_tensors(read_state(path), int(config["vocab_size"]))
    config["draft_vocab_size"] = int(tensors["lm_head.weight"].shape[0])
    config["torch_dtype"] = "float16"
    config["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in meta["layers"]]
    if format == "speculators":
        target = {"name_or_path": verifier or str(meta.get("base", "unknown")),
                  "architectures": list(meta.get("target_architectures") or ["LlamaForCausalLM"])}  # fmt: skip
        config = _speculators_config(config, target)
        tensors = {k.replace("midlayer.", "layers.0.", 1): v for k, v in tensors.items()}
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _head_path(head: Any) -> Path:
    """The head file ``head`` names (a path, a shipped file's name, or a drafter's ``weights``)."""
    weights = getattr(head, "weights", head)
    if not isinstance(weights, (str, Path)):
        raise ConfigError(f"head must be a head file's path or an EagleDrafter; got {type(head).__name__}")
    path = Path(weights)
    if not path.is_file() and path.name == str(weights):
        path = shipped_weights(str(weights))
    if not path.is_file():
        raise ConfigError(f"no head file at {weights}; train one with {RETRAIN}")
    return path


def _release_tensors(state: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """A decodekit EAGLE-3 head's tensors under the authors' names, the draft vocabulary in ascending target ids
    (``lm_head`` rows reordered), with ``d2t`` and ``t2d`` (``[vocab_size]``, the target's vocabulary)."""
    order = state["vocab"].long().argsort()
    ids = state["vocab"].long()[order]
    out = {src: state[dst] for src, dst in NAMES.items()}
    out["lm_head.weight"] = state["lm_head.weight"][order]
    out["d2t"] = ids - torch.arange(len(ids))
    out["t2d"] = torch.zeros(vocab_size, dtype=torch.bool).index_fill_(0, ids, True)
    return out


def _speculators_config(config: dict[str, Any], verifier: dict[str, Any]) -> dict[str, Any]:
    """``config`` (the authors' keys) as speculators' ``Eagle3SpeculatorConfig`` writes it."""
    layer = {k: v for k, v in config.items() if k not in ("architectures", "draft_vocab_size",
                                                           "eagle_aux_hidden_state_layer_ids")}  # fmt: skip
    layer["architectures"] = ["LlamaForCausalLM"]
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",  # the speculators release whose layout this is
        "transformer_layer_config": layer,
        "draft_vocab_size": config["draft_vocab_size"],
        "norm_before_residual": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": verifier,
        },
    }
