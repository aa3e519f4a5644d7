"""The EAGLE head (:class:`EagleHead`: ``fc [2H -> H]``, one decoder layer of the target's architecture, its final
norm) and its file: the head shipped for the zoo target, loading a head checked against its target. The drafter that
runs it is :mod:`decodekit.drafters.eagle`; the recipe that trains it, :mod:`decodekit.train.eagle`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from decodekit.cache import CacheView
from decodekit.drafters.head_files import load_tensors, on_target, read_head, read_metadata, save_head, target_config
from decodekit.drafters.lean_layer import LeanLayer, compiled_step, lean_layer
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel
from decodekit.resources import shipped_weights

DEFAULT_WEIGHTS = "eagle_smollm2-135m-instruct.safetensors"  # the zoo target's head (docs/training.md)
RETRAIN = "python -m decodekit train recipe=eagle (docs/training.md)"
RETRAIN_EAGLE3 = "python -m decodekit train recipe=eagle3 (docs/training.md)"
RELEASE = "eagle3"  # a head file's "architecture": EAGLE-3's own (Eagle3ReleaseHead), not EagleHead's fc input


def default_weights() -> Path:
    """The head shipped for the zoo's ``smollm2-135m-instruct``."""
    return shipped_weights(DEFAULT_WEIGHTS)


class EagleHead(nn.Module):
    """The draft head: ``fc [2H -> H]``, one decoder layer of the target's architecture, the final norm; for
    EAGLE-3 (``taps > 0``) also ``fuse [taps * H -> H]``, which turns the target's hidden states of ``taps`` layers,
    concatenated, into the feature the head reads at a committed position (the drafter applies it).

    Args:
        config: the target's transformers config (the layer's sizes, attention and RoPE settings come from it).
        vocab: ``[V_d]`` the token ids the head scores (ascending), or None for the full vocabulary.
        taps: how many target layers ``fuse`` reads (0: none, EAGLE-1's head on the final features).
    """

    def __init__(self, config: Any, vocab: torch.Tensor | None = None, taps: int = 0) -> None:
        super().__init__()
        from transformers import AutoModel

        from decodekit.models.hf_support import cache_argument

        cfg = copy.deepcopy(config)
        cfg.num_hidden_layers, cfg.vocab_size, cfg.pad_token_id = 1, 1, None  # no token embedding table
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = list(cfg.layer_types[-1:])
        hidden = int(config.hidden_size)
        self.fc = nn.Linear(2 * hidden, hidden)
        self.fuse = nn.Linear(taps * hidden, hidden, bias=False) if taps else None
        self.decoder = AutoModel.from_config(cfg)
        self._cache_arg = cache_argument(self.decoder)
        vocab = torch.arange(int(config.vocab_size)) if vocab is None else vocab.long()
        self.register_buffer("vocab", vocab)
        self.lean: LeanLayer | None = None  # set by load_head: the layer's draft steps without transformers' calls

    def forward(
        self,
        embeds: torch.Tensor,
        feats: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: CacheView | None = None,
    ) -> torch.Tensor:
        """``embeds [B, N, H]`` (of the tokens ``x_{t+1}``) and ``feats [B, N, H]`` (``f_t``) -> ``g [B, N, H]``.

        Without a cache, causal attention over the ``N`` positions (training); with one (a cache's view,
        ``cache.stage(N)``), ``positions [B, N]`` and a 4-D bool ``mask [B, 1, N, S]``, as
        :meth:`LanguageModel.forward`, through :attr:`lean` where :func:`load_head` set one (the same arithmetic,
        without transformers' per-call work)."""
        x = self.fc(torch.cat([embeds, feats], -1))
        out = compiled_step(self, self.lean, x, positions, mask, cache)  # dk.generate(compile=True)
        if out is not None:
            return out
        if cache is not None and self.lean is not None:
            return self.lean(x, positions, mask, cache)  # type: ignore[arg-type]
        kwargs: dict[str, Any] = {}
        if cache is not None:
            kwargs = {self._cache_arg: cache, "use_cache": True}
        return self.decoder(inputs_embeds=x, position_ids=positions, attention_mask=mask, **kwargs).last_hidden_state

    def init_from(self, target: LanguageModel) -> None:
        """Start from the target: the layer is a copy of its last decoder layer, the norm of its final norm, and
        ``fc`` passes ``f_t`` through (``[0 | I]`` plus small noise on the embedding half)."""
        layers = getattr(target, "layers", None)
        if layers is not None:
            self.decoder.layers[0].load_state_dict(layers[-1].state_dict())
        norm = getattr(target, "_norm", None)
        if norm is not None and hasattr(self.decoder, "norm"):
            self.decoder.norm.load_state_dict(norm.state_dict())
        hidden = self.fc.out_features
        with torch.no_grad():
            self.fc.weight.normal_(0, 0.02)
            self.fc.weight[:, hidden:] = torch.eye(hidden)
            self.fc.bias.zero_()

    def save(self, path: str | Path, metadata: dict[str, Any]) -> None:
        """Write the weights (float16) and ``metadata`` (:func:`~decodekit.drafters.head_files.head_metadata`)."""
        save_head(self, path, metadata, skip="embed_tokens")


