"""User components that break the Protocols fail early with an error that names the component, the field and what
was expected, never with silently wrong output or a deep torch trace (issue 53).

What is checked where (docs/concepts.md): types and shapes of every output each round (host metadata, free); the
values of the first budget, the first non-empty draft and its verdict (plain decoding: the first round's verdict),
and the first processed distribution (one host sync each, once a call); everything every round with
``debug=True``. A later round's bad token or tree that fails deep inside a forward is reported as the
:class:`ComponentOutputError` of the component that made it, on that error path only.
"""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.checks import INT64_RANGE, check_int
from decodekit.drafters import ModelDrafter, NGramDrafter, RecyclingDrafter, SuffixDrafter
from decodekit.drafters.suffix import save_outputs
from decodekit.errors import ComponentOutputError, ConfigError, ConfigTypeError
from decodekit.hf.streaming import check_streamer as check_bridge_streamer
from decodekit.models.tiny import tiny_llama
from decodekit.policies import (
    BatchAwareLength,
    ConfidenceStop,
    EntropyStop,
    FixedLength,
    GoodputLength,
    Stack,
)
from decodekit.policies.analytic import CostModel
from decodekit.policies.profile import profile_costs
from decodekit.verifiers import GreedyVerifier

VOCAB = 128
PROMPT = [[5, 6, 7, 5, 6, 7, 5, 6]]


def run(target, drafter=None, verifier=None, policy=None, **kwargs):
    kwargs.setdefault("max_new_tokens", 12)
    kwargs.setdefault("eos_token_id", ())
    return dk.generate(target, kwargs.pop("prompts", PROMPT), drafter, verifier, policy, **kwargs)


class NeverCalled:
    """A drafter that fails the test if generate() reaches it: an up-front check must come first."""

    vocab_size = VOCAB

    def propose(self, state, budget):
        raise AssertionError("generate() ran although its input was invalid")


class Drafts:
    """A drafter whose ``make(state, round)`` builds the draft (``round``: 0-based count of its calls)."""

    def __init__(self, make):
        self.make, self.calls = make, 0

    def propose(self, state, budget):
        self.calls += 1
        return self.make(state, self.calls - 1)


def constant_chain(token: int = 3, width: int = 2):
    """Every row drafts ``width`` copies of ``token``, every round."""

    def make(state, round_):
        return dk.Draft.chain(torch.full((state.batch_size, width), token, dtype=torch.long))

    return make


class Verdicts(GreedyVerifier):
    """Greedy verification whose verdict ``make(draft, verdict)`` rewrites, from its call ``from_call`` on."""

    def __init__(self, make, from_call: int = 0):
        self.make, self.from_call, self.calls = make, from_call, 0

    def verify(self, draft, logits, sampling, generator):
        verdict = super().verify(draft, logits, sampling, generator)
        self.calls += 1
        return self.make(draft, verdict) if self.calls > self.from_call else verdict


def replaced(verdict: dk.Verdict, **fields) -> dk.Verdict:
    return dk.Verdict(
        **(
            {"accepted": verdict.accepted, "num_accepted": verdict.num_accepted, "next_token": verdict.next_token}
            | fields
        )
    )


@pytest.fixture(scope="module")
def wide():
    """A tiny target with another vocabulary (256 tokens)."""
    return tiny_llama(1, vocab=256)


# ============================================================================================== verdicts
def test_a_verdict_accepting_more_than_was_drafted_is_refused_on_the_first_round(target):
    """Silently wrong output before: the row committed tokens nobody drafted."""
    greedy_more = Verdicts(lambda d, v: replaced(v, num_accepted=d.num_valid + 1))
    with pytest.raises(ComponentOutputError, match=r"Verdicts.verify returned a malformed Verdict: num_accepted must"):
        run(target, Drafts(constant_chain()), greedy_more, FixedLength(2))


