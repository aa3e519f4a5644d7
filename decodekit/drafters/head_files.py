"""Trained draft heads on disk: one safetensors file per head, its metadata saying which target it was trained for.

Shared by :mod:`decodekit.drafters.eagle` and :mod:`decodekit.drafters.medusa`. A file holds the head's weights
(float16, plus an integer ``vocab`` buffer) and JSON-encoded metadata: :func:`head_metadata` (the target's hidden
size, vocabulary and :func:`fingerprint`) and whatever the training run adds (recipe, data, numbers). Loading
refuses a head written for another target: a head trained on other features drafts garbage silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from decodekit.checks import describe
from decodekit.errors import ConfigError, ConfigTypeError, IncompatibleDraftError
from decodekit.kernels.cpu import match_kernels
from decodekit.models.base import TARGET_PARTS, LanguageModel, hidden_size_of, num_layers_of


def fingerprint(target: LanguageModel) -> float:
    """A number that tells targets apart: the sum of the first 16 tokens' input embeddings (float64)."""
    with torch.no_grad():
        return float(target.embed(torch.arange(min(16, target.vocab_size), device=target.device)[None]).double().sum())


def head_metadata(target: LanguageModel, **extra: Any) -> dict[str, Any]:
    """What :func:`read_head` checks a head against, for ``target``, plus ``extra`` (recipe, numbers)."""
    config = target.config
    return {
        "hidden_size": int(config.hidden_size),
        "vocab_size": target.vocab_size,
        "fingerprint": fingerprint(target),
        **({} if (layers := num_layers_of(target)) is None else {"num_layers": layers}),
        **extra,
    }


def save_head(module: nn.Module, path: str | Path, metadata: dict[str, Any], skip: str | None = None) -> None:
    """Write ``module``'s state (float16; ``vocab`` as is; keys containing ``skip`` left out) and ``metadata``."""
    from safetensors.torch import save_file

    tensors = {
        k: (v if k == "vocab" else v.half()).detach().cpu().clone()
        for k, v in module.state_dict().items()
        if skip is None or skip not in k
    }
    save_file(tensors, str(path), metadata={k: json.dumps(v) for k, v in metadata.items()})


def target_config(target: LanguageModel, drafter: str) -> Any:
    """``target.config``, the transformers config a head is built from (the target part ``config``); a target that
    leaves it unimplemented is refused, naming ``drafter``."""
    try:
        return target.config
    except NotImplementedError:
        raise IncompatibleDraftError(
            f"the {drafter} drafter builds its head from the target's transformers config, which "
            f"{type(target).__name__} leaves unimplemented: LanguageModel.config ({TARGET_PARTS['config'][1]})"
        ) from None


def check_release_sizes(
    root: Any, name: str, hidden: Any, vocab: Any, target: LanguageModel, hint: str = "pass the head released for it"
) -> None:
    """Refuse the ``name`` head released at ``root`` if its ``hidden`` size or ``vocab`` (None: the target's) is not
    ``target``'s, both sizes named."""
    own = target_config(target, name).hidden_size
    if hidden != own or (vocab or target.vocab_size) != target.vocab_size:
        raise ConfigError(
            f"the {name} head at {root} was released for another target: hidden size {hidden}, vocabulary {vocab}; "
            f"the target has hidden size {own}, vocabulary {target.vocab_size}; {hint}"
        )


def on_target(head: nn.Module, target: LanguageModel, bf16: bool | None = None) -> nn.Module:
    """A loaded head ready to draft for ``target``: on its device and in its dtype, in eval mode, with its CPU
    kernels (:func:`~decodekit.kernels.match_kernels`; ``bf16`` as there)."""
    head = head.to(device=target.device, dtype=getattr(target, "dtype", torch.float32)).eval()
    return match_kernels(head, target, bf16=bf16)


def head_path(weights: Any, what: str) -> Path:
    """``weights`` as a path (a head file or a release directory), or a :class:`ConfigTypeError` naming ``what``."""
    if not isinstance(weights, (str, Path)):
        raise ConfigTypeError(
            f"weights must be the path of a {what} head file or release directory, got {describe(weights)}"
        )
    return Path(weights)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of the head file ``path`` alone (no tensors read, no target needed); {} when it has none or
    cannot be read (:func:`read_head` then says why)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return _decoded(f)
    except Exception:
        return {}


def _decoded(f: Any) -> dict[str, Any]:
    """An open safetensors file's metadata, each value JSON-decoded (as :func:`save_head` encodes them)."""
    return {k: json.loads(v) for k, v in (f.metadata() or {}).items()}


