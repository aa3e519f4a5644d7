"""Train an EAGLE-3 head for a target (``python -m decodekit train recipe=eagle3``, docs/training.md): the zoo's
``eagle3`` drafter (:mod:`decodekit.drafters.eagle3`).

Self-distillation on the EAGLE recipe's cached sequences (:mod:`decodekit.train.feature_data`; point ``data_dir`` at
an EAGLE run's ``data``) plus the target's hidden states of three layers at every position, computed once and cached
there (:mod:`decodekit.train.layer_features`). EAGLE-3's objective, with training-time test: the head is unrolled
for ``ttt_steps`` draft steps. Step 0 at anchor ``p`` reads ``(x_{p+1}, fuse(h_p))``; step ``j`` reads
``(x_{p+j+1}, g^{(j-1)}_p)``, the previous step's output, at position ``p + j``, and attends to the true entries
``0 .. p`` and to its own earlier steps at the same anchor (:func:`ttt_mask`): what drafting ``j + 1`` tokens
ahead of a committed position sees. Each step's loss is the soft cross-entropy to the target's distribution at
``p + j + 1`` over the ``train_vocab`` most frequent tokens, weighted ``decay^j``; no feature regression. The
tokens are the target's own (self-distilled), which is what an accepted draft prefix feeds.

``architecture``: ``"eagle3"`` (the default) trains EAGLE-3's own head, the architecture its authors release
(:class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead`: the embedding and the feature normalised apart and
concatenated into the layer's attention input, the feature as its residual, its own output layer over the draft
vocabulary), started from the target's last layer, final norm and output rows; its file exports to the authors'
and vLLM's layouts (:func:`decodekit.train.export.export_head`). ``"fc"``: the head shipped until now, EAGLE-1's
input ``fc([embed ; feature])`` into a layer of the target's architecture, scoring with the target's output rows.

``init``: a head file of the run's architecture to start from (its layer, its ``fc`` or own output rows, and its
``fuse`` when it reads the same layers: training continues; ``init_vocab``: and its draft vocabulary, which then
leads the training vocabulary, so that continuing on data of another mix, e.g. chat only, does not move the draft
vocabulary to that mix; ``fc`` runs may start from an EAGLE-1 head); otherwise ``fuse`` starts as the least-squares
map from the three layers' states to what the layer was trained on: for ``eagle3`` the state entering the target's
last layer (the layer is a copy of it), for ``fc`` the final feature (an EAGLE-1 head's input). On a CPU comparison
(docs/training.md) the first start took an ``eagle3`` head from 0.067 to 0.172 held-out step-1 agreement.

``device``: where the target and the head run (None: CUDA when there is one). On a GPU the states are computed per
batch (``online``: one target forward a step, nothing cached; the data then needs only the sequences), on the CPU
they are cached once. ``time_budget_s`` fits the schedule to a wall-clock budget (:func:`~decodekit.train.
feature_heads.fit`).

Writes to ``out_dir``: ``data/`` (unless ``data_dir``), ``checkpoints/step_*`` (``resume=true``), ``history.json``,
``summary.json``, ``loss.png`` and ``eagle3_<base>.safetensors``; copy it to ``decodekit/weights/`` to ship it.
``export="speculators"`` (or ``"eagle"``) also writes the head in that layout to ``eagle3_<base>_<format>/``
(:func:`~decodekit.train.export.export_head`), ready for ``vllm serve --speculative-config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.errors import ConfigError
from decodekit.train.eagle3_start import continue_from, fit_fuse, from_fc_head, lead_with
from decodekit.train.recipe import HeadConfig, shares


def ttt_mask(n: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[1, 1, n, (step + 1) n]`` bool: step ``step``'s query at anchor ``p`` may attend to step 0's entries
    ``0 .. p`` (the committed context) and to steps ``1 .. step``'s entries at anchor ``p`` (its own draft path)."""
    p = torch.arange(n, device=device)
    blocks = [p[None, :] <= p[:, None]] + [torch.eye(n, dtype=torch.bool, device=device)] * step
    return torch.cat(blocks, 1)[None, None]


