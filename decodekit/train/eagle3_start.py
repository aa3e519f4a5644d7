"""Where an EAGLE-3 training run starts (``train recipe=eagle3``): the ``fuse`` fitted by least squares
(:func:`fit_fuse`), a trained head of the same architecture continued (:func:`continue_from`, its draft vocabulary
leading the training one: :func:`lead_with`), or a head of the released architecture started from a trained ``fc``
head (``architecture=eagle3 init=<an fc head file>``): :func:`from_fc_head`, below.

The ``fc`` head (:class:`~decodekit.drafters.eagle_head.EagleHead` with taps) computes ``x = A e + B u + b`` from the
token's embedding ``e`` and the fused feature ``u = F [h_2 ; h_15 ; h_27]`` (``[A B] = fc``), then a decoder layer
of the target's shape on ``x``: ``x + attn(n(x))``, the MLP, its own final norm and the target's output rows. The
released head (:class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead`) keeps the fused feature as the residual
and attends from ``[n_e(e) ; n_h(r)]``. Mapped onto it:

- the residual ``r = (B F) [h_2 ; h_15 ; h_27]``: the ``fc`` head's ``x`` without ``A e + b`` (on SmolLM2's shipped
  head ``|A e|`` is about 7% of ``|B u|`` and ``|b|`` 0.2%);
- the attention input's two halves each normed on their own: ``W n(x) ~= W g (A e + r) / rms(x)`` becomes
  ``W g A (rms(e) / rms(x)) n_e(e) + W g (rms(r) / rms(x)) n_h(r)``, the two ratios taken at their median over
  sample positions (``rms(r) / rms(x)`` is close to 1 where ``A e`` is small);
- the layer's output projection, MLP, norms, final norm and output rows as they are.

So the first draft step is the ``fc`` head's up to the dropped ``A e + b`` and the ratios' spread. Later steps differ
more: the ``fc`` head feeds its output ``g`` back through ``A e' + B g``, the released one as ``g`` itself (``B`` is
not the identity: on the shipped head ``|B g - c g| / |B g|`` is 0.45 at the best ``c``), which training with the
training-time test then fits.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.errors import ConfigError

__all__ = ["continue_from", "fit_fuse", "from_fc_head", "lead_with"]


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.float().pow(2).mean(-1).sqrt()


@torch.no_grad()
def from_fc_head(
    head: Any, tensors: dict[str, torch.Tensor], embeds: torch.Tensor, taps: torch.Tensor
) -> dict[str, float]:
    """Set ``head`` (an :class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead` over any vocabulary; its output
    rows are left as they are) from the ``fc`` head's ``tensors`` (a decodekit head file's), the two norm ratios
    measured at sample positions: their embeddings ``embeds [N, H]`` and layer states ``taps [N, k H]``.

    Returns:
        ``{"embed_share": |A e| / |B u|, "scale_embed": rms(e) / rms(x), "scale_feature": rms(r) / rms(x)}``
        (medians over the positions).
    """
    h = head.o_proj.out_features
    fc, bias = tensors["fc.weight"].float(), tensors.get("fc.bias")
    a, b = fc[:, :h], fc[:, h:]  # the fc head's input is [embed ; feature]
    fuse = b @ tensors["fuse.weight"].float()  # [H, k H]: the residual r = fuse(taps)
    e, r = embeds.float(), taps.float() @ fuse.T
    ae = e @ a.T
    x = ae + r + (0 if bias is None else bias.float())
    scale_e, scale_r = (_rms(e) / _rms(x)).median(), (_rms(r) / _rms(x)).median()
    layer = "decoder.layers.0."
    g = tensors[f"{layer}input_layernorm.weight"].float()
    for name in ("q_proj", "k_proj", "v_proj"):
        w = tensors[f"{layer}self_attn.{name}.weight"].float() * g  # [out, H]: W diag(g)
        getattr(head, name).weight.copy_(torch.cat([w @ a * scale_e, w * scale_r], 1))
    head.fuse.weight.copy_(fuse)
    head.input_norm.weight.fill_(1.0)
    head.hidden_norm.weight.fill_(1.0)
    same = {"o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
            "down_proj": "mlp.down_proj", "post_norm": "post_attention_layernorm"}  # fmt: skip
    for mine, theirs in same.items():
        getattr(head, mine).weight.copy_(tensors[f"{layer}{theirs}.weight"].float())
    head.norm.weight.copy_(tensors["decoder.norm.weight"].float())
    return {
        "embed_share": float((_rms(ae) / _rms(r)).median()),
        "scale_embed": float(scale_e),
        "scale_feature": float(scale_r),
    }


@torch.no_grad()
def continue_from(head: Any, tensors: dict[str, torch.Tensor], keep_fuse: bool) -> None:
    """Load an init head's ``tensors`` (of ``head``'s architecture) into ``head``, whose vocabulary is this run's:
    ``fuse`` only with ``keep_fuse``; an own output layer's rows by token id (the tokens the init head lacks keep
    their start)."""
    skip = {"vocab", "lm_head.weight"} | (set() if keep_fuse else {"fuse.weight"})
    head.load_state_dict({k: v.float() for k, v in tensors.items() if k not in skip}, strict=False)
    if "lm_head.weight" in tensors:
        from decodekit.drafters.eagle3_head import rows_of

        rows = rows_of(tensors["vocab"].long(), head.vocab.long().cpu())
        mine = (rows >= 0).nonzero()[:, 0]
        head.lm_head.weight[mine] = tensors["lm_head.weight"][rows[mine]].to(head.lm_head.weight)


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