@pytest.mark.parametrize("drafter", [None, "chain"])
def test_a_next_token_outside_the_vocabulary_is_refused_on_the_first_round(target, drafter):
    """An IndexError from the embedding a round later before."""
    oov = Verdicts(lambda d, v: replaced(v, next_token=v.next_token + VOCAB))
    drafter = Drafts(constant_chain()) if drafter else None
    with pytest.raises(ComponentOutputError, match=r"Verdicts.verify returned a malformed Verdict: next_token must be"):
        run(target, drafter, oov, FixedLength(2))


@pytest.mark.parametrize("drafter", [None, "chain", "model"])
def test_a_later_next_token_outside_the_vocabulary_names_the_verifier(target, drafter):
    """Past the checked rounds the bad pending token fails in the target's (or the draft model's) forward: the error
    names the verifier, the field and debug=True; or, where no forward failed, the later verdicts' checks read when
    the call ends name the round."""
    oov = Verdicts(lambda d, v: replaced(v, next_token=v.next_token + VOCAB), from_call=1)
    drafter = {None: None, "chain": Drafts(constant_chain()), "model": ModelDrafter(target)}[drafter]
    later = r"\(round \d+; its output is not returned\) returned a malformed Verdict: next_token must be"
    with pytest.raises(
        ComponentOutputError, match=rf"Verdicts.verify (returned a next_token outside .*debug=True|{later})"
    ):
        run(target, drafter, oov, FixedLength(2), max_new_tokens=6)
    with pytest.raises(ComponentOutputError, match=r"Verdicts.verify returned a malformed Verdict: next_token"):
        run(target, drafter, Verdicts(oov.make, from_call=1), FixedLength(2), max_new_tokens=6, debug=True)


def test_a_next_token_outside_the_vocabulary_on_the_last_round_is_refused(target):
    """The last round's next_token goes through no forward: silently in the output before."""
    rounds = run(target, ModelDrafter(target), None, FixedLength(2), max_new_tokens=6).stats.rounds
    oov = Verdicts(lambda d, v: replaced(v, next_token=v.next_token + VOCAB), from_call=rounds - 1)
    later = r"\(round \d+; its output is not returned\) returned a malformed Verdict: next_token must be"
    with pytest.raises(
        ComponentOutputError, match=rf"Verdicts.verify (returned a next_token .* on the last round|{later})"
    ):
        run(target, ModelDrafter(target), oov, FixedLength(2), max_new_tokens=6)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d, v: replaced(v, accepted=v.accepted + 9), "accepted must hold -1 or node indices"),
        (lambda d, v: replaced(v, num_accepted=v.num_accepted + 3), "num_accepted must be in"),
    ],
)
def test_a_later_malformed_verdict_that_breaks_the_bookkeeping_names_the_verifier(target, make, match):
    with pytest.raises(ComponentOutputError, match=rf"Verdicts.verify returned a malformed Verdict: {match}.*round 1"):
        run(target, ModelDrafter(target), Verdicts(make, from_call=1), FixedLength(2), max_new_tokens=6)


# ================================================================================================ drafts
def tree(state, parents, tokens=3):
    n = len(parents)
    return dk.Draft.tree(
        torch.full((state.batch_size, n), tokens, dtype=torch.long),
        torch.tensor([parents]).expand(state.batch_size, n),
        torch.ones(state.batch_size, n, dtype=torch.bool),
    )


def test_a_parent_past_the_end_is_refused(target):
    """A RuntimeError from a gather inside the draft check before (it checked parents < i after indexing with them)."""
    bad = Drafts(lambda state, _: tree(state, [-1, 7]))
    with pytest.raises(
        ComponentOutputError, match=r"Drafts.propose returned a malformed Draft: every valid node needs"
    ):
        run(target, bad, None, FixedLength(2))


