"""Checks of a :class:`~decodekit.draft.tree.Draft`: its fields when it is built (host metadata, no sync) and, in
:meth:`~decodekit.draft.tree.Draft.check`, its tree against the vocabulary and the round's budget (one host sync)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from decodekit.checks import describe
from decodekit.draft.kind import DraftKind
from decodekit.errors import ComponentOutputError, IncompatibleDraftError
from decodekit.masks import tree_ancestors

if TYPE_CHECKING:
    from decodekit.draft.budget import DraftBudget
    from decodekit.draft.tree import Draft


def check_fields(draft: Draft) -> None:
    """Shapes, dtypes, devices and the kind of a new draft (host metadata, no sync); raises
    :class:`~decodekit.errors.ComponentOutputError` or :class:`~decodekit.errors.IncompatibleDraftError`."""
    _check_types(draft)
    shape = tuple(draft.tokens.shape)
    if draft.tokens.ndim != 2 or draft.parents.shape != draft.tokens.shape or draft.valid.shape != draft.tokens.shape:
        raise ComponentOutputError(
            "Draft.tokens, parents and valid must all be [B, N]; got "
            f"{shape}, {tuple(draft.parents.shape)}, {tuple(draft.valid.shape)}"
        )
    if draft.kind.needs_q and draft.q is None:
        raise IncompatibleDraftError(
            f"a {draft.kind.value} draft needs q, the distributions its tokens were drawn from; "
            "pass q=... or mark the draft DETERMINISTIC"
        )
    if draft.q is not None:
        per_node = draft.q_index is None
        if draft.q.ndim != 3 or draft.q.shape[0] != shape[0] or (per_node and draft.q.shape[1] != shape[1]):
            got = tuple(draft.q.shape)
            raise ComponentOutputError(f"Draft.q must be [B, N, V], or [B, P, V] with q_index; got {got}")
        if not per_node and tuple(draft.q_index.shape) != shape:
            raise ComponentOutputError(f"Draft.q_index must be [B, N] = {shape}, got {tuple(draft.q_index.shape)}")
    probs = draft.draft_probs
    if probs is not None and (probs.ndim != 3 or tuple(probs.shape[:2]) != shape):
        got = tuple(probs.shape)
        raise ComponentOutputError(f"Draft.draft_probs must be [B, N, V] with [B, N] = {shape}, got {got}")


def _check_types(draft: Draft) -> None:
    """dtypes, devices and the kind (host metadata, no sync)."""
    expected = {"tokens": torch.long, "parents": torch.long, "valid": torch.bool, "q_index": torch.long}
    for name, dtype in expected.items():
        value = getattr(draft, name)
        if name == "q_index" and value is None:
            continue
        if not isinstance(value, torch.Tensor) or value.dtype != dtype:
            fix = "; use .bool()" if dtype == torch.bool else "; use .long()"
            raise ComponentOutputError(f"Draft.{name} must be a {dtype} tensor, got {describe(value)}{fix}")
    for name in ("q", "draft_probs"):
        value = getattr(draft, name)
        if value is not None and (not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point):
            raise ComponentOutputError(f"Draft.{name} must be a floating-point tensor, got {describe(value)}")
    for name in ("parents", "valid", "q", "q_index", "draft_probs"):
        value = getattr(draft, name)
        if value is not None and value.device != draft.tokens.device:
            raise ComponentOutputError(
                f"Draft.{name} is on {value.device} but Draft.tokens on {draft.tokens.device}: use one device"
            )
    if not isinstance(draft.kind, DraftKind):
        try:
            object.__setattr__(draft, "kind", DraftKind(draft.kind))
        except ValueError:
            kinds = ", ".join(k.value for k in DraftKind)
            got = describe(draft.kind)
            raise ComponentOutputError(f"Draft.kind must be a DraftKind ({kinds}), got {got}") from None


def check_draft(draft: Draft, batch_size: int, vocab_size: int, budget: DraftBudget, source: str) -> None:
    """The body of :meth:`Draft.check` (one host sync)."""
    if draft.batch_size != batch_size:
        raise ComponentOutputError(f"{source} returned a draft of {draft.batch_size} rows, the batch has {batch_size}")
    if draft.num_nodes == 0:
        return
    ar = torch.arange(draft.num_nodes, device=draft.tokens.device)
    parent_valid = draft.valid.gather(1, draft.parents.clamp(0, draft.num_nodes - 1)) | (draft.parents < 0)
    safe = tree_ancestors(draft.parents.clamp(-1, draft.num_nodes - 1), draft.valid)  # even for malformed parents
    depth = safe.sum(-1) * draft.valid
    ok_tree = (~draft.valid | ((draft.parents < ar) & (draft.parents >= -1) & parent_valid)).all()
    checks = [
        (ok_tree, "every valid node needs -1 <= parents[i] < i and a valid parent (list nodes parents-first)"),
        (
            (~draft.valid | ((draft.tokens >= 0) & (draft.tokens < vocab_size))).all(),
            f"draft token ids must be in [0, {vocab_size}) (the target vocabulary)",
        ),
        (
            (draft.num_valid <= budget.nodes.to(ar.device)).all(),
            "the drafter returned more nodes than its budget allows (budget.nodes)",
        ),
        (
            (depth.max(-1).values <= budget.depth_or_nodes.to(ar.device)).all(),
            "the drafter returned a deeper tree than its budget allows (budget.depth, budget.lengths)",
        ),
    ]
    if budget.width is not None:
        has_parent = (draft.valid & (draft.parents >= 0)).long()
        parents = draft.parents.clamp(0, draft.num_nodes - 1)
        children = torch.zeros_like(draft.tokens).scatter_add_(1, parents, has_parent)
        roots = (draft.valid & (draft.parents < 0)).sum(-1)
        too_wide = (children.max(-1).values > budget.width) | (roots > budget.width)
        checks.append((~too_wide.any(), f"a node has more than budget.width={budget.width} children"))
    if draft.q_index is not None and draft.q is not None:
        rows = draft.q.shape[1]
        inside = (draft.q_index >= 0) & (draft.q_index < rows)
        checks.append(
            ((inside | ~draft.valid).all(), f"q_index must point at rows of q, in [0, {rows}), at valid nodes")
        )
    if draft.q is not None and draft.kind.needs_q:
        checks.extend(_q_checks(draft))
    if draft.__dict__.get("is_chain"):
        prefix = (draft.valid == (ar < draft.num_valid[:, None])).all()
        checks.append((prefix, "Draft.chain needs valid to be a prefix mask in every row (valid nodes first)"))
    if "used_width" in draft.__dict__:  # a declared width (knowing_width): the valid nodes must end there
        declared, exact = draft.__dict__["used_width"], draft.__dict__.get("_width_exact", True)
        if exact:
            claim = f"the draft declared a used width of {declared} (knowing_width) that its valid nodes do not have"
            checks.append((draft._valid_width() == declared, claim))
        else:
            claim = f"the draft has valid nodes past the bound on its width it declared, {declared} (knowing_width)"
            checks.append((draft._valid_width() <= declared, claim))
    if draft.host_counts is not None:
        counts = torch.tensor(draft.host_counts, device=draft.valid.device)
        claim = f"the draft declared {list(draft.host_counts)} valid nodes per row (knowing_counts), not what it has"
        checks.append(((draft.num_valid == counts).all(), claim))
    results = torch.stack([ok for ok, _ in checks]).tolist()
    for ok, (_, message) in zip(results, checks):
        if not ok:
            raise ComponentOutputError(f"{source} returned a malformed Draft: {message}")


def _q_checks(draft: Draft) -> list[tuple[torch.Tensor, str]]:
    """A sampled draft's ``q`` at its valid nodes is a distribution (finite, >= 0, summing to 1 within its dtype's
    rounding) that could have drawn the node's token (> 0 there): a ``q`` that is not biases the verifier's
    acceptance without any other sign."""
    q = draft.q
    rows = (
        draft.q_index
        if draft.q_index is not None
        else torch.arange(draft.num_nodes, device=q.device).expand_as(draft.tokens)
    )
    rows = rows.clamp(0, q.shape[1] - 1)
    tolerance = 1e-3 if q.dtype in (torch.float32, torch.float64) else 2e-2
    row_ok = (q.isfinite() & (q >= 0)).all(-1) & ((q.sum(-1, dtype=torch.float64) - 1).abs() <= tolerance)  # [B, R]
    drawn = q[torch.arange(draft.batch_size, device=q.device)[:, None], rows, draft.tokens.clamp(0, q.shape[-1] - 1)]
    return [
        ((row_ok.gather(1, rows) | ~draft.valid).all(), "Draft.q must be a distribution at each node's parent "
         f"(finite, >= 0, summing to 1 over the vocabulary, within {tolerance:g})"),
        (((drawn > 0) | ~draft.valid).all(), "Draft.q must give each drafted token the probability it was drawn "
         "with (> 0 at the node's token)"),
    ]  # fmt: skip


def check_rows(builder: str, **tensors: torch.Tensor | None) -> None:
    """Refuse a builder argument that is not a 2-D tensor ``[B, N]`` (None is skipped: a default), with the fix for
    a single row given as 1-D (host metadata, no sync)."""
    for name, value in tensors.items():
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise ComponentOutputError(f"{builder}: {name} must be a tensor [B, N], got {describe(value)}")
        if value.ndim != 2:
            fix = f"; for one row use {name}[None]" if value.ndim == 1 else ""
            raise ComponentOutputError(
                f"{builder}: {name} must be [B, N] (a row of nodes per sequence), got {describe(value)}{fix}"
            )
