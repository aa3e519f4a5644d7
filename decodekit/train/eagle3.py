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

``init``: a head file to start from (its layer and ``fc``, and its ``fuse`` when it is an EAGLE-3 head of the same
layers: training continues; ``init_vocab``: and its draft vocabulary, which then leads the training vocabulary, so
that continuing on data of another mix, e.g. chat only, does not move the draft vocabulary to that mix);
otherwise ``fuse`` starts as the least-squares map from the three layers' states to the final feature, so an
EAGLE-1 head's layer reads what it was trained on from the first step.

``device``: where the target and the head run (None: CUDA when there is one). On a GPU the states are computed per
batch (``online``: one target forward a step, nothing cached; the data then needs only the sequences), on the CPU
they are cached once. ``time_budget_s`` fits the schedule to a wall-clock budget (:func:`~decodekit.train.
feature_heads.fit`).

Writes to ``out_dir``: ``data/`` (unless ``data_dir``), ``checkpoints/step_*`` (``resume=true``), ``history.json``,
``summary.json``, ``loss.png`` and ``eagle3_<base>.safetensors``; copy it to ``decodekit/weights/`` to ship it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.checks import check_bool, check_float, check_int
from decodekit.errors import ConfigError
from decodekit.train.arguments import check_arguments


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
    n = tokens.shape[1] - 1  # anchors p = 0 .. L - 2
    with torch.no_grad():
        p_all = torch.nn.functional.pad(feats.float() @ w_d.T, (0, 0, 0, steps - 1)).softmax(-1)  # [B, L + s-1, V]
    outs = ttt_unroll(head, embed, tokens, head.fuse(taps[:, :n].float()), steps)
    anchors = torch.arange(n, device=tokens.device)[None]
    total, stats = torch.zeros((), device=tokens.device), {}
    for j, g in enumerate(outs):
        t = anchors + j  # the position step j drafts from; it predicts the token at t + 2
        valid = (t + 1 < lengths[:, None]) & (t + 2 >= starts[:, None])
        logq = (g @ w_d.T).log_softmax(-1)
        p = p_all[:, j + 1 : j + 1 + n]
        ce = -(p * logq).sum(-1)[valid].mean()
        total = total + decay**j * ce
        stats[f"acc{j}" if j else "acc"] = float((logq.argmax(-1) == p.argmax(-1))[valid].float().mean())
        stats.setdefault("ce", float(ce.detach()))
    return total, stats