def _load_release_head(
    path: str | Path,
    meta: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    target: LanguageModel,
    bf16: bool | None,
    retrain: str,
) -> nn.Module:
    """A head file of EAGLE-3's own architecture (``meta["head_config"]``: its ``config.json``) for ``target``."""
    from decodekit.drafters.eagle3_head import Eagle3ReleaseHead
    from decodekit.drafters.eagle3_release import llama_config

    hidden = int(meta["hidden_size"])
    head = Eagle3ReleaseHead(llama_config(meta["head_config"]), len(tensors["vocab"]), len(meta["layers"]) * hidden)
    load_tensors(head, tensors, path, "an EAGLE-3 head", retrain)
    return on_target(head, target, bf16)


def read_init(path: str | Path, target: LanguageModel, retrain: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The metadata and tensors of the EAGLE(-3) head ``path`` a training run starts from, checked against
    ``target``; a file that is not an EAGLE head (no ``fc``) is a :class:`ConfigError` naming ``retrain``."""
    meta, tensors = read_head(path, target, "an EAGLE head", retrain)
    if "fc.weight" not in tensors and meta.get("architecture") != RELEASE:
        raise ConfigError(f"{path} is not an EAGLE head file (no fc layer); start from one written by {retrain}")
    return meta, tensors


def check_layers(path: str | Path, meta: dict[str, Any], target: LanguageModel, retrain: str) -> None:
    """Refuse an EAGLE-3 head (its file's ``layers``: the target layers it reads) whose layers ``target`` does
    not have: it was trained for another target."""
    layers = [int(i) for i in meta.get("layers", ())]
    try:
        count = target.num_layers
    except NotImplementedError:  # a model without a layer list: what its forward returns is checked instead
        return
    if layers and not all(0 <= i <= count for i in layers):
        base = meta.get("base", "another target")
        size = "" if meta.get("num_layers") is None else f" ({meta['num_layers']} layers)"
        raise ConfigError(
            f"the EAGLE-3 head {Path(path).name} was trained for {base!r}{size}: it reads that model's layers "
            f"{layers}, and this target has {count} layers. Train one for yours with {retrain} base=<your target>"
        )


def load_head(
    path: str | Path,
    target: LanguageModel,
    *,
    lean: bool = True,
    bf16: bool | None = None,
    retrain: str | None = None,
) -> tuple[EagleHead, dict[str, Any]]:
    """The head in ``path`` for ``target`` and its metadata, for drafting; refuses a head trained for another
    target.

    The head takes the target's device, dtype and CPU kernels (:func:`~decodekit.kernels.match_kernels`; ``bf16``:
    bfloat16 packed weights, None = where the CPU computes them natively), and with ``lean`` its layer runs as a
    :class:`~decodekit.drafters.lean_layer.LeanLayer` where one covers it (``lean=False``, ``bf16=False``: the head
    as trained, through transformers in the target's dtype). ``retrain``: the command its refusals name (None: the
    recipe of the file's kind, EAGLE or EAGLE-3)."""
    eagle3 = bool(read_metadata(path).get("layers"))  # EAGLE-3's file names the layers it reads
    config = target_config(target, "eagle3" if eagle3 else "eagle")
    if retrain is None:  # the recipe that wrote this kind of head
        retrain = RETRAIN_EAGLE3 if eagle3 else RETRAIN
    meta, tensors = read_head(path, target, "an EAGLE head", retrain)
    check_layers(path, meta, target, retrain)
    if meta.get("architecture") == RELEASE:  # EAGLE-3's own layer and output rows (decodekit.drafters.eagle3_release)
        return _load_release_head(path, meta, tensors, target, bf16, retrain), meta
    head = EagleHead(config, tensors["vocab"], taps=len(meta.get("layers", ())))
    load_tensors(head, tensors, path, "an EAGLE head", retrain, skip="embed_tokens")
    head = on_target(head, target, bf16)
    head.lean = lean_layer(head.decoder) if lean else None
    return head, meta