def test_a_later_parent_past_the_end_names_the_drafter(target):
    bad = Drafts(lambda state, r: tree(state, [-1, 7 if r >= 1 else 0]))
    with pytest.raises(ComponentOutputError, match=r"Drafts.propose returned a malformed Draft: .*parents.*round 1"):
        run(target, bad, None, FixedLength(2), max_new_tokens=4)


def test_a_later_token_outside_the_vocabulary_names_the_drafter(target):
    """An IndexError from the target's embedding before."""
    late = Drafts(lambda state, r: dk.Draft.chain(torch.full((state.batch_size, 2), 500 if r >= 1 else 3)))
    with pytest.raises(ComponentOutputError, match=r"Drafts.propose returned draft token ids outside .*debug=True"):
        run(target, late, None, FixedLength(2), max_new_tokens=4)
    late.calls = 0
    with pytest.raises(ComponentOutputError, match=r"Drafts.propose returned a malformed Draft: draft token ids must"):
        run(target, late, None, FixedLength(2), max_new_tokens=4, debug=True)


@pytest.mark.parametrize("field", ["q", "draft_probs"])
def test_a_distribution_over_another_vocabulary_is_refused(target, field):
    """A shape mismatch deep in the verifier (q) or the round record (draft_probs) before; a shape: checked every
    round, without a sync."""
    probs = torch.full((1, 2, 50), 1 / 50)
    bad = Drafts(lambda state, _: dk.Draft.chain(torch.full((1, 2), 3), **{field: probs}))
    temperature = 1.0 if field == "q" else 0.0
    with pytest.raises(ComponentOutputError, match=rf"Drafts.propose returned a draft whose {field} covers 50 tokens"):
        run(target, bad, None, FixedLength(2), temperature=temperature, seed=0)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: dk.Draft.chain(torch.tensor([1, 2])), r"Draft.chain: tokens must be \[B, N\].*use tokens\[None\]"),
        (lambda: dk.Draft.chain(torch.tensor([[1, 2]]), valid=[[True, True]]), "Draft.chain: valid must be a tensor"),
        (
            lambda: dk.Draft.tree(torch.tensor([[1, 2]]), torch.tensor([-1, 0]), torch.ones(1, 2, dtype=torch.bool)),
            r"Draft.tree: parents must be \[B, N\].*parents\[None\]",
        ),
        (lambda: dk.Draft.tree(torch.tensor([[1]]), torch.tensor([[-1]]), [[True]]), "Draft.tree: valid must be a"),
    ],
)
def test_draft_builders_check_shapes(build, match):
    """Unpacking and attribute errors before."""
    with pytest.raises(ComponentOutputError, match=match):
        build()


def test_a_q_index_past_the_rows_of_q_is_refused(target):
    def make(state, _):
        q = torch.full((1, 1, VOCAB), 1 / VOCAB)
        tokens, parents = torch.tensor([[3, 4]]), torch.tensor([[-1, -1]])
        valid = torch.ones(1, 2, dtype=torch.bool)
        return dk.Draft.tree(tokens, parents, valid, kind=dk.DraftKind.SAMPLED, q=q, q_index=torch.tensor([[0, 5]]))

    with pytest.raises(ComponentOutputError, match=r"q_index must point at rows of q, in \[0, 1\)"):
        run(target, Drafts(make), None, FixedLength(2), temperature=1.0, seed=0)


# ============================================================================================ stop rules
class StopsWith(ConfidenceStop):
    """ConfidenceStop whose stop rule returns ``make(step)``."""

    def __init__(self, make):
        super().__init__(0.2, 3)
        self.make = make

    def stop(self, step):
        return self.make(step)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda step: None, r"returned None \(NoneType\); a stop rule must return a bool tensor \[B\] = \(1,\)"),
        (lambda step: torch.zeros(5, dtype=torch.bool), r"returned a 1-D bool tensor of shape \(5,\)"),
        (lambda step: torch.zeros(1), r"returned a 1-D float32 tensor .*use .bool\(\)"),
    ],
)
@pytest.mark.parametrize("stacked", [False, True])
def test_a_stop_rule_with_a_wrong_output_names_the_rule(target, make, match, stacked):
    """A TypeError (``~None``) or a torch.stack error inside the drafter before."""
    policy = StopsWith(make)
    if stacked:
        policy = Stack(ConfidenceStop(0.2, 3), policy)
    with pytest.raises(ComponentOutputError, match=rf"the stop rule StopsWith.stop \(DraftBudget.stop\) {match}"):
        run(target, ModelDrafter(target), None, policy, max_new_tokens=4)