def read_head(
    path: str | Path, target: LanguageModel, what: str, retrain: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The metadata and tensors of the head file ``path`` (``what``: "an EAGLE head", for messages), checked
    against ``target``; a missing, unreadable or foreign file is a :class:`ConfigError` naming ``retrain``."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no {what} at {path}; train one with {retrain} and pass weights=<its file>")
    try:
        with safe_open(str(path), "pt") as f:
            meta = _decoded(f)
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as error:
        raise ConfigError(f"{path} is not {what} file decodekit wrote: {error}") from None
    want = (meta.get("hidden_size"), meta.get("vocab_size"), meta.get("fingerprint"))
    hidden = hidden_size_of(target)
    have = (hidden, target.vocab_size, fingerprint(target))
    if want[:2] != have[:2] or want[2] is None or abs(want[2] - have[2]) > 1e-3 * max(1.0, abs(have[2])):
        raise ConfigError(
            f"{what} {path.name} was trained for {meta.get('base', 'another target')!r} (hidden size "
            f"{want[0]}, vocabulary {want[1]}); this target differs (hidden size {have[0]}, vocabulary {have[1]}"
            f"{'' if want[:2] != have[:2] else ', other weights'}). Train one for it with {retrain} base=<it>"
        )
    layers = num_layers_of(target)
    if meta.get("num_layers") is not None and layers is not None and meta["num_layers"] != layers:
        raise ConfigError(
            f"{what} {path.name} was trained for {meta.get('base', 'another target')!r} with {meta['num_layers']} "
            f"layers; this target has {layers} (the same embeddings: a truncated copy?). Train one for it with "
            f"{retrain} base=<it>"
        )
    return meta, tensors


def load_tensors(
    module: nn.Module,
    tensors: dict[str, torch.Tensor],
    path: str | Path,
    what: str,
    retrain: str,
    skip: str = "",
    advice: str | None = None,
) -> None:
    """Load a head file's ``tensors`` into ``module`` (built for the target), or refuse with a
    :class:`ConfigError` naming the file and each tensor that is missing, unexpected or of another shape (the shape
    the head for this target expects and the file's): never torch's ``load_state_dict`` error from deep inside.
    Keys containing ``skip`` (when given) may be absent from the file. ``advice`` replaces the message's closing
    advice (to retrain with ``retrain``): a released head is not retrained here."""
    expected = module.state_dict()
    wrong = [
        f"{k!r} has shape {list(tensors[k].shape)} in the file, expected {list(v.shape)}"
        for k, v in expected.items()
        if k in tensors and tensors[k].shape != v.shape
    ]
    missing = [k for k in expected if k not in tensors and not (skip and skip in k)]
    unexpected = [k for k in tensors if k not in expected]
    if wrong or missing or unexpected:
        problems = wrong + [f"{k!r} is missing" for k in missing] + [f"{k!r} is not part of it" for k in unexpected]
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        advice = advice or f"train one for this target with {retrain} base=<it>"
        raise ConfigError(
            f"{path} does not fit {what} for this target: tensor {shown}. The file is damaged or was written for "
            f"another model; {advice}"
        )
    module.load_state_dict(tensors, strict=False)


def head_rows(target: LanguageModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The target's output-head rows for the token ids ``ids [V_d]``: weight ``[V_d, H]`` and bias ``[V_d]`` (or
    None), dense and detached; None when the output head is not a plain linear map."""
    lm_head = getattr(target, "lm_head", None)
    weight, bias = dense(getattr(lm_head, "weight", None)), dense(getattr(lm_head, "bias", None))
    if weight is None or weight.dim() != 2:
        return None
    return weight[ids].detach(), (None if bias is None else bias[ids].detach())


def dense(value: Any) -> torch.Tensor | None:
    """A tensor as a plain dense one (``kernels="onednn"`` keeps prepacked MKL-DNN copies), else None."""
    if not isinstance(value, torch.Tensor):
        return None
    return value.to_dense() if value.is_mkldnn else value


class TrimmedHead:
    """The target's output head restricted to a draft vocabulary: scores over ``ids [V_d]`` only, and the full-width
    draft logits with ``-inf`` outside it (never drafted, ``q = 0``: rejection sampling stays exact).

    Args:
        target: the target whose output head the drafter shares.
        ids: ``[V_d]`` the token ids scored.
    """

    def __init__(self, target: LanguageModel, ids: torch.Tensor) -> None:
        self.target, self.ids = target, ids
        rows = head_rows(target, ids)
        self.proj: nn.Module | None = None  # None: run the full head and slice
        if rows is not None:
            weight, bias = rows
            linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
            linear.weight = nn.Parameter(weight, requires_grad=False)
            linear.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
            self.proj = match_kernels(linear, target)  # the target's CPU kernels, if it has any
        self.dtype = None if rows is None else rows[0].dtype
        self.softcap = getattr(target, "softcap", None)

    def scores(self, g: torch.Tensor) -> torch.Tensor:
        """``g [..., H]`` -> ``[..., V_d]`` float32 scores of the ids."""
        if self.proj is None:
            return self.target.head(g).float()[..., self.ids]
        scores = self.proj(g.to(self.dtype)).float()
        return torch.tanh(scores / self.softcap) * self.softcap if self.softcap else scores

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """``g [..., H]`` -> ``[..., V]`` float32 draft logits, ``-inf`` outside the ids."""
        full = torch.full((*g.shape[:-1], self.target.vocab_size), float("-inf"), device=g.device)
        return full.index_copy_(full.dim() - 1, self.ids, self.scores(g))
