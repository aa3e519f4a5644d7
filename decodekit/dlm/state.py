"""What the diffusion sampler's parts see: the canvas (:class:`DLMState`) and one step's proposals
(:class:`Proposal`).

Shapes: ``B`` rows, ``G`` the generation region's length (slot ``j`` of a row is canvas position ``P_b + j``),
``V`` the vocabulary, ``T`` the canvas width (longest prompt + ``G``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from decodekit.models.prompts import pad_rows
from decodekit.sampling import Generator, uniform


@dataclass
class DLMState:
    """The canvas of one :func:`decodekit.dlm.generate` call.

    Attributes:
        canvas: ``[B, T]`` prompt, then the generation region (mask ids until committed), then padding.
        lengths: ``[B]`` real tokens per row (``P_b + G``).
        starts: ``[B]`` each row's prompt length ``P_b`` (where its generation region starts).
        gen_length: ``G``.
        mask_token_id: the mask id.
        block: ``(start, end)`` of the current block in slot coordinates (the same for every row) under the fixed
            schedule; ``(0, G)`` under an adaptive one (its rows' blocks are in ``region``).
        block_length: the length of every block (an adaptive schedule's default).
        region: ``[B, G]`` bool, each row's current block under an adaptive region schedule (AdaBlock, DCD); None
            under the fixed one.
        block_steps: the current block's step budget (``steps / number of blocks``; schedules spread commits over
            it; rules that stop on their own may use fewer steps, never more than the block's slots).
        step: the loop's steps in the current block (``block_step`` in every row, unless rows advance on their own).
        block_step: ``[B]`` long, the steps each row has taken in the current block: ``step`` in every row, unless a
            draft strategy lets rows advance on their own within a forward (a rule that declares
            ``per_row_steps``, reading its step from :meth:`steps_in_block`); None outside
            :func:`~decodekit.dlm.generate` (a caller's own loop).
        global_step, total_steps: steps taken in the call, and its budget ``steps``.
        row_total_steps: ``[B]`` host ints, each row's own step budget where rows decode different numbers of blocks
            (an absolute block grid where some prompts' tails open the first block: the other rows decode one block
            less, :meth:`close_spare_block`); None: ``total_steps`` in every row.
        row_steps: ``[B]`` host ints: steps in which each row still had masked slots in its block (per-row random
            draws are keyed by it).
        row_forwards: ``[B]`` host ints: forwards in which each row still had masked slots in its block (its NFE;
            ``row_steps`` unless a draft strategy takes several steps a forward).
        host_starts: ``[B]`` host ints, ``starts`` on the host (caches stage forwards without reading the device).
        generator: the call's randomness (:func:`~decodekit.sampling.make_generator`).
        eos_token_ids: the model's end-of-sequence ids (:class:`~decodekit.dlm.rules.EoTStop`'s default).
        prompt_tail: ``[B]`` long, how many of each row's first slots hold its prompt's tail, committed before the
            first step (an absolute block grid: :func:`carry_tails`); None: no row has one. Rules that read the
            committed tokens as generated text (EoTStop) skip them.
        planned: ``[B, G]`` bool, the slots the rule will commit at the next step, where it knows them in advance
            (:class:`~decodekit.dlm.rules.RandomOrderRule` sets it after each step; None otherwise). dKV-Cache-Greedy
            feeds these.
        lookahead: ``(start, end)`` of the next block while the loop runs a forward whose drafted canvases may finish
            the current block (a draft strategy's ``finishes``): the cache then also computes the next block on each
            canvas, so a row that finishes its block on a drafted canvas takes the next block's first step on that
            canvas's output, without a forward of its own; None otherwise (:mod:`decodekit.dlm.lookahead`).
    """

    canvas: torch.Tensor
    lengths: torch.Tensor
    starts: torch.Tensor
    gen_length: int
    mask_token_id: int
    total_steps: int
    generator: Generator = None
    block: tuple[int, int] = (0, 0)
    block_length: int = 0
    region: torch.Tensor | None = None
    block_steps: int = 0
    step: int = 0
    block_step: torch.Tensor | None = None
    global_step: int = 0
    row_steps: list[int] = field(default_factory=list)
    row_forwards: list[int] = field(default_factory=list)
    host_starts: list[int] = field(default_factory=list)
    eos_token_ids: tuple[int, ...] = ()
    planned: torch.Tensor | None = None
    lookahead: tuple[int, int] | None = None
    prompt_tail: torch.Tensor | None = None
    row_total_steps: list[int] | None = None

    @classmethod
    def from_prompts(
        cls,
        rows: list[list[int]],
        gen_length: int,
        mask_token_id: int,
        total_steps: int,
        generator: Generator,
        device,
        filled: list[list[int]] | None = None,
    ) -> DLMState:
        """The canvas for ``rows`` with ``gen_length`` masked slots each; ``filled[b]``, if given, already committed
        in row ``b``'s first slots (a prompt's tail on an absolute block grid: :func:`carry_tails`)."""
        width = max(map(len, rows)) + gen_length
        canvas, starts = pad_rows(rows, width, fill=mask_token_id)
        for b, tail in enumerate(filled or ()):
            canvas[b, int(starts[b]) : int(starts[b]) + len(tail)] = torch.tensor(tail, dtype=canvas.dtype)
        state = cls(
            canvas.to(device),
            (starts + gen_length).to(device),
            starts.to(device),
            gen_length,
            mask_token_id,
            total_steps,
            generator,
        )
        state.row_steps, state.row_forwards = [0] * len(rows), [0] * len(rows)
        state.host_starts = [len(r) for r in rows]
        if filled is not None:
            state.prompt_tail = torch.tensor([len(t) for t in filled], device=device)
        return state

    def close_spare_block(self, tails: list[list[int]], used: int, fill_id: int) -> None:
        """Commit ``fill_id`` in slots ``used ..`` of the rows without a prompt tail. On an absolute block grid a call
        whose rows have tails runs one block past ``G = used`` (a tail-carrying row's last block ends there); a row
        without a tail ends at ``G``, so the extra block is not its to decode: filled now, it takes no step, counts in
        no rule's view of masked slots, and (after every slot the row decodes, on a block-causal model) is attended
        to by none of them."""
        spare = torch.tensor([not t for t in tails], device=self.device)[:, None]
        beyond = torch.arange(self.gen_length, device=self.device)[None] >= used
        self.commit(spare & beyond, torch.full_like(self.tokens, fill_id))
        blocks = self.gen_length // self.block_length
        self.row_total_steps = [self.steps_per_block * (blocks - (not t)) for t in tails]

    @property
    def batch_size(self) -> int:
        return self.canvas.shape[0]

    @property
    def device(self) -> torch.device:
        return self.canvas.device

    @property
    def slots(self) -> torch.Tensor:
        """``[B, G]`` canvas index of each generation slot."""
        return self.starts[:, None] + torch.arange(self.gen_length, device=self.device)

    @property
    def tokens(self) -> torch.Tensor:
        """``[B, G]`` the generation region (mask ids where not committed)."""
        return self.canvas.gather(1, self.slots)

    @property
    def masked(self) -> torch.Tensor:
        """``[B, G]`` bool: slots not committed yet."""
        return self.tokens == self.mask_token_id

    @property
    def in_block(self) -> torch.Tensor:
        """``[G]`` bool: slots of the current block (``[B, G]``: each row's, under an adaptive schedule)."""
        if self.region is not None:
            return self.region
        j = torch.arange(self.gen_length, device=self.device)
        return (j >= self.block[0]) & (j < self.block[1])

    @property
    def steps_per_block(self) -> int:
        """A block's step budget: ``total_steps / (G / block_length)`` (an adaptive schedule's rounds get the same)."""
        return self.total_steps // (self.gen_length // self.block_length)

    @property
    def progress(self) -> float:
        """``global_step / total_steps``: how far through its step budget the call is, counting the steps taken
        before the current one (Prophet's reference also counts the current one:
        :meth:`~decodekit.dlm.rules.ProphetRule.progress`)."""
        return self.global_step / max(self.total_steps, 1)

    def steps_in_block(self) -> torch.Tensor:
        """``[B]`` long: each row's steps in the current block (``block_step``, or ``step`` in every row)."""
        if self.block_step is not None:
            return self.block_step
        return torch.full((self.batch_size,), self.step, dtype=torch.long, device=self.device)

    def commit(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Write ``tokens [B, G]`` into the slots where ``slots [B, G]`` (bool) is True."""
        index = self.slots
        self.canvas.scatter_(1, index, torch.where(slots, tokens, self.canvas.gather(1, index)))


def carry_tails(rows: list[list[int]], block_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """Each prompt split at the last multiple of ``block_length``: ``(heads, tails)``. On an absolute block grid
    (SDAR, Fast-dLLM v2: block ``k`` holds positions ``[kL, (k + 1)L)``) the tail shares the first block with the
    generation, so the sampler lays it out as that block's first, already committed slots; every position is
    unchanged."""
    cut = [len(r) - len(r) % block_length for r in rows]
    return [r[:c] for r, c in zip(rows, cut)], [r[c:] for r, c in zip(rows, cut)]


class SlotLogits(NamedTuple):
    """The logits a step computed for the generation slots ``lo .. lo + W - 1`` only: ``logits [B, W, V]``. A cache
    that runs part of the canvas returns this instead of a ``[B, G, V]`` tensor, so that no step allocates, zeroes
    and soft-maxes ``G x V`` values for slots nobody predicted (at G = 256 that was a quarter of a block-causal
    step on a CPU). The other slots have no proposal."""

    logits: torch.Tensor
    lo: int

    def dense(self, gen_length: int) -> torch.Tensor:
        """``[B, G, V]`` with zeros outside the window (the form the tests compare)."""
        return spread(self.logits, self.lo, gen_length)


def spread(window: torch.Tensor, lo: int, gen_length: int, fill: float | bool = 0) -> torch.Tensor:
    """``[B, G, ...]`` holding ``window [B, W, ...]`` at slots ``lo .. lo + W - 1`` and ``fill`` elsewhere (the
    window itself when it covers all ``G``)."""
    b, w = window.shape[:2]
    if w == gen_length:
        return window
    out = window.new_full((b, gen_length, *window.shape[2:]), fill)
    out[:, lo : lo + w] = window
    return out


def restrict(logits: torch.Tensor | SlotLogits, lo: int, hi: int) -> torch.Tensor | SlotLogits:
    """The logits of slots ``lo .. hi - 1`` only: a :class:`SlotLogits` window cut to them (a lookahead forward's
    window spans the current block and the next); ``[B, G, V]`` logits as they are (a recompute predicts every slot,
    with drafts or without)."""
    if not isinstance(logits, SlotLogits):
        return logits
    return SlotLogits(logits.logits[:, lo - logits.lo : hi - logits.lo], lo)


def output_at(outputs: torch.Tensor | SlotLogits, node: torch.Tensor) -> torch.Tensor | SlotLogits:
    """Row ``b``'s logits from the output of canvas ``node[b]`` (``outputs``: ``[1 + N, B, ...]``, several canvases'
    logits stacked, or a :class:`SlotLogits` window of them)."""
    rows = torch.arange(len(node), device=node.device)
    if isinstance(outputs, SlotLogits):
        return SlotLogits(outputs.logits[node, rows], outputs.lo)
    return outputs[node, rows]


def dense_logits(logits: torch.Tensor | SlotLogits, gen_length: int) -> torch.Tensor:
    """``[B, G, V]`` from either form a cache returns."""
    return logits.dense(gen_length) if isinstance(logits, SlotLogits) else logits


@dataclass
class Proposal:
    """One step's proposals for every slot of the generation region.

    Attributes:
        tokens: ``[B, G]`` the proposed token of each slot (argmax at temperature 0, else a float64 Gumbel-max
            sample from ``softmax(logits / temperature)``); the mask id where nothing was predicted.
        confidence: ``[B, G]`` float64: the probability of the proposed token under the untempered
            ``softmax(logits)`` (LLaDA's and Fast-dLLM's confidence, also when sampling), computed in float64 as
            Fast-dLLM and dKV-Cache compute it, so near-certain slots still rank apart (in float32 every probability
            above ``1 - 6e-8`` rounds to 1 and the earliest such slot would win); 0 where nothing was predicted.
        logits: ``[B, W, V]`` float32, what the proposals of slots ``lo .. lo + W - 1`` came from (after
            classifier-free guidance); ``W = G`` and ``lo = 0`` unless the cache computed a window.
        lo: the first slot ``logits`` covers.
    """

    tokens: torch.Tensor
    confidence: torch.Tensor
    logits: torch.Tensor
    lo: int = 0

    @property
    def predicted(self) -> torch.Tensor:
        """``[B, G]`` bool: the slots some forward predicted this step: the window, less the slots in it a cache
        left at zero (a cache that feeds scattered positions, such as dKV-Cache, zeroes the others). A rule that
        reads beyond ``eligible`` must not commit the rest: their proposals mean nothing."""
        return spread(self.logits.ne(0).any(-1), self.lo, self.tokens.shape[1], False)

    def logit_gap(self) -> torch.Tensor:
        """``[B, G]`` the top-1 minus top-2 **logit** (Prophet's certainty; not a probability gap); 0 outside the
        window."""
        top = self.logits.topk(2, dim=-1).values
        return spread(top[..., 0] - top[..., 1], self.lo, self.tokens.shape[1])


def propose(logits: torch.Tensor | SlotLogits, temperature: float, state: DLMState) -> Proposal:
    """Proposals from ``logits`` (``[B, G, V]``, or a :class:`SlotLogits` window): argmax at ``temperature == 0``,
    else Gumbel-max in float64 (``argmax(z / T + g)``, ``g = -log(-log U)``: a sample from ``softmax(z / T)``, as
    LLaDA's ``exp(z) / (-log U)^T`` in float64; low-precision noise would truncate its tail). The mask token is
    never proposed (a model that ranks it first would otherwise commit a slot that is still masked; the reference
    assumes a model trained never to); confidences come from the unmodified softmax, in float64 (one ``[B, W, V]``
    softmax, cheap next to the forward). Per-row seeds draw with key ``"gumbel"``, always for all ``G`` slots, so a
    windowed cache samples what a full recompute would."""
    window, lo = (logits.logits, logits.lo) if isinstance(logits, SlotLogits) else (logits, 0)
    b, w, v = window.shape
    never = window.new_zeros(v).index_fill_(0, torch.tensor([state.mask_token_id], device=window.device), float("-inf"))
    if temperature == 0:
        tokens = (window + never).argmax(-1)
    else:
        u = uniform((b, state.gen_length, v), state.generator, window.device, key="gumbel", dtype=torch.float64)
        tokens = ((window + never).double() / temperature - (-u[:, lo : lo + w].log()).log()).argmax(-1)
    confidence = window.double().softmax(-1).gather(-1, tokens[..., None])[..., 0]  # [B, W] float64
    g = state.gen_length
    return Proposal(spread(tokens, lo, g, state.mask_token_id), spread(confidence, lo, g), window, lo)