def lead_with(first: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """``first [V_1]`` (token ids), then the tokens of ``vocab [V]`` not in it, in order, cut to ``V`` tokens: a
    training vocabulary whose first ``V_1`` tokens are a given draft vocabulary (``V_1 <= V``)."""
    first = first.long()
    if len(first) > len(vocab):
        raise ConfigError(f"init_vocab: the init head drafts {len(first)} tokens, more than train_vocab={len(vocab)}")
    rest = vocab[~torch.isin(vocab, first)]
    return torch.cat([first, rest])[: len(vocab)]


@torch.no_grad()
def fit_fuse(head: Any, taps: torch.Tensor, feats: torch.Tensor, lengths: torch.Tensor, ridge: float = 1e-2) -> float:
    """Set ``head.fuse`` to the ridge least-squares map from the layer states ``taps [N, L, k H]`` to the final
    features ``feats [N, L, H]`` over the real positions; returns the fit's relative error ``|uW - f| / |f|``."""
    real = torch.arange(taps.shape[1], device=taps.device)[None] < lengths[:, None]
    u, f = taps[real].double(), feats[real].double()
    gram = u.T @ u
    gram += ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    w = torch.linalg.solve(gram, u.T @ f).T  # [H, k H]
    head.fuse.weight.copy_(w.to(head.fuse.weight.dtype))
    return float((u @ w.T - f).norm() / f.norm())


def train(
    out_dir: str | Path,
    *,
    base: str = "smollm2-135m-instruct",
    layers: tuple[int, ...] | None = None,
    chat_prompts: int = 256,
    code_prompts: int = 256,
    text_chunks: int = 1024,
    self_instruct: int = 0,
    max_prompt_tokens: int = 320,
    max_new_tokens: int = 128,
    seq_len: int = 384,
    gen_batch_size: int = 8,
    train_vocab: int = 16384,
    vocab_sizes: tuple[int, ...] = (2048, 4096, 8192, 16384),
    draft_len: int = 4,
    ttt_steps: int = 3,
    decay: float = 0.8,
    val_fraction: float = 0.05,
    epochs: int = 2,
    batch_size: int = 8,
    lr: float = 5e-4,
    weight_decay: float = 0.0,
    warmup: float = 0.03,
    save_every: int = 100,
    resume: bool = False,
    init: str | None = None,
    init_vocab: bool = False,
    fuse_sequences: int = 64,
    device: str | None = None,
    online: bool | None = None,
    time_budget_s: float | None = None,
    data_dir: str | None = None,
    threads: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the head; returns the summary numbers (also in ``summary.json``). See the module docstring and
    ``decodekit/recipes/train/eagle3.yaml`` for what each argument does."""
    check_arguments(locals())  # every override, before the model or the data
    from decodekit.drafters.eagle3_release import default_layers
    from decodekit.drafters.eagle_head import EagleHead, read_init
    from decodekit.train.eagle_vocab import pick_vocab
    from decodekit.train.feature_data import by_length
    from decodekit.train.feature_heads import device_settings, finish_run, fit, start_run
    from decodekit.train.layer_features import cached_layer_states, final_and_layer_states

    dev, online = device_settings(device, online, time_budget_s)
    check_int("draft_len", draft_len, low=1)
    check_int("ttt_steps", ttt_steps, low=1)
    check_int("fuse_sequences", fuse_sequences, low=1)
    if check_bool("init_vocab", init_vocab) and init is None:
        raise ConfigError("init_vocab=true keeps the init head's draft vocabulary: name the head with init=<file>")
    check_float("decay", decay, low=0, low_open=True)
    picked: tuple[int, ...] = ()
    start: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None  # the init head's metadata and tensors

    def check_target(target: Any) -> tuple[int, ...] | None:  # before the data is built (an hour on a CPU)
        nonlocal picked, start
        picked = tuple(sorted({int(i) for i in (layers or default_layers(target.num_layers))}))
        if not picked or picked[0] < 1 or picked[-1] > target.num_layers:
            raise ConfigError(f"layers must be decoder layers 1 .. {target.num_layers} of the target; got {layers}")
        if init is not None:
            start = read_init(init, target, "python -m decodekit train recipe=eagle3")
        return None if online else picked  # cached: the features' forward keeps these layers' states too

    recipe, out, target, data = start_run(locals(), check_target, device=dev, features=not online)
    recipe["layers"] = list(picked)
    if init_vocab:  # the init head's draft vocabulary leads the training vocabulary, so a size-of-it pick keeps it
        data.vocab = lead_with(start[1]["vocab"], data.vocab)
    taps = None
    if not online:
        where = out / "data" if data_dir is None else Path(data_dir)
        taps = cached_layer_states(target, data.tokens, data.lengths, picked, where, gen_batch_size, progress)

    def states(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The final features and layer states of the sequences ``rows`` (float16, on the CPU)."""
        if not online:
            return data.feats[rows], taps[rows]
        return by_length(data.tokens[rows], data.lengths[rows], gen_batch_size,
                         lambda t, x: final_and_layer_states(t, x, picked), target, "target states", False)  # fmt: skip

    w_d = target.lm_head.weight[data.vocab.to(dev)].detach()
    head = EagleHead(target.hf.config, data.vocab, taps=len(picked))
    head.init_from(target)
    fuse_error, kept_fuse = None, False  # an EAGLE-3 init of the same layers continues with its own fuse
    if start is not None:  # start from a trained head (its layer and fc; the vocabulary is this run's)
        meta, tensors = start
        kept_fuse = meta.get("layers") == list(picked) and "fuse.weight" in tensors
        skip = ("vocab",) if kept_fuse else ("vocab", "fuse.weight")
        head.load_state_dict({k: v.float() for k, v in tensors.items() if k not in skip}, strict=False)
    head = head.to(dev)
    if not kept_fuse:
        train_rows = (~data.held).nonzero()[:fuse_sequences, 0]
        feats, fuse_taps = states(train_rows)
        fuse_error = fit_fuse(head, fuse_taps.to(dev), feats.to(dev), data.lengths[train_rows].to(dev))

    def batch_loss(idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        tokens, feats, lengths, starts = data.batch(idx, dev)
        if online:
            feats, batch_taps = final_and_layer_states(target, tokens, picked)
        else:
            batch_taps = taps[idx.cpu()].to(dev)
        return ttt_loss(head, target.embed, w_d, tokens, batch_taps, feats, lengths, starts, ttt_steps, decay)

    trained, history, numbers = fit(
        head, batch_loss, data, out, epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
        warmup=warmup, save_every=save_every, resume=resume, seed=seed, progress=progress,
        desc="training EAGLE-3 head", device=dev, time_budget_s=time_budget_s,
    )  # fmt: skip
    val = data.subset(data.held)
    val.feats, val_taps = states(data.held.nonzero()[:, 0])
    return finish_run(
        trained, data, out, target, recipe,
        pick=lambda sizes: pick_vocab(trained, target, val, sizes, draft_len, val_taps),
        vocab_sizes=vocab_sizes, history=history, numbers=numbers, name="eagle3", title="EAGLE-3 head",
        loss_label=f"CE over {ttt_steps} test-time steps", metadata={"layers": list(picked)},
        layers=list(picked), fuse_fit_error=fuse_error,
    )  # fmt: skip