def ttt_unroll(head: Any, embed: Any, tokens: torch.Tensor, feat: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head unrolled as it drafts (module docstring): ``tokens [B, n + 1]``, the fused features ``feat [B, n, H]``
    of anchors ``0 .. n - 1``; returns ``g^{(j)} [B, n, H]`` for ``j < steps``, step ``j``'s output at each anchor,
    which predicts the token ``j + 2`` after it."""
    from transformers import DynamicCache

    batch, n = feat.shape[:2]
    tokens = torch.nn.functional.pad(tokens, (0, steps - 1))
    anchors = torch.arange(n, device=tokens.device)[None].expand(batch, -1)
    cache, outs = DynamicCache(), []
    for j in range(steps):
        with torch.no_grad():  # the target's embedding is frozen: no gradient into its [V, H] table
            emb = embed(tokens[:, j + 1 : j + 1 + n])
        feat = head(emb, feat, anchors + j, ttt_mask(n, j, tokens.device), cache)
        outs.append(feat)
    return outs


def ttt_loss(
    head: Any,
    embed: Any,
    w_d: torch.Tensor,
    tokens: torch.Tensor,
    taps: torch.Tensor,
    feats: torch.Tensor,
    lengths: torch.Tensor,
    starts: torch.Tensor,
    steps: int,
    decay: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE-3's loss on a batch (module docstring): ``tokens [B, L]``, the layer states ``taps [B, L, k H]``, the
    final features ``feats [B, L, H]`` (the target's distributions, ``softmax(W_d f)``), ``lengths [B]``, ``starts
    [B]`` (a prediction counts when the token it predicts is a response token); ``w_d [V_d, H]``. Returns the
    loss (the ``decay^j``-weighted sum over the steps) and ``acc`` (step 0's top-1 agreement with the target over
    ``V_d``), ``acc1`` ... per later step, ``ce`` (step 0's cross-entropy)."""
    from decodekit.train.eagle_vocab import scorer

    score = scorer(head, w_d)  # its own output rows (in w_d's order), else the target's w_d
    n = tokens.shape[1] - 1  # anchors p = 0 .. L - 2
    with torch.no_grad():
        p_all = torch.nn.functional.pad(feats.float() @ w_d.T, (0, 0, 0, steps - 1)).softmax(-1)  # [B, L + s-1, V]
    outs = ttt_unroll(head, embed, tokens, head.fuse(taps[:, :n].float()), steps)
    anchors = torch.arange(n, device=tokens.device)[None]
    total, stats = torch.zeros((), device=tokens.device), {}
    for j, g in enumerate(outs):
        t = anchors + j  # the position step j drafts from; it predicts the token at t + 2
        valid = (t + 1 < lengths[:, None]) & (t + 2 >= starts[:, None])
        logq = score(g, len(w_d)).float().log_softmax(-1)
        p = p_all[:, j + 1 : j + 1 + n]
        ce = -(p * logq).sum(-1)[valid].mean()
        total = total + decay**j * ce
        stats[f"acc{j}" if j else "acc"] = float((logq.argmax(-1) == p.argmax(-1))[valid].float().mean())
        stats.setdefault("ce", float(ce.detach()))
    return total, stats


def new_head(target: Any, vocab: torch.Tensor, taps: int, release: bool) -> Any:
    """An untrained EAGLE-3 head for ``target`` over the training vocabulary ``vocab [V]``, reading ``taps``
    layers: EAGLE-3's own architecture (``release``: the released heads' layer and output rows,
    :class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead`) or the ``fc`` head (EAGLE-1's input, the
    target's output rows)."""
    from decodekit.drafters.eagle3_head import Eagle3ReleaseHead
    from decodekit.drafters.eagle3_release import head_config, llama_config
    from decodekit.drafters.eagle_head import EagleHead

    config = target.config
    if not release:
        return EagleHead(config, vocab, taps=taps)
    head = Eagle3ReleaseHead(llama_config(head_config(config)), len(vocab), taps * int(config.hidden_size))
    head.vocab = vocab.clone()
    return head


def release_metadata(target: Any) -> dict[str, Any]:
    """A head file's fields for an EAGLE-3 head of the released architecture on ``target``, which the drafter and
    :func:`~decodekit.train.export.export_head` read: ``architecture``, ``head_config`` (the head's
    ``config.json`` without ``draft_vocab_size``) and the target's ``architectures``."""
    from decodekit.drafters.eagle3_release import head_config
    from decodekit.drafters.eagle_head import RELEASE

    config = target.config
    return {"architecture": RELEASE, "head_config": head_config(config),
            "target_architectures": list(getattr(config, "architectures", None) or [])}  # fmt: skip


@shares(HeadConfig)
def train(
    out_dir: str | Path,
    *,
    layers: tuple[int, ...] | None = None,
    self_instruct: int = 0,
    draft_len: int = 4,
    ttt_steps: int = 3,
    decay: float = 0.8,
    init: str | None = None,
    init_vocab: bool = False,
    fuse_sequences: int = 64,
    architecture: str = "eagle3",
    export: str | None = None,
    **shared: Any,
) -> dict[str, Any]:
    """Train the head; returns the summary numbers (also in ``summary.json``). The recipe's own knobs are above
    (``decodekit/recipes/train/eagle3.yaml`` documents each); ``shared``: :class:`~decodekit.train.recipe.HeadConfig`'s
    (data, optimisation, device)."""
    cfg = HeadConfig.of("eagle3", locals(), epochs=2, lr=5e-4, save_every=100)  # every override, before any work
    from decodekit.drafters.eagle3_head import default_layers
    from decodekit.drafters.eagle_head import RELEASE, read_init
    from decodekit.train.arguments import chosen_layers
    from decodekit.train.eagle_vocab import pick_vocab
    from decodekit.train.feature_data import by_length
    from decodekit.train.feature_heads import device_settings, finish_run, fit, start_run
    from decodekit.train.layer_features import cached_layer_states, final_and_layer_states, layer_states

    dev, online = device_settings(cfg.device, cfg.online, cfg.time_budget_s)
    gen_batch_size, progress = cfg.gen_batch_size, cfg.progress
    if init_vocab and init is None:
        raise ConfigError("init_vocab=true keeps the init head's draft vocabulary: name the head with init=<file>")
    release = architecture == RELEASE
    if export is not None and not release:
        raise ConfigError(f"export={export} writes an EAGLE-3 head of the released architecture: pass "
                          "architecture=eagle3, or export=null")  # fmt: skip
    picked: tuple[int, ...] = ()
    start: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None  # the init head's metadata and tensors

    def check_target(target: Any) -> tuple[int, ...] | None:  # before the data is built (an hour on a CPU)
        nonlocal picked, start
        picked = chosen_layers(layers, default_layers(target.num_layers), target.num_layers)
        if init is not None:
            start = read_init(init, target, "python -m decodekit train recipe=eagle3")
            theirs = start[0].get("architecture", "fc")
            if theirs != architecture and not (release and theirs == "fc" and start[0].get("layers")):
                raise ConfigError(
                    f"init={init} is a head of the {theirs!r} architecture and this run trains architecture="
                    f"{architecture!r}: pass architecture={theirs} to continue it, or init=null to start from the "
                    "target"
                )  # an fc EAGLE-3 head starts a released one (eagle3_start.from_fc_head), reading the same layers
            if theirs != architecture and start[0]["layers"] != list(picked):
                raise ConfigError(f"init={init} reads layers {start[0]['layers']} and this run reads {list(picked)}: "
                                  f"pass layers={start[0]['layers']} to start from it")  # fmt: skip
        return None if online else picked  # cached: the features' forward keeps these layers' states too

    recipe, out, target, data = start_run(cfg, check_target, device=dev, features=not online)
    architecture_fields = release_metadata(target) if release else {}
    recipe["layers"] = list(picked)
    if init_vocab:  # the init head's draft vocabulary leads the training vocabulary, so a size-of-it pick keeps it
        data.vocab = lead_with(start[1]["vocab"], data.vocab)
    taps = None
    if not online:
        taps = cached_layer_states(target, data.tokens, data.lengths, picked, cfg.data_path, gen_batch_size, progress)

    def states(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The final features and layer states of the sequences ``rows`` (float16, on the CPU)."""
        if not online:
            return data.feats[rows], taps[rows]
        return by_length(data.tokens[rows], data.lengths[rows], gen_batch_size,
                         lambda t, x: final_and_layer_states(t, x, picked), target, "target states", False)  # fmt: skip

    w_d = target.lm_head.weight[data.vocab.to(dev)].detach()
    head = new_head(target, data.vocab, len(picked), release)
    head.init_from(target)
    fuse_error, kept_fuse, converted = None, False, None  # an EAGLE-3 init of the same layers keeps its fuse
    train_rows = (~data.held).nonzero()[:fuse_sequences, 0]  # what the start is fitted or measured on
    if start is not None:  # start from a trained head (its layer and fc; the vocabulary is this run's)
        meta, tensors = start
        kept_fuse = meta.get("layers") == list(picked) and "fuse.weight" in tensors
        if release and meta.get("architecture", "fc") == "fc":  # the fc head mapped onto the released layer
            real = torch.arange(data.tokens.shape[1])[None] < data.lengths[train_rows][:, None]
            with torch.no_grad():
                embeds = target.embed(data.tokens[train_rows].to(target.device)).cpu()
            converted = from_fc_head(head, tensors, embeds[real], states(train_rows)[1][real])
            kept_fuse = True  # from_fc_head set it: (B F), the fc head's own fuse mapped
        else:
            continue_from(head, tensors, kept_fuse)
    head = head.to(dev)
    if not kept_fuse:
        feats, fuse_taps = states(train_rows)
        if release:  # the copied last layer reads the state entering it, not the final (normed) feature
            last = (target.num_layers - 1,)
            feats = by_length(data.tokens[train_rows], data.lengths[train_rows], gen_batch_size,
                              lambda t, x: layer_states(t, x, last), target, "layer states", False)  # fmt: skip
        fuse_error = fit_fuse(head, fuse_taps.to(dev), feats.to(dev), data.lengths[train_rows].to(dev))

    def batch_loss(idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        tokens, feats, lengths, starts = data.batch(idx, dev)
        if online:
            feats, batch_taps = final_and_layer_states(target, tokens, picked)
        else:
            batch_taps = taps[idx.cpu()].to(dev)
        return ttt_loss(head, target.embed, w_d, tokens, batch_taps, feats, lengths, starts, ttt_steps, decay)

    trained, history, numbers = fit(
        head, batch_loss, data, out, **cfg.fit_args(), desc="training EAGLE-3 head", device=dev
    )
    val = data.subset(data.held)
    val.feats, val_taps = states(data.held.nonzero()[:, 0])
    summary = finish_run(
        trained, data, out, target, recipe,
        pick=lambda sizes: pick_vocab(trained, target, val, sizes, draft_len, val_taps),
        vocab_sizes=tuple(cfg.vocab_sizes), history=history, numbers=numbers, name="eagle3", title="EAGLE-3 head",
        loss_label=f"CE over {ttt_steps} test-time steps", metadata={"layers": list(picked), **architecture_fields},
        keep=(lambda h, v: h.keep_vocab(v)) if release else None, layers=list(picked), fuse_fit_error=fuse_error,
        converted_from_fc=converted,
    )  # fmt: skip
    if export is not None:  # the run's own export directory, written afresh (a resumed run replaces it)
        import shutil

        from decodekit.train.arguments import file_stem
        from decodekit.train.export import export_head

        where = out / f"eagle3_{file_stem(recipe['base'])}_{export}"
        shutil.rmtree(where, ignore_errors=True)
        export_head(out / f"eagle3_{file_stem(recipe['base'])}.safetensors", where, format=export)
    return summary