# ============================================================================================== streamers
class Puts:
    def __init__(self, put, end):
        self.put, self.end = put, end


@pytest.mark.parametrize(
    ("streamer", "match"),
    [
        (lambda tokens: None, r"streamer must be callable as streamer\(row, tokens\) .*\(tokens\) cannot be called"),
        (lambda row, tokens, extra: None, r"streamer\(row, tokens\) .*\(row, tokens, extra\)"),
        (Puts(lambda: None, lambda: None), r"streamer.put must be callable as put\(tokens\)"),
        (Puts(lambda tokens: None, lambda now: None), r"streamer.end must be callable as end\(\)"),
    ],
)
def test_a_streamer_of_the_wrong_signature_is_refused_up_front(target, streamer, match):
    """A TypeError from inside the loop, after the prefill, before."""
    with pytest.raises(ConfigTypeError, match=match):
        run(target, NeverCalled(), streamer=streamer)


def test_only_streamers_that_do_not_fit_are_refused(target):
    seen = []

    def collect(row, tokens, *rest, flush=False):
        seen.extend(tokens)

    run(target, streamer=collect, max_new_tokens=3)
    assert len(seen) == 3
    run(target, streamer=print, max_new_tokens=1)  # a builtin whose signature may be unknown: accepted
    with pytest.raises(ConfigTypeError, match=r"streamer must be callable as streamer\(row, tokens\)"):
        run(target, NeverCalled(), streamer=lambda row: seen.append(row))


def test_the_bridge_checks_a_streamers_signature():
    with pytest.raises(ConfigTypeError, match=r"streamer.put must be callable as put\(tokens\)"):
        check_bridge_streamer(Puts(lambda: None, lambda: None))
    check_bridge_streamer(Puts(lambda tokens: None, lambda: None))


# =========================================================================================== huge ints
@pytest.mark.parametrize(
    "build",
    [
        lambda: FixedLength(10**30),
        lambda: FixedLength(3, depth=2**63),
        lambda: NGramDrafter(max_ngram=10**30),
        lambda: SuffixDrafter(cache_tokens=2**64),
        lambda: ConfidenceStop(max_len=10**20),
    ],
)
def test_ints_beyond_64_bits_are_refused(build):
    """An OverflowError inside generate() before."""
    with pytest.raises(ConfigError, match=r"fits in 64 bits"):
        build()


def test_check_int_takes_the_whole_64_bit_range():
    low, high = INT64_RANGE
    assert check_int("n", high) == 2**63 - 1 and check_int("n", low) == -(2**63)
    with pytest.raises(ConfigError, match=r"n must be an integer that fits in 64 bits"):
        check_int("n", -(2**63) - 1)


# =============================================================================================== models
@pytest.mark.parametrize("call", ["load_model", "generate", "drafter"])
def test_a_module_that_is_not_a_causal_lm_is_refused(target, call):
    """``AttributeError: 'Linear' object has no attribute 'get_decoder'`` before."""
    linear = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigTypeError, match=r"must be a transformers causal LM .*Linear.*not a causal LM"):
        if call == "load_model":
            dk.load_model(linear)
        elif call == "generate":
            dk.generate(linear, PROMPT)
        else:
            ModelDrafter(linear)


