"""Host syncs per round, counted by instrumenting the tensor methods that make the CPU wait for a GPU.

On a GPU every ``.item() / .tolist() / .cpu() / bool(t) / int(t) / t.nonzero()`` of a device tensor stalls the host
until the queued kernels finish. On the CPU they are cheap, but counting them here tells what a GPU user pays.
Budgets (docs/concepts.md): plain decoding 1 per round, n-gram chain rounds 2, model-drafter rounds 1 on a fixed
length (its draft declares its width), tree drafters 1 on a fixed tree budget, 2 on an adaptive length policy (its
read of the lengths) or a policy without host mirrors, suffix lookup rounds 2, plus 1 per draft step when the policy
has a stop rule (and, for a draft model, 1 each time rows leave the batch). The per-call syncs (prefill, first-round
validation of the budget, draft and verdict, stats, read-out: :data:`OVERHEAD`; the later verdicts' checks, read
when the call ends: :data:`LATER`) are taken off.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest
import torch

import decodekit as dk
from decodekit.drafters import (
    FallbackDrafter,
    ModelDrafter,
    ModelTreeDrafter,
    NGramDrafter,
    RecyclingDrafter,
    SuffixDrafter,
)
from decodekit.models.tiny import perturbed
from decodekit.policies import ConfidenceStop, FixedLength, HeuristicLength, Stack

SYNC_METHODS = ("item", "tolist", "cpu", "__bool__", "__int__", "__index__", "__float__", "nonzero")
PROMPTS = [[5, 6, 7, 7, 7, 5, 6, 7, 9], [1, 2], [3, 4, 3, 4, 3]]


@contextlib.contextmanager
def count_syncs() -> Iterator[list[int]]:
    """Count calls of the host-sync tensor methods inside the block (``counter[0]``)."""
    counter = [0]
    originals = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}

    def counting(method):
        def wrapper(self, *args, **kwargs):
            counter[0] += 1
            return method(self, *args, **kwargs)

        return wrapper

    for name, method in originals.items():
        setattr(torch.Tensor, name, counting(method))
    try:
        yield counter
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


OVERHEAD = 10  # per call: the read after prefill, the first budget, non-empty draft and its verdict checked, 3 to
# flush stats, 3 to read out; with drafts 1 more (:data:`LATER`)
LATER = 1  # the later rounds' verdicts, checked on the device and read once when the call ends


class CountsLeaves:
    """Mixin for a draft-model drafter: counts how often rows left the batch (without ``host_rows`` its cache would
    read its lengths once at the next round; the loop hands them, so a leave costs no read)."""

    leaves = 0

    def select_rows(self, rows, host_rows=None):
        self.leaves += 1
        super().select_rows(rows, host_rows=host_rows)


class CountingModelDrafter(CountsLeaves, ModelDrafter):
    pass


class CountingTreeDrafter(CountsLeaves, ModelTreeDrafter):
    pass


def syncs_per_round(target, drafter, policy, temperature=0.0, max_new_tokens=40, per_call=0) -> float:
    """Host syncs of one call per round, after taking off the per-call ones (:data:`OVERHEAD`, and the drafter's own
    ``per_call``) and the reads when rows left the batch."""
    dk.generate(target, PROMPTS, drafter=drafter, policy=policy, max_new_tokens=4, temperature=temperature)
    leaves = getattr(drafter, "leaves", 0)
    with count_syncs() as counter:
        out = dk.generate(
            target,
            PROMPTS,
            drafter=drafter,
            policy=policy,
            max_new_tokens=max_new_tokens,
            eos_token_id=(),
            temperature=temperature,
            seed=0,
        )
    extra = getattr(drafter, "leaves", 0) - leaves
    return (counter[0] - OVERHEAD - LATER * (out.stats.drafted > 0) - per_call - extra) / out.stats.rounds


def test_the_counter_sees_syncs(target):
    class Syncing:
        def propose(self, state, budget):
            int(state.lengths[0])  # one deliberate sync per round
            return dk.Draft.empty(state.batch_size)

    per_round = syncs_per_round(target, Syncing(), FixedLength(2))
    assert per_round > 1.9  # the deliberate sync on top of the loop's own (plain decoding: 1)


def test_plain_decoding_one_sync_per_round(target):
    per_round = syncs_per_round(target, None, None)
    assert per_round <= 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ngram_rounds_at_most_two(target, temperature):
    per_round = syncs_per_round(target, NGramDrafter(), FixedLength(4), temperature)
    assert per_round <= 2


class Unmirrored:
    """``policy``'s budget (default ``FixedLength(3)``) without its host mirrors: what a policy that computes on the
    device gives."""

    def __init__(self, policy=None):
        self.policy = FixedLength(3) if policy is None else policy

    def plan(self, state):
        return dataclasses.replace(self.policy.plan(state), host_nodes=None, host_depth=None)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_model_drafter_rounds_as_plain_decoding_on_a_fixed_length(target, temperature):
    """The draft knows its width from the budget's host mirrors: the loop trims it without a read, so a round
    costs what a plain decoding step does (without the mirrors, one more: the used width)."""
    drafter = CountingModelDrafter(perturbed(target, 0.3, seed=1))
    assert syncs_per_round(target, drafter, FixedLength(3), temperature) <= 1
    assert 1.5 < syncs_per_round(target, drafter, Unmirrored(), temperature) <= 2


@pytest.mark.parametrize("policy", ["heuristic", "gammatune", "kld_stability", "goodput", "batch_aware"])
def test_adaptive_policy_rounds_at_most_two(target, policy):
    """An adaptive length policy reads its per-row lengths once (``length_budget``); they serve as the budget's
    host mirrors, so the draft declares its width: that read and the loop's."""
    drafter = CountingModelDrafter(perturbed(target, 0.3, seed=1))
    assert syncs_per_round(target, drafter, dk.build("policy", policy)) <= 2


