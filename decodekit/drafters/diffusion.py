"""A diffusion LM drafts a block of slots for an autoregressive target (DEER's and SpecDiff-2's drafting).

DEER (Cheng et al. 2025, "DEER: Draft with Diffusion, Verify with Autoregressive Models") and SpecDiff-2 (Sandler et
al. 2025) draft with a masked diffusion LM that shares the target's vocabulary: after the committed context (the
pending token last) the drafter appends ``k`` mask slots and denoises them, in one forward by default (DEER's
single-step drafting), and the autoregressive target verifies the block. This module is that drafting step on any
:class:`~decodekit.dlm.DLMModel` (bidirectional, or block-causal with blocks counted from the generation start such
as the zoo's ``smollm2-135m-bdlm``); the papers' alignment training (DEER's two-stage distillation, SpecDiff-2's
train-test calibration) is not here, so the zoo DLMs draft as trained for diffusion sampling.

Lossless at any temperature. Slot ``j``'s token is drawn from the DLM's distribution at slot ``j`` after the call's
logits processors (given the slots before it), and that distribution is the draft's ``q``; with one denoising step
every slot's distribution comes from the same forward, so the law of token ``j`` given the tokens before it is
exactly ``q_j``, which rejection and SpecInfer verification need. With ``steps > 1`` the slots are committed left to
right in ``steps`` chunks, each chunk's forward seeing the chunks before it: still exactly ``q_j`` given the tokens
before ``j``. Committing by confidence instead (a diffusion sampler's usual order) would let a later slot's value
decide an earlier one's, whose reported ``q`` would then not be its law given the tokens before it: the verifier's
output would drift from the target's (``tests/unit/test_diffusion_drafter.py`` shows the drift with that order).

Trees (``template=``, issue 57's "a tree from each slot's top candidates"): with one denoising step no slot sees
another's token, so slot ``j``'s ranked candidates are the same under every path, as Medusa's heads' are; the
template's node ``(r1, ..., rd)`` is slot ``d``'s ``rd``-th most likely token
(:func:`~decodekit.draft.templates.ranked_tree`). Those trees are deterministic (their tokens are picked, not
sampled), verified as point masses at any temperature: lossless with every verifier of deterministic trees. They
need ``steps=1`` (a later chunk would see one path's tokens). With ``candidates="sampled"`` (and a temperature above
0) each node is drawn instead from its slot's distribution after the call's processors given its path, siblings
independently, and that distribution is its ``q`` (kind ``SAMPLED``): SpecInfer's and the traversal verifier's
condition, so they keep the target's law at any temperature while the tree's candidates follow the DLM's law.

Cost: with ``cache=True`` (the default) the DLM keeps the committed context's K/V across rounds, computed causally
(each committed token sees those before it) and fed the tokens it has not seen, as a draft model is. A round's first
forward runs those tokens and the ``k`` slots together: the tokens causally (their K/V kept), the slots right after
them seeing the whole context and each other (block-causally past ``block_length``), their K/V staged and dropped; so
a round with one denoising step costs the DLM one forward (``steps`` in all), and the drafts equal those of a feed
then a slot forward (a test). Measured on SmolLM2 with the zoo DLM on 2 CPU cores (docs/dlm.md): 8.1 -> 6.0 s of
drafting for the same drafts, 0.74x -> 0.92x of plain decoding. The causal context is not the pattern a
block-causal DLM was trained with (its context in blocks counted back from the region); ``cache=False`` runs that
pattern exactly, the whole context recomputed every forward (on a CPU about a prefill of the context a round). Either
way the drafts are verified, so only their acceptance, never the output, depends on it.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.checks import check_bool, check_choice, check_float, check_int, check_model_spec
from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.draft.templates import TreeTemplate, fit_template, ranked_tree, resolve_template
from decodekit.drafters.chain import SamplesLikeTheTarget, draft_chain
from decodekit.drafters.model import feed_unseen, unseen_tokens
from decodekit.drafters.staged import process_paths
from decodekit.errors import ConfigError
from decodekit.masks import attend_layout, bidirectional_mask, block_causal_mask, causal_mask, staged_layout
from decodekit.models.vocab_resize import warn_other_ids
from decodekit.registry import register
from decodekit.sampling import probs_from_logits, sample
from decodekit.spec.state import DecodeState
from decodekit.types import SamplingParams

__all__ = ["DiffusionDrafter"]


@register("drafter", "diffusion")
class DiffusionDrafter(SamplesLikeTheTarget):
    """Draft ``k`` tokens a round by denoising ``k`` mask slots with a diffusion LM (module docstring).

    Args:
        model: a :class:`~decodekit.dlm.DLMModel`, or anything :func:`decodekit.dlm.load_model` takes (a zoo DLM
            such as ``"smollm2-135m-bdlm"``, a released checkpoint directory); its vocabulary must be the target's.
        steps: denoising forwards per round (1: DEER's single step); the ``k`` slots are committed left to right in
            ``steps`` chunks (the first chunks one slot larger when ``k`` does not divide).
        temperature: the drafter's sampling temperature; None = the call's sampling parameters. 0 = argmax drafts.
        cache: keep the committed context's K/V across rounds (computed causally); False = recompute the whole
            context each forward in the DLM's own attention pattern (module docstring).
        template: None = chains; a :class:`~decodekit.draft.templates.TreeTemplate` or a name in
            ``decodekit.draft.templates.TEMPLATES`` = deterministic trees of each slot's ranked candidates (module
            docstring; give the policy a node budget, e.g. ``FixedLength(8, depth=4)``).
        candidates: a tree's nodes: ``"ranked"`` (each slot's most likely tokens, deterministic) or ``"sampled"``
            (drawn from each slot's distribution, siblings independently, with their ``q``; ranked at temperature 0).

    Raises:
        ConfigError: a block-causal DLM whose blocks lie on the absolute position grid (SDAR, Fast-dLLM v2,
            LLaDA 2: a draft block would straddle its blocks), a bad ``steps``, ``temperature`` or ``candidates``, a
            ``template`` with ``steps > 1``.
    """

    needs = frozenset({"host_rows"})  # select_rows hands the kept rows on the host to its cache

    def __init__(
        self,
        model: Any,
        steps: int = 1,
        temperature: float | None = None,
        cache: bool = True,
        template: TreeTemplate | str | None = None,
        candidates: str = "ranked",
    ) -> None:
        from decodekit.dlm.model import DLMModel, load_model

        self.steps = check_int("steps", steps, low=1)
        self.candidates = check_choice("candidates", candidates, ("ranked", "sampled"))
        self.template = template
        self._template = None if template is None else resolve_template(template)
        if self._template is None and self.candidates != "ranked":
            raise ConfigError(
                f"DiffusionDrafter: candidates={candidates!r} chooses a tree's nodes; without template= it drafts "
                "chains, where it would change nothing: pass a template, or leave candidates out"
            )
        if self._template is not None and self.steps > 1:
            raise ConfigError(
                f"DiffusionDrafter: template= drafts each slot's ranked candidates from one forward; steps={steps} "
                "would let later slots see one path's tokens: use steps=1 with a template, or chains (template=None)"
            )
        self.temperature = check_float("temperature", temperature, low=0, optional=True, hint=" (None = the call's)")
        if not isinstance(model, DLMModel):
            check_model_spec("model", model)
            if not isinstance(model, str):  # a causal LM: it needs a mask token to become a DLM
                raise ConfigError(
                    f"DiffusionDrafter: model must be a diffusion LM; got {type(model).__name__}. Wrap a causal LM "
                    "first: dk.dlm.load_model(model, mask_token_id=..., shift_logits=...)"
                )
        self.model: DLMModel = model if isinstance(model, DLMModel) else load_model(model)
        self.cache = check_bool("cache", cache)
        self._kv: Any = None  # the DLM's KVCache of the committed context (cache=True), from begin()
        if self.model.block_length is not None and self.model.block_grid != "generation":
            raise ConfigError(
                f"DiffusionDrafter: {self.model!r} is block-causal on the absolute position grid, where a draft block "
                "would straddle its blocks; not implemented (use a bidirectional DLM or one with blocks counted from "
                "the generation start, such as the zoo's smollm2-135m-bdlm)"
            )

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def check_model(self, target: Any) -> None:
        """Warn when the diffusion LM's tokenizer maps tokens to other ids than the target's (the sizes are checked by
        the loop): its drafts of those tokens would all be rejected."""
        warn_other_ids(self.model.lm, target, type(self).__name__)

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        if self._template is not None and (self.candidates == "ranked" or self.sampling(sampling).greedy):
            return DraftKind.DETERMINISTIC
        return super().draft_kind(sampling)

    def begin(self, state: DecodeState) -> None:
        if self.model.device != state.device:
            raise ConfigError(
                f"DiffusionDrafter: the diffusion LM is on {self.model.device}, the target on {state.device}; load "
                "both on one device"
            )
        self._kv = self.model.lm.new_cache(state.batch_size, state.tokens.shape[1]) if self.cache else None

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        k = budget.max_len if self._template is None else min(budget.max_depth, self._template.max_depth)
        if k == 0:
            return Draft.empty(state.batch_size, state.device)
        slots = torch.full((state.batch_size, k), self.model.mask_token_id, device=state.device)
        chunks = [k // self.steps + (i < k % self.steps) for i in range(min(self.steps, k))]
        starts = {sum(chunks[:i]) for i in range(1, len(chunks))}  # slots whose chunk needs a new forward
        last = None  # the cached DLM's output at each row's pending token (slot 0's logits when shifted)
        if self._kv is None:
            logits = self._slot_logits(state, slots, None)
        elif self.model.shift_logits and k == 1:  # the one slot's logits are the output at the pending token
            last = feed_unseen(self.model.lm, self._kv, state)[0].float()
            logits = self._masked(last[:, None])
        else:
            logits = self._fed_slot_logits(state, slots)
            last = logits[:, 0] if self.model.shift_logits else None
        if self._template is not None:
            if self.draft_kind(state.sampling) is DraftKind.DETERMINISTIC:
                return ranked_tree(self._template, logits, budget)
            return self._sampled_tree(state, budget, logits)
        done = 0

        def advance(x: torch.Tensor) -> tuple[torch.Tensor, None]:
            nonlocal done, logits
            slots[:, done] = x  # the slot is a committed token now
            done += 1
            if done in starts:
                logits = self._slot_logits(state, slots, last)
            return logits[:, done], None

        return draft_chain(state, budget, self.sampling(state.sampling), logits[:, 0], None, advance)

    def _sampled_tree(self, state: DecodeState, budget: DraftBudget, logits: torch.Tensor) -> Draft:
        """The template (fitted to ``budget``) with each node drawn from its slot's distribution ``logits [B, k, V]``
        after the call's processors given its parent's path, siblings independently; ``q`` one row per parent."""
        capped = budget.capped_at(logits.shape[1])
        fitted = fit_template(self._template, capped, logits.device)  # type: ignore[arg-type]
        n, batch = fitted.tree.num_nodes, state.batch_size
        if n == 0:
            return Draft.empty(batch, logits.device)
        sampling, parents = self.sampling(state.sampling), fitted.tree.parents.tolist()  # the template's: host
        tokens, rows, index = [], [], []
        paths = logits.new_zeros(batch, 1, 0, dtype=torch.long)  # the level above's paths (the root's: empty)
        above = 0  # the first node of the level above
        for d, (start, end) in enumerate(fitted.levels):
            above_cols = [p - above if d else 0 for p in parents[start:end]]  # each node's parent in the level above
            used = sorted(set(above_cols))  # the parents: one q row each
            slot = logits[:, d : d + 1].expand(-1, len(used), -1)
            cols = [used.index(c) for c in above_cols]
            index += [sum(r.shape[1] for r in rows) + c for c in cols]
            rows.append(probs_from_logits(process_paths(state, slot, paths[:, used]), sampling))  # [B, F, V]
            x = sample(rows[-1][:, cols], state.generator, key=("draft", d))  # [B, M]: one independent draw each
            tokens.append(x)
            paths, above = torch.cat([paths[:, above_cols], x[..., None]], 2), start
        q_index = torch.tensor(index, device=logits.device).expand(batch, n)
        draft = Draft.tree(torch.cat(tokens, 1), fitted.parents.expand(batch, n), fitted.fits(capped),
                           kind=DraftKind.SAMPLED, q=torch.cat(rows, 1), q_index=q_index)  # fmt: skip
        return draft.knowing_width(fitted.host_width(capped), exact=False)

    def _slot_logits(self, state: DecodeState, slots: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        """``[B, k, V]`` float32: the DLM's logits at the slots after each row's committed tokens (``slots [B, k]``:
        the mask token, or the token drafted there), the mask token never drafted; with the cache, against the
        context it holds. ``last [B, V]``: the cached DLM's output at the pending token (a shifted DLM's slot 0)."""
        if self._kv is None:
            return self._masked(self._uncached_slot_logits(state, slots))
        return self._masked(self._cached_slot_logits(state, slots, last))

    def _masked(self, logits: torch.Tensor) -> torch.Tensor:
        logits[..., self.model.mask_token_id] = float("-inf")  # the mask token is never drafted
        return logits

    def _fed_slot_logits(self, state: DecodeState, slots: torch.Tensor) -> torch.Tensor:
        """A round's first forward with the cache, in one: each row's unseen committed tokens (the pending one last),
        committed to the cache causally, and right after them the ``k`` slots, which see the whole context and each
        other (in blocks past ``block_length``) and whose K/V are staged but not kept. Returns the slots' logits
        ``[B, k, V]`` float32 (:meth:`_slot_logits`'s)."""
        kv, shift, k = self._kv, int(self.model.shift_logits), slots.shape[1]
        tokens, counts, unseen = unseen_tokens(kv, state, extra=k)  # each row: its unseen tokens, then the slots
        width = tokens.shape[1]
        j = torch.arange(width, device=slots.device)[None]
        is_slot = (j >= counts[:, None]) & (j < counts[:, None] + k)  # [B, W]
        tokens = torch.where(is_slot, slots.gather(1, (j - counts[:, None]).clamp(0, k - 1)), tokens)
        view = kv.stage(width)
        keys = staged_layout(kv.lengths, width, view.kv_len, counts=counts + k)
        block = self.model.block_length
        causal, positions = causal_mask(keys)  # the committed tokens: as the cache holds them
        pattern = bidirectional_mask(keys) if block is None else block_causal_mask(keys, block, origin=state.lengths)
        mask = torch.where(is_slot[:, None, :, None], pattern[0], causal)
        at = counts[:, None] - shift + torch.arange(k, device=slots.device)
        logits = self.model.lm.forward(tokens, positions, mask, view, logits_at=at).logits.float()
        kv.keep(counts, host_counts=unseen)
        return self._masked(logits)

    def _uncached_slot_logits(self, state: DecodeState, slots: torch.Tensor) -> torch.Tensor:
        """One forward over ``[B, max(L) + k]``: each row's committed tokens, its slots, then padding."""
        lengths, k = state.lengths, slots.shape[1]
        width = max(state.host_lengths) + k
        canvas = torch.zeros(state.batch_size, width, dtype=torch.long, device=state.device)
        have = min(width, state.tokens.shape[1])
        canvas[:, :have] = state.tokens[:, :have]
        canvas.scatter_(1, lengths[:, None] + torch.arange(k, device=state.device), slots)
        return self.model.forward(canvas, lengths + k, lengths, k, block_causal=self.model.block_length)[0]

    def _cached_slot_logits(self, state: DecodeState, slots: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The slots run against the cached context without being stored: each sees the whole context and the slots
        (its own block and earlier ones past ``block_length``)."""
        kv, shift, k = self._kv, int(self.model.shift_logits), slots.shape[1]
        view = kv.attend(k, max(kv.host_lengths()))
        keys = attend_layout(kv.lengths, k, view.cached_len)
        block = self.model.block_length
        origin = state.lengths
        mask, positions = bidirectional_mask(keys) if block is None else block_causal_mask(keys, block, origin=origin)
        at = torch.arange(k - shift, device=slots.device).expand(len(slots), -1)
        out = self.model.lm.forward(slots, positions, mask, view, logits_at=at).logits.float()
        return torch.cat([last[:, None], out], 1) if shift else out

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        if self._kv is not None:
            self._kv.select_rows(rows, host_rows=host_rows)