# ============================================================================================ processors
@pytest.mark.parametrize("processor", [lambda scores: scores, lambda ids, scores, extra: scores])
def test_a_processor_of_the_wrong_signature_is_refused_up_front(target, processor):
    with pytest.raises(ConfigTypeError, match=r"logits_processor\[0\] must be callable as f\(input_ids, scores\)"):
        run(target, NeverCalled(), logits_processor=[processor])


@pytest.mark.parametrize(
    ("processor", "match"),
    [
        (lambda ids, scores: None, r"returned None \(NoneType\); a processor .* shape \(1, 128\)"),
        (lambda ids, scores: scores[:, :10], r"returned a 2-D float32 tensor of shape \(1, 10\)"),
        (lambda ids, scores: scores.argmax(-1), r"returned a 1-D int64 tensor"),
    ],
)
def test_a_processor_returning_the_wrong_thing_is_refused(target, processor, match):
    """A TypeError or a shape error deep in the loop before; a type and shape: checked on every call, free."""
    with pytest.raises(ComponentOutputError, match=rf"the logits processor .*<lambda> {match}"):
        run(target, logits_processor=[processor], max_new_tokens=2)


@pytest.mark.parametrize(
    ("processor", "match"),
    [
        (lambda ids, scores: scores * float("nan"), "NaN or"),
        (lambda ids, scores: torch.full_like(scores, float("-inf")), "a row where every token is -inf"),
        (lambda ids, scores: scores.index_fill(-1, torch.tensor([3]), float("inf")), r"NaN or \+inf"),
    ],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_processor_leaving_no_valid_distribution_is_refused(target, processor, match, temperature):
    """A row of token 0 at temperature 1 before (transformers raises)."""
    with pytest.raises(ComponentOutputError, match=rf"{match}.* from the logits processor .*<lambda>"):
        run(target, logits_processor=[processor], max_new_tokens=2, temperature=temperature, seed=0)


def test_a_processor_going_bad_later_is_found_with_debug(target):
    """Its values cost a host sync: checked on the first distribution only, every one with debug=True."""

    class LaterNaN:
        calls = 0

        def __call__(self, ids, scores):
            self.calls += 1
            return scores * float("nan") if self.calls > 3 else scores

    with pytest.raises(ComponentOutputError, match="NaN or .* from the logits processor LaterNaN"):
        run(target, logits_processor=[LaterNaN()], max_new_tokens=6, debug=True)


def test_nan_logits_are_blamed_on_the_model_not_the_processor(target):
    nan_model = tiny_llama(2)
    with torch.no_grad():
        nan_model.lm_head.weight.fill_(float("nan"))
    with pytest.raises(ComponentOutputError, match=r"NaN or \+inf scores from the model's logits"):
        run(nan_model, logits_processor=[lambda ids, scores: scores], max_new_tokens=2)


# ================================================================================================ flags
@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: GoodputLength(calibrate="false"), "calibrate"),
        (lambda: GoodputLength(positional="no"), "positional"),
        (lambda: EntropyStop(adaptive="false"), "adaptive"),
        (lambda: BatchAwareLength(calibrate=1), "calibrate"),
    ],
)
def test_flags_take_true_or_false_only(build, name):
    """The string "false" was read as True before."""
    with pytest.raises(ConfigTypeError, match=rf"{name} must be True or False"):
        build()


def test_profile_costs_progress_is_a_flag(target):
    with pytest.raises(ConfigTypeError, match="progress must be True or False"):
        profile_costs(target, None, PROMPT, max_len=1, progress="false")


# ============================================================================= classes for instances
@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Stack(FixedLength(3), ConfidenceStop), r"Stack's part 1 must be an instance.*ConfidenceStop\(\)"),
        (lambda: Stack(FixedLength), r"Stack's part 0 must be an instance.*FixedLength\(\)"),
        (lambda: GoodputLength(CostModel), r"costs must be a CostModel.*got the class CostModel; pass an instance"),
        (lambda: BatchAwareLength({1: CostModel}), r"costs must be .*the class CostModel"),
        (lambda: GoodputLength(costs=3), r"costs must be a CostModel.*got 3 \(int\)"),
    ],
)
def test_a_class_where_an_instance_is_expected(build, match):
    """A class has the attributes an instance has (Stack took it for a policy): it failed deep in the loop before."""
    with pytest.raises(ConfigTypeError, match=match):
        build()


