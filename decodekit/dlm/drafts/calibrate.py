"""Spiffy's offline calibration: which sets of candidates to draft, picked from the sampler's recorded steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from decodekit.checks import check_bool, check_float, check_int
from decodekit.dlm.drafts.graphs import Node
from decodekit.dlm.drafts.spiffy import SpiffyDrafts, candidates
from decodekit.dlm.state import DLMState, Proposal
from decodekit.errors import ConfigError


@dataclass
class Calibration:
    """What :func:`calibrate_graph` found.

    Attributes:
        graph: the chosen nodes, the most useful first (sets of candidate ranks, ``r`` with its proposed token,
            ``(r, j)`` with its ``j``-th other; ``SpiffyDrafts(graph=...)``). The first ``k`` are the graph greedy
            calibration picks with a budget of ``k``.
        forwards: ``forwards[k]``: the forwards the drafted loop takes on the recorded steps with the first ``k``
            nodes (``forwards[0]``: the undrafted loop's, one a step).
        steps: the recorded steps (summed over rows).
    """

    graph: list[tuple[Any, ...]]
    forwards: list[int]
    steps: int

    def best_budget(self, canvas_cost: float) -> int:
        """How many of ``graph``'s nodes to draft on a device where a forward of ``1 + k`` canvases takes
        ``1 + canvas_cost * k`` undrafted forwards' time (:func:`canvas_cost` measures it): the ``k`` that minimises
        ``forwards[k] * (1 + canvas_cost * k)``, the predicted time of the recorded steps; the smaller ``k`` on a tie.
        0 means drafting does not pay there (run without a draft); else ``SpiffyDrafts(graph=graph, budget=k)``."""
        cost = check_float("canvas_cost", canvas_cost, low=0, hint=" (a forward's extra time per drafted canvas)")
        times = [n * (1 + cost * k) for k, n in enumerate(self.forwards)]
        return min(range(len(times)), key=times.__getitem__)


class StepRecorder:
    """A draft strategy that drafts nothing and records, after every step, each row's ``width`` candidates (the
    most confident masked slots of the block, as :class:`~decodekit.dlm.drafts.SpiffyDrafts` ranks them) with their
    proposed tokens (and ``alternatives`` other likely ones each), and the slots still masked in the block: what
    :func:`calibrate_graph` replays."""

    fixed_blocks = True

    def __init__(self, width: int, alternatives: int = 0) -> None:
        self.width, self.alternatives = width, alternatives
        self.records: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def variants(self, state: DLMState, proposal: Proposal, committed: torch.Tensor, left: int) -> None:
        ranked, usable, tokens = candidates(state, proposal, self.width, self.alternatives)
        masked = state.masked & state.in_block
        self.records.append((state.block, ranked.cpu(), usable.cpu(), tokens.cpu(), masked.cpu()))
        return None


Walk = tuple[Node, ...]  # the nodes a walk from one step went through


def walks(
    records: list[Any],
    outputs: list[list[int]],
    depth: int,
    lookahead: bool = True,
    block_steps: list[list[int]] | None = None,
) -> list[list[Walk]]:
    """Per row and block (in order), the walk from each step the row took that was not its last in the block: the
    nodes its next steps went through. After ``k`` more steps, the node is the set of ``(rank, token)`` pairs its
    commits since the step form, while each commit is a candidate with one of its recorded tokens (the output's
    token; 0 = the proposed one), up to ``depth`` candidates. The finished block is the walk's last node when
    ``lookahead`` and the row steps in its next block too (the drafts look ahead: :mod:`decodekit.dlm.lookahead`);
    otherwise a walk stops short of the step that finishes the block (taken on the last node's output, it needs no
    node).

    ``block_steps``: per block, each row's steps in it (the recorded call's ``DLMStats.row_block_steps``). A block
    a row finished in one step records nothing (no draft follows a block's last step); with ``block_steps`` it is
    listed with no walk, so :func:`forwards` counts its forward. None = only the blocks with a recorded step."""
    out: dict[tuple[int, int], list[Walk]] = {}
    if block_steps is not None:
        size = len(outputs[0]) // len(block_steps) if outputs else 0
        out = {(b, i * size): [] for i, rows in enumerate(block_steps) for b, n in enumerate(rows) if n > 0}
    for block, *_, masked in records:  # and every block with a recorded step
        for b in masked.any(1).nonzero()[:, 0].tolist():
            out.setdefault((b, block[0]), [])
    for t, (block, ranked, usable, tokens, masked) in enumerate(records):
        for b in range(ranked.shape[0]):
            if not bool(masked[b].any()):  # the row's block is done: no step follows
                continue
            rank = {
                int(s): (r, toks.index(outputs[b][s]))
                for r, (s, ok, toks) in enumerate(zip(ranked[b].tolist(), usable[b].tolist(), tokens[b].tolist()))
                if ok and outputs[b][s] in toks
            }
            chain: list[Node] = []
            for later in [*records[t + 1 :], None]:
                finished = later is None or later[0] != block or not bool(later[4][b].any())  # the block's end
                if finished and not (lookahead and (b, block[1]) in out):
                    break
                # committed since the step (the finished block: every slot masked then, one more node to look ahead)
                slots = (masked[b] if finished else masked[b] & ~later[4][b]).nonzero()[:, 0].tolist()
                if len(slots) > depth or any(s not in rank for s in slots):
                    break
                chain.append(tuple(sorted(rank[s] for s in slots)))
                if finished:
                    break
            out[b, block[0]].append(tuple(chain))
    return [out[key] for key in sorted(out)]


def forwards(steps: list[list[Walk]], graph: set[Node]) -> int:
    """The forwards the drafted loop takes over the recorded steps with ``graph``: per row and block, the first
    forward takes the block's first step; each next one takes a step and then one more for each node of the walk
    from there that the graph holds. A walk that reaches its finished block (a node past the block's last step:
    :func:`walks` with ``lookahead``) takes the next block's first step too, so that block's first forward is saved
    (``steps`` lists each row's blocks in order)."""
    total, ahead = 0, False
    for block in steps:
        s, total, ahead = 0, total + (not ahead), False
        while s < len(block):
            k = 0
            while k < len(block[s]) and block[s][k] in graph:
                k += 1
            ahead = s + 1 + k > len(block)  # past the block's last step: the next block's first
            s, total = s + 1 + k, total + 1
    return total


def greedy_graph(steps: list[list[Walk]], budget: int) -> Calibration:
    """Add, ``budget`` times, the node that saves the most forwards on the recorded steps (:func:`forwards`; the
    candidates are the nodes where walks stop now); ties go to the smaller set, then the lower ranks."""
    graph: list[Node] = []
    chosen: set[Node] = set()
    counts = [forwards(steps, chosen)]
    for _ in range(budget):
        stops = {next((n for n in w if n not in chosen), None) for block in steps for w in block} - {None}
        if not stops:
            break
        cost = {n: forwards(steps, chosen | {n}) for n in stops}
        best = min(cost, key=lambda n: (cost[n], len(n), n))
        if cost[best] >= counts[-1]:
            break
        graph.append(best)
        chosen.add(best)
        counts.append(cost[best])
    return Calibration(graph, counts, sum(len(block) + 1 for block in steps))


def calibrate_graph(
    dlm: Any,
    prompts: Any,
    budget: int = 7,
    width: int = 8,
    depth: int = 4,
    alternatives: int = 0,
    lookahead: bool = True,
    progress: bool = True,
    **generate_kwargs: Any,
) -> Calibration:
    """Spiffy's offline calibration (Agrawal et al. 2025): run the undrafted sampler on ``prompts`` (not the prompts
    you will measure on), record every step's candidates (the ``width`` most confident masked slots) and which of
    them the next steps commit with their proposed tokens, and pick ``budget`` sets of candidates greedily, each the
    one that saves the most forwards when the drafted loop is replayed on the recorded steps (:func:`forwards`; the
    replay takes the forwards the loop would, since every drafted step is the recorded one).

    Faithfulness: the paper calibrates its draft graph offline from the model's decoding trajectories to maximise
    acceptance; this follows that idea with a greedy pick on replayed forwards, not the paper's exact procedure.
    Per-row records assume the rule lets rows take their own steps (``per_row_steps``) or a batch of one.

    Args:
        dlm: the diffusion LM (:func:`decodekit.dlm.load_model`).
        prompts: calibration prompts (as :func:`decodekit.dlm.generate` takes them).
        budget: nodes to pick (drafted canvases a forward).
        width: candidates considered per step (ranks ``0 .. width - 1``).
        depth: the largest set considered.
        alternatives: other tokens considered per candidate (its most likely after the proposed one): a node may
            then draft a candidate with one of them (``[r, j]``), where the next steps commit it with another token
            than the one proposed now.
        lookahead: replay drafts that look ahead into the next block (``SpiffyDrafts(lookahead=...)``, its
            default): a node that finishes a block then saves the next block's first forward.
        generate_kwargs: the sampler to calibrate for (``gen_length``, ``block_length``, ``steps``, ``rule``,
            ``cache``, ``temperature``, ``seed``, ...), as it will run with drafts.

    Returns:
        a :class:`Calibration`; ``SpiffyDrafts(graph=calibration.graph)`` drafts with it.
    """
    from decodekit.dlm.generate import generate

    budget = check_int("budget", budget, low=1)
    width = check_int("width", width, low=1)
    depth = check_int("depth", depth, low=1, high=width, hint=" (at most width)")
    lookahead = check_bool("lookahead", lookahead)
    if "draft" in generate_kwargs:
        raise ConfigError(
            "calibrate_graph runs the undrafted sampler and records its steps (its own draft strategy); drop draft= "
            "(the graph it returns is for SpiffyDrafts(graph=...))"
        )
    recorder = StepRecorder(width, check_int("alternatives", alternatives, low=0))
    try:
        out = generate(dlm, prompts, draft=recorder, progress=progress, **generate_kwargs)
    except ConfigError as error:  # refused as a draft strategy would be: say that it is the calibration's
        if "StepRecorder" not in str(error):
            raise
        message = str(error).replace("StepRecorder", "calibrate_graph's step recorder (a draft strategy)")
        raise type(error)(message.replace(", or draft=None", "").replace(" or draft=None", "")) from error
    steps = walks(recorder.records, out.sequences, depth, lookahead, out.stats.row_block_steps)
    found = greedy_graph(steps, budget)
    found.graph = [tuple(r if j == 0 else (r, j) for r, j in node) for node in found.graph]  # r: its proposed token
    return found


def canvas_cost(
    dlm: Any, prompts: Any, graph: Any, budget: int | None = None, repeats: int = 2, **generate_kwargs: Any
) -> float:
    """The time one drafted canvas adds to a forward, as a fraction of an undrafted forward, on the device ``dlm`` is
    on (what :meth:`Calibration.best_budget` takes): the sampler's time per forward with ``SpiffyDrafts(graph=graph,
    budget=budget)`` over its time per forward without drafts, less 1, per drafted canvas; each the fastest of
    ``repeats`` calls after a warm-up call. An estimate: near a block's end a forward runs fewer canvases (fewer
    nodes fit) and, looking ahead, twice the width each, so the per-canvas price is an average over a call; a CPU
    gives about 0.5, a dispatch-bound GPU a few hundredths (docs/benchmarks.md).

    Args:
        prompts: a few prompts, as :func:`decodekit.dlm.generate` takes them (a batch costs what it will cost).
        graph, budget: the drafts to price (as :class:`~decodekit.dlm.drafts.SpiffyDrafts` takes them).
        generate_kwargs: the sampler, as it will run (``gen_length``, ``rule``, ``cache``, ...).
    """
    from decodekit.dlm.generate import generate

    drafts = SpiffyDrafts(graph=graph, budget=budget)
    repeats = check_int("repeats", repeats, low=1)

    def per_forward(draft: Any) -> float:
        times = []
        for _ in range(repeats + 1):
            stats = generate(dlm, prompts, draft=draft, progress=False, **generate_kwargs).stats
            times.append(stats.wall_time_s / stats.nfe)
        return min(times[1:])

    return max(per_forward(drafts) / per_forward(None) - 1.0, 0.0) / len(drafts.nodes)


__all__ = ["Calibration", "StepRecorder", "calibrate_graph", "canvas_cost", "forwards", "greedy_graph", "walks"]