@pytest.mark.parametrize("shape", ["dynamic", "template", "iid", "recycling"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_rounds_as_plain_decoding_on_a_fixed_budget(target, shape, temperature):
    """A tree drafter knows from the budget's host mirrors how many node columns its shape can fill (a bound on
    its width, ``knowing_width(..., exact=False)``), so the loop trims without a read: greedy, a tree round costs
    what a plain step does; sampled, the traversal verifier adds its one read (its deepest node)."""
    if shape == "recycling":
        drafter = RecyclingDrafter()
    else:
        drafter = CountingTreeDrafter(perturbed(target, 0.3, seed=1), shape=shape, branches=2)
    per_round = syncs_per_round(target, drafter, FixedLength(7, depth=4), temperature)
    assert per_round <= (1 if temperature == 0 else 2)


def test_stacked_policies_keep_their_mirrors(target):
    """A stack of mirrored policies is mirrored too (their minima and the batch cap taken on the host): a stack of
    fixed lengths costs what a fixed length does, a stack with an adaptive part what that part does."""
    drafter = CountingModelDrafter(perturbed(target, 0.3, seed=1))
    assert syncs_per_round(target, drafter, Stack(FixedLength(3), FixedLength(5))) <= 1
    adaptive = Stack(HeuristicLength(), FixedLength(4), batch_cap="mean")
    assert syncs_per_round(target, drafter, adaptive) <= 2
    assert 1.5 < syncs_per_round(target, drafter, Stack(FixedLength(3), Unmirrored())) <= 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_suffix_rounds_at_most_two(target, temperature):
    """A host-side drafter: it reads the accepted tokens for its tries (its budget comes from the host mirrors and
    it declares its draft's width); the loop adds its own read. Once a call, ``begin`` reads the prompts and their
    lengths for the tries (1). Sampled, its chains: a sampled tree round adds the traversal verifier's own read."""
    policy = FixedLength(4) if temperature == 0 else FixedLength(4, width=1)
    per_round = syncs_per_round(target, SuffixDrafter(cache_tokens=0), policy, temperature, per_call=1)
    assert per_round <= 2


@pytest.mark.parametrize("fallback", ["model", "recycling"])
def test_suffix_with_a_fallback_rounds_at_most_two(target, fallback):
    """Suffix lookup backed by a draft model or token recycling: suffix's draft says on the host which rows drafted
    and both parts declare their widths, so choosing and merging rows reads nothing: suffix's read and the loop's."""
    backup = CountingModelDrafter(perturbed(target, 0.3, seed=1)) if fallback == "model" else RecyclingDrafter()
    drafter = FallbackDrafter(SuffixDrafter(cache_tokens=0), backup, fallback_len=3)
    assert syncs_per_round(target, drafter, FixedLength(16, depth=16), per_call=1) <= 2


class CountingStop(ConfidenceStop):
    """ConfidenceStop that counts its calls: one per draft step."""

    steps = 0

    def stop(self, step):
        self.steps += 1
        return super().stop(step)


def test_model_drafter_with_a_stop_rule_adds_one_per_step(target):
    drafter = CountingModelDrafter(perturbed(target, 0.3, seed=1))
    policy = CountingStop(0.2, 4)
    with count_syncs() as counter:
        out = dk.generate(target, PROMPTS, drafter=drafter, policy=policy, max_new_tokens=40, eos_token_id=())
    assert policy.steps > out.stats.rounds  # several steps per round
    assert counter[0] <= 2 * out.stats.rounds + policy.steps + OVERHEAD + drafter.leaves
