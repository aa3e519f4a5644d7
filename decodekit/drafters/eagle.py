"""EAGLE (Li, Wei, Zhang, Zhang; ICML'24, arXiv 2401.15077): a feature-level draft head on the target's own hidden
states, sharing the target's embedding and output head.

The head predicts the target's next final hidden state from the current one and the token that follows it:

    g_t = norm(layer(fc([embed(x_{t+1}) ; f_t])))  ~  f_{t+1},     draft logits = head(g_t)

where ``f_t [H]`` is the target's final (normed) hidden state at position ``t`` (the output head's input),
``layer`` is one decoder layer of the target's own architecture (built from its config by transformers) and
``norm`` a copy of its final norm. Committed positions are fed the target's ``f_t`` (from the prefill and from
each round's verification forward: ``Round.hidden``); draft positions are fed the head's own ``g``. The head
keeps its own :class:`~decodekit.cache.KVCache`, one entry per position, cropped back to the committed entries
after every round, so a position's entry is written once with the target's features and never recomputed.

An EAGLE-3 head (:mod:`decodekit.drafters.eagle3`) differs only in what a committed position feeds: its file
names target layers (``hidden_layers``, kept by every verification forward) and the head's ``fuse`` turns their
concatenated outputs into the feature; ``needs`` is then empty (no final hidden states).

Vocabulary trimming (FR-Spec, and EAGLE-3's reduced draft vocabulary; the seed "Balancing Coverage and Draft
Latency in Vocabulary Trimming"): the head scores only ``V_d`` frequent tokens (``EagleHead.vocab``), the rows of
the target's output matrix for those ids. Draft logits outside ``V_d`` are ``-inf``: such tokens are never
drafted and have ``q = 0``, so rejection sampling stays exact (the residual keeps their full target mass) and
greedy output equals plain decoding; the cost is an acceptance ceiling ``p(V_d)``.

Faithfulness: EAGLE-1's architecture and loss (feature regression plus cross-entropy to the target's
distribution, uniform feature noise; :mod:`decodekit.train.eagle`). Differences: the decoder layer keeps its input
norm (EAGLE-1 drops it in its first layer) and ends in a copy of the target's final norm, so ``g`` lives where
``f`` does; the cross-entropy is to the target's distribution renormalised over ``V_d`` (EAGLE-3's trimmed-head
loss). Chains and EAGLE-2's dynamic tree; not EAGLE-1's static tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_bool, check_choice, check_float, check_int
from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.drafters.chain import SamplesLikeTheTarget, draft_chain
from decodekit.drafters.eagle3_head import Eagle3ReleaseHead, OwnLogits
from decodekit.drafters.eagle_head import DEFAULT_WEIGHTS, RETRAIN, EagleHead, default_weights, load_head
from decodekit.drafters.eagle_release import is_release, load_release
from decodekit.drafters.feature_queue import requeue
from decodekit.drafters.head_files import TrimmedHead, read_metadata
from decodekit.drafters.staged import StagedTree, dynamic_tree, ignore_stop
from decodekit.errors import ConfigError
from decodekit.masks import chain_mask
from decodekit.models.base import LanguageModel, ModelOutput
from decodekit.registry import register
from decodekit.resources import shipped_weights
from decodekit.spec.component_checks import check_target_parts
from decodekit.spec.round import Round
from decodekit.spec.state import DecodeState
from decodekit.types import SamplingParams

SHAPES = ("chain", "dynamic")
__all__ = ["EagleDrafter", "EagleHead", "default_weights", "load_head"]


@register("drafter", "eagle")
class EagleDrafter(SamplesLikeTheTarget):
    """Draft chains or EAGLE-2 dynamic trees with an EAGLE head on the target's hidden states (module docstring).

    Chains (``shape="chain"``): the head drafts autoregressively at the feature level: step 0 feeds the pending
    token with the target's feature of the last committed token, step ``j`` the previous draft token with the head's
    own output. Greedy: argmax drafts (deterministic). Sampling: drafts sampled from the head's distribution at the
    call's temperature / top-k / top-p, reported as ``q`` (exact with rejection sampling). Logits processors of the
    call apply to the draft logits, as for a draft model.

    Trees (``shape="dynamic"``, EAGLE-2): :func:`~decodekit.drafters.staged.dynamic_tree` on the head: each level
    expands the ``top_k`` most probable frontier nodes (cumulative draft probability) into their ``top_k`` most
    likely children in one tree-masked head forward (each node fed its token and its parent's head output), and
    the budget's ``nodes`` best candidates form the draft. Deterministic at every temperature (EAGLE-2's point-mass
    rule: verify with ``greedy``, ``traversal`` or ``specinfer``; ``generate`` picks a tree verifier by default).

    Host syncs: none of its own per round (one per draft step with a stop rule in a chain's budget).

    Args:
        weights: a head file (:meth:`EagleHead.save`; an EAGLE-1 or an EAGLE-3 head, the file says which), or a
            released head's directory (EAGLE-1/2, EAGLE-3, vLLM ``speculators`` EAGLE-3:
            :mod:`decodekit.drafters.eagle_release`); None = the head shipped
            for the zoo target ``smollm2-135m-instruct``. A head trained for another target is refused when the
            call starts (before any forward: :meth:`check_model`).
        temperature: the drafter's sampling temperature; None = the call's (which maximises acceptance).
        target: optionally the target (a :class:`LanguageModel`, transformers model or zoo name) to load the head
            for now, so a head that does not fit it is refused here rather than at the first call.
        shape: ``"chain"`` or ``"dynamic"``.
        top_k: ``"dynamic"`` only: children per expanded node and nodes expanded per level (None = 4).
        lean: run the head's layer without transformers' per-call work where
            :class:`~decodekit.drafters.lean_layer.LeanLayer` covers it (the same arithmetic; a draft step on the
            2-core CPU 1.0 -> 0.65 ms in the loop, with ``bf16``).
        bf16: on a target with packed CPU kernels, the head's weights in bfloat16 (half the bytes a step reads);
            None = where the CPU computes bfloat16 natively. Drafts change at bfloat16's precision, the output of a
            lossless verifier does not. ``lean=False, bf16=False`` drafts as the head was trained.
    """

    shares_target = True
    needs = frozenset({"hidden", "prefill", "host_rows"})
    target_parts = frozenset({"embed", "head", "config"})  # config: the head is built to the target's sizes
    default_file = DEFAULT_WEIGHTS  # the head shipped for the zoo target (decodekit/weights/)
    retrain = RETRAIN

    def __init__(
        self,
        weights: str | Path | None = None,
        temperature: float | None = None,
        target: Any = None,
        shape: str = "chain",
        top_k: int | None = None,
        lean: bool = True,
        bf16: bool | None = None,
    ) -> None:
        check_choice("shape", shape, SHAPES)
        self.lean = check_bool("lean", lean)
        self.bf16 = None if bf16 is None else check_bool("bf16", bf16)
        if top_k is not None and shape != "dynamic":
            raise ConfigError(f"top_k is for shape='dynamic' (got shape={shape!r}); pass shape='dynamic' or drop top_k")
        self.shape = shape
        self.top_k = check_int("top_k", top_k, low=1, optional=True, hint=" (children per expanded node)")
        self.weights = shipped_weights(self.default_file) if weights is None else Path(weights)
        self.release = is_release(self.weights)  # the EAGLE authors' layout (decodekit.drafters.eagle_release)
        if not self.release and not self.weights.is_file():
            raise ConfigError(
                f"no EAGLE head at {self.weights}; train one with {self.retrain} and pass weights=<its file>, or pass "
                "a released EAGLE head's directory (config.json and pytorch_model.bin / model.safetensors)"
            )
        # an EAGLE-3 head reads the target's hidden states of these layers (its file says which), not the final ones
        self.hidden_layers = tuple(int(i) for i in read_metadata(self.weights).get("layers", ()))
        self.needs = frozenset({"prefill", "host_rows"} if self.hidden_layers else {"hidden", "prefill", "host_rows"})
        self.temperature = check_float("temperature", temperature, low=0, optional=True, hint=" (None = the call's)")
        self.head: EagleHead | None = None
        self.metadata: dict[str, Any] = {}
        self._for: int | None = None  # id of the target the head was loaded for
        if target is not None:
            from decodekit.models import load_model

            self._load(load_model(target))

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache, prefill: ModelOutput) -> None:
        """Load the head for ``target`` (once per target) and queue the prompt's features for the first round."""
        self._load(target)
        self.cache = target.new_cache(state.batch_size, state.tokens.shape[1])
        self.feats = self.features(prefill.last_hidden, prefill.hidden)  # [B, T, H]: positions cache.lengths ..
        self._committed: tuple[torch.Tensor, list[int]] | None = None  # set by propose: the target-fed entries

    def check_model(self, target: LanguageModel) -> None:
        """Before the call's first forward: load the head for ``target``, refusing one trained for another target
        (its hidden size, vocabulary, weights, or, for EAGLE-3, the layers it reads) with what it was trained for."""
        self._load(target)

    def _load(self, target: LanguageModel) -> None:
        """Load the head for ``target`` (once per target object)."""
        if self._for != id(target):
            check_target_parts(self, target)
            load = load_release if self.release else load_head
            self.head, self.metadata = load(self.weights, target, lean=self.lean, bf16=self.bf16)
            self._for = id(target)
            if isinstance(self.head, Eagle3ReleaseHead):  # EAGLE-3's own output layer; the layers it reads
                self.trimmed = OwnLogits(self.head, target.vocab_size)
                self.hidden_layers, self.needs = tuple(self.metadata["layers"]), frozenset({"prefill", "host_rows"})
                self.dtype = self.head.hidden_norm.weight.dtype  # its norms' (packed linears take any input)
            else:
                self.trimmed = TrimmedHead(target, self.head.vocab)  # type: ignore[union-attr]
                self.dtype = self.head.fc.weight.dtype  # type: ignore[union-attr]
        self.target = target

    def features(self, last: torch.Tensor | None, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        """The head's input features ``[B, M, H]`` of committed positions from the target's forward: its final
        hidden states ``last`` (EAGLE-1; ``layers``, the outputs of ``hidden_layers``, are for EAGLE-3)."""
        if self.hidden_layers:
            taps = torch.cat([layers[i] for i in self.hidden_layers], -1)
            return self.head.fuse(taps.to(self.dtype))  # type: ignore[misc,union-attr]
        assert last is not None, "the target's forward returned no final hidden states (needs 'hidden')"
        return last

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        return DraftKind.DETERMINISTIC if self.shape == "dynamic" else super().draft_kind(sampling)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """``g [..., H]`` -> ``[..., V]`` float32 draft logits, ``-inf`` outside the head's vocabulary."""
        return self.trimmed.logits(g)

    def _run(self, tokens: torch.Tensor, feats: torch.Tensor, counts: torch.Tensor, host: int | list[int]) -> Any:
        """Feed ``tokens [B, N]`` / ``feats [B, N, H]`` (row ``b``: the first ``counts[b]``) as the next entries;
        returns ``g [B, H]`` at each row's last one."""
        view = self.cache.stage(tokens.shape[1])
        mask, positions = chain_mask(self.cache.lengths, tokens.shape[1], view.kv_len)
        g = self.head(self.target.embed(tokens), feats.to(self.dtype), positions, mask, view)  # type: ignore[misc,union-attr]
        self.cache.keep(counts, host_counts=host)
        return g.gather(1, (counts - 1).clamp(min=0)[:, None, None].expand(-1, 1, g.shape[-1]))[:, 0]

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        # the unseen entries: positions cache.lengths .. committed - 1, tokens x_{t+1} (the last is the pending one)
        seen = self.cache.host_lengths()
        unseen = [n - 1 - s for n, s in zip(state.host_lengths, seen)]
        idx = self.cache.lengths[:, None] + 1 + torch.arange(max(unseen), device=state.device)
        tokens = state.tokens.gather(1, idx.clamp(max=state.tokens.shape[1] - 1))
        counts = state.lengths - 1 - self.cache.lengths
        g = self._run(tokens, self.feats[:, : max(unseen)], counts, unseen)
        self._committed = (self.cache.lengths.clone(), self.cache.host_lengths())  # the entries with target features
        if budget.max_len == 0 or budget.width == 0:
            return Draft.empty(state.batch_size, state.device)
        if self.shape == "dynamic":
            return self._tree(state, budget, g)

        def advance(x: torch.Tensor) -> tuple[torch.Tensor, None]:
            nonlocal g
            g = self._run(x[:, None], g[:, None], torch.ones_like(x), 1)
            return self.logits(g), None

        return draft_chain(state, budget, self.sampling(state.sampling), self.logits(g), None, advance)

    def _tree(self, state: DecodeState, budget: DraftBudget, g: torch.Tensor) -> Draft:
        """EAGLE-2's dynamic tree from the root's head output ``g [B, H]``, staged in the head's cache."""
        ignore_stop(budget, self)
        outputs = g[:, None]  # [B, 1 + T, H]: the head's output at the root, then at each staged slot

        def run(tokens: torch.Tensor, parents: torch.Tensor, positions: Any, mask: Any, view: Any) -> torch.Tensor:
            nonlocal outputs
            parent = outputs.gather(1, (parents + 1)[..., None].expand(-1, -1, g.shape[1]))  # slot -1: the root
            out = self.head(self.target.embed(tokens), parent, positions, mask, view)  # type: ignore[misc]
            outputs = torch.cat([outputs, out], 1)
            return self.logits(out)

        tree = StagedTree(self.cache, run, state.batch_size, state.device)
        sampling = self.sampling(state.sampling)
        return dynamic_tree(state, budget, sampling, self.top_k or 4, tree, self.logits(g)[:, None])[0]

    def observe(self, state: DecodeState, round: Round) -> None:
        """Drop the draft entries; queue the target's features of the tokens this round committed (after those
        still queued when the loop did not ask for a draft this round)."""
        if self._committed is not None:
            lengths, host = self._committed
            self.cache.crop(lengths, host_lengths=host)
            self.feats, self._committed = self.features(round.hidden, round.layer_hidden), None
            return
        # no draft this round: the queue still holds positions cache.lengths .. (committed before the round) - 1
        queued = state.lengths - 1 - round.counts - self.cache.lengths  # [B]
        self.feats = requeue(self.feats, queued, self.features(round.hidden, round.layer_hidden))

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        self.cache.select_rows(rows, host_rows=host_rows)
        self.feats = self.feats.index_select(0, rows)