# ================================================================================ state across targets
@pytest.mark.parametrize("order", ["narrow_then_wide", "wide_then_narrow"])
def test_recycling_reused_on_another_vocabulary_starts_fresh(target, wide, order):
    """An IndexError in the successor matrix (a wider vocabulary) or drafts of another tokenizer's ids (a narrower
    one) before: the matrix now resets, so the second call drafts as a fresh drafter would."""
    prompts = [[100, 101, 102, 100, 101, 102, 100]]
    reused = RecyclingDrafter()
    if order == "narrow_then_wide":
        first, second = target, wide
        run(first, reused, prompts=prompts, max_new_tokens=16)
    else:  # the matrix a long call on the wide target leaves: successors (up to 255) recorded for every token
        second = target
        reused.matrix = torch.randint(0, 256, (257, reused.k), generator=torch.Generator().manual_seed(0))
    again = run(second, reused, prompts=prompts, max_new_tokens=16)
    fresh = run(second, RecyclingDrafter(), prompts=prompts, max_new_tokens=16)
    assert again.sequences == fresh.sequences
    assert (again.stats.drafted, again.stats.rounds) == (fresh.stats.drafted, fresh.stats.rounds)


def test_suffix_reused_on_another_vocabulary_starts_fresh(target, wide):
    drafter = SuffixDrafter()
    run(wide, drafter, prompts=[[200, 201, 202, 200, 201, 202]], max_new_tokens=8)
    assert drafter.cached_outputs  # the wide target's output, in its ids
    out = run(target, drafter, max_new_tokens=8)
    assert drafter.cached_outputs == out.sequences  # only this target's output: the other one's went


def test_suffix_outputs_outside_the_vocabulary_are_refused(target):
    """A draft of ids the target does not have (a ComponentOutputError blaming the drafter's draft, or an
    IndexError on a later round) before: now refused at the call's start, naming the cache."""
    drafter = SuffixDrafter()
    drafter.remember([[5, 6, 7, 300, 301]])
    with pytest.raises(ConfigError, match=r"SuffixDrafter's global cache holds token id 301 .*\[0, 128\)"):
        run(target, drafter, max_new_tokens=4)


def test_a_corrupt_preload_file_is_named(tmp_path):
    garbage = tmp_path / "outputs.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match=rf"preload file {garbage} could not be read .*'tokens' \[T\]"):
        SuffixDrafter(preload=garbage)
    bad = tmp_path / "offsets.safetensors"
    save_outputs(bad, [[1, 2], [3]])
    from safetensors.torch import load_file, save_file

    data = load_file(str(bad))
    data["offsets"] = torch.tensor([0, 5, 1])
    save_file(data, str(bad))
    with pytest.raises(ConfigError, match=rf"preload file {bad} is malformed \(offsets must rise from 0 to 3"):
        SuffixDrafter(preload=bad)
    data["tokens"] = data["tokens"].float()
    save_file(data, str(bad))
    with pytest.raises(ConfigError, match=rf"preload file {bad} is malformed \(tokens a 1-D float32"):
        SuffixDrafter(preload=bad)


# ======================================================================================= declared hooks
class DeclaresKind:
    def __init__(self, kind):
        self.kind = kind

    def draft_kind(self, sampling):
        return self.kind

    def propose(self, state, budget):
        return dk.Draft.empty(state.batch_size)


class AcceptsText(GreedyVerifier):
    accepts = "deterministic"  # a string: "sampled" in it would be a substring test


class TapsLayers(FixedLength):
    def __init__(self, layers):
        super().__init__(2)
        self.hidden_layers = layers


class MethodVocab(DeclaresKind):
    def vocab_size(self):
        return VOCAB


@pytest.mark.parametrize(
    ("parts", "error", "match"),
    [
        (dict(drafter=DeclaresKind("guess")), ComponentOutputError, r"DeclaresKind.draft_kind must return a DraftKind"),
        (dict(drafter=NeverCalled(), verifier=AcceptsText()), ConfigTypeError, r"AcceptsText.accepts must be a set of"),
        (dict(drafter=NeverCalled(), policy=TapsLayers(3)), ConfigTypeError, r"TapsLayers.hidden_layers must be a col"),
        (dict(drafter=NeverCalled(), policy=TapsLayers([5])), ConfigTypeError, r"layer indices in \[0, 2\]"),
        (dict(drafter=MethodVocab(dk.DraftKind.DETERMINISTIC)), ConfigTypeError, r"MethodVocab.vocab_size must be an"),
    ],
)
def test_declared_hooks_of_the_wrong_type_are_refused_up_front(target, parts, error, match):
    """An AttributeError (a string kind), a TypeError (an int of layers), a substring test (accepts) or a vocabulary
    "mismatch" with a bound method before."""
    with pytest.raises(error, match=match):
        run(target, **parts)


def test_a_draft_kind_given_as_its_name_works(target):
    out = run(target, DeclaresKind("deterministic"), max_new_tokens=2)
    assert len(out.sequences[0]) == 2
    with pytest.raises(ComponentOutputError, match="draft_kind must return a DraftKind"):
        run(target, DeclaresKind(None), max_new_tokens=2)


class HostRows(NGramDrafter):
    """Declares ``host_rows`` (its ``select_rows`` gets the kept rows on the host) and records what it was given."""

    needs = frozenset({"host_rows"})

    def __init__(self):
        super().__init__()
        self.given = []

    def select_rows(self, rows, host_rows=None):
        self.given.append((rows.tolist(), host_rows))


class SharesWithPrefill(NGramDrafter):
    """A target-sharing drafter that declares ``prefill``: its ``begin`` gets the prefill's output."""

    shares_target = True
    needs = frozenset({"prefill", "hidden"})

    def begin(self, state, target, cache, prefill=None):
        self.prefill = prefill


def test_declared_hook_arguments_are_given_and_checked(target):
    """``needs`` declares a hook's extra argument (never read off its signature): ``host_rows`` reaches
    ``select_rows`` and ``prefill`` a target-sharing drafter's ``begin``; a declaration its hook cannot take, or
    ``prefill`` on a drafter that does not share the target, is refused when the call starts."""
    drafter = HostRows()
    plain = dk.generate(target, [[1, 2], [5, 6, 7, 5, 6, 7]], max_new_tokens=8, eos_token_id=()).sequences
    eos = plain[0][2 + 1]  # row 0's second new token ends it early: row 1 goes on alone
    dk.generate(target, [[1, 2], [5, 6, 7, 5, 6, 7]], drafter, max_new_tokens=8, eos_token_id=eos)
    assert drafter.given and all(rows == host for rows, host in drafter.given)
    shares = SharesWithPrefill()
    dk.generate(target, PROMPT, shares, max_new_tokens=4)
    assert shares.prefill.last_hidden.shape[:2] == (1, len(PROMPT[0]))

    class NoKeyword(NGramDrafter):
        needs = frozenset({"host_rows"})

        def select_rows(self, rows):
            pass

    class NotSharing(NGramDrafter):
        needs = frozenset({"prefill"})

    with pytest.raises(ConfigError, match=r"NoKeyword.needs has 'host_rows' but NoKeyword.select_rows takes no"):
        run(target, NoKeyword())
    with pytest.raises(ConfigError, match=r"NotSharing.needs has 'prefill', which only a drafter with shares_target"):
        run(target, NotSharing())
