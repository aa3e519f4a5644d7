"""Bad input to the diffusion half fails early and clearly, or gives the right result (issue 53): arguments silently
ignored or misread, token ids outside the vocabulary, a user's rule, cache, schedule or draft strategy returning the
wrong thing (checked as it comes, never a hang), classes where instances belong, and dlm-bench overrides of the wrong
type, refused before any model loads."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.dlm import SlotLogits
from decodekit.errors import (
    ComponentOutputError,
    ConfigError,
    ConfigTypeError,
    ModelNotFoundError,
    NoProgressError,
)
from tests.unit.dlm_common import MASK, peaked_llama

SETTINGS = dict(gen_length=8, block_length=4, steps=8)
PROMPTS = [[5, 9, 14, 2], [33, 7]]


@pytest.fixture(scope="module")
def dlm():
    return dk.dlm.load_model(peaked_llama(), mask_token_id=MASK)


class Counting:
    """The recompute cache, counting its forwards (a refusal must come before the first)."""

    def __init__(self) -> None:
        self.inner, self.calls = dk.dlm.Recompute(), 0

    def logits(self, dlm, state):
        self.calls += 1
        return self.inner.logits(dlm, state)


# ------------------------------------------------------------------------------------ silently ignored or misread
def test_load_model_applies_its_arguments_to_a_loaded_dlm(dlm):
    """mask_token_id, block_length and shift_logits given with an already-loaded DLM were ignored; now they make a
    new DLMModel over the same adapter (the caller's is unchanged), checked as for any model."""
    again = dk.dlm.load_model(dlm, mask_token_id=3, block_length=4, shift_logits=True)
    assert (again.mask_token_id, again.block_length, again.shift_logits) == (3, 4, True)
    assert again.lm is dlm.lm and (dlm.mask_token_id, dlm.block_length, dlm.shift_logits) == (MASK, None, False)
    assert dk.dlm.load_model(dlm) is dlm
    assert dk.dlm.load_model(again, block_length=8).mask_token_id == 3  # what is not given is kept
    with pytest.raises(ConfigError, match="inside the vocabulary"):
        dk.dlm.load_model(dlm, mask_token_id=500)
    with pytest.raises(ConfigTypeError, match="block_length"):
        dk.dlm.load_model(dlm, block_length="4")


def test_string_flags_are_refused_not_read_as_true(dlm):
    """``"false"`` is truthy: a flag not checked as a bool turned it on."""
    with pytest.raises(ConfigTypeError, match="block_causal must be True or False"):
        dk.dlm.Recompute(block_causal="false")
    with pytest.raises(ConfigTypeError, match="progress must be True or False"):
        dk.dlm.generate(dlm, PROMPTS, progress="false", **SETTINGS)
    with pytest.raises(ConfigTypeError, match="debug must be True or False"):
        dk.dlm.generate(dlm, PROMPTS, debug="no", **SETTINGS)
    with pytest.raises(ConfigTypeError, match="shift_logits must be True or False"):
        dk.dlm.load_model(dlm, shift_logits="false")
    lying = type("Lying", (dk.dlm.ThresholdRule,), {"per_row_steps": "false"})()  # a part's own flags too
    with pytest.raises(ConfigTypeError, match="Lying.per_row_steps must be True or False"):
        dk.dlm.generate(dlm, PROMPTS, rule=lying, **SETTINGS)


def test_token_ids_outside_the_vocabulary_are_refused_when_the_call_starts(dlm):
    """The constructors do not know the model: they refuse what is no token id at all; the call checks the rest
    against the model's vocabulary before any forward."""
    for rule, schedule in [
        (dk.dlm.EoTStop(eot_token_ids=[5, 128]), None),
        (dk.dlm.EoTStop(dk.dlm.EoTStop(eot_token_ids=999), eot_token_ids=5), None),  # the wrapped rule's too
        (None, dk.dlm.AdaBlock(delimiters=[9, 1000])),
    ]:
        cache = Counting()
        with pytest.raises(ConfigError, match=r"outside the model's vocabulary \[0, 128\)"):
            dk.dlm.generate(dlm, PROMPTS, rule=rule, schedule=schedule, cache=cache, **SETTINGS)
        assert cache.calls == 0
    cache = Counting()  # the tiny model declares no end-of-sequence id: said at the start, not after a forward
    with pytest.raises(ConfigError, match="no end-of-sequence id"):
        dk.dlm.generate(dlm, PROMPTS, rule=dk.dlm.EoTStop(), cache=cache, **SETTINGS)
    assert cache.calls == 0
    for bad, error in [("ab", ConfigTypeError), ([2.7], ConfigTypeError), ([True], ConfigTypeError), ([], ConfigError)]:
        with pytest.raises(error, match="eot_token_ids"):
            dk.dlm.EoTStop(eot_token_ids=bad)
    with pytest.raises(ConfigError, match="delimiters must be an integer >= 0"):
        dk.dlm.AdaBlock(delimiters=[-1])
    with pytest.raises(ConfigTypeError, match="delimiters"):
        dk.dlm.AdaBlock(delimiters="\n")
    ok = dk.dlm.generate(dlm, PROMPTS, rule=dk.dlm.EoTStop(eot_token_ids=126), **SETTINGS)  # any id inside is fine
    assert len(ok.sequences[0]) == 8


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: dk.dlm.ThresholdRule(float("nan")), "threshold"),
        (lambda: dk.dlm.FactorRule(float("nan")), "factor"),
        (lambda: dk.dlm.LocalLeapRule(threshold=float("nan")), "threshold"),
        (lambda: dk.dlm.LocalLeapRule(relaxed=float("nan")), "relaxed"),
        (lambda: dk.dlm.AdaBlock(delimiters=[5], threshold=float("nan")), "threshold"),
        (lambda: dk.dlm.AdaBlock(delimiters=[5], window=float("nan")), "window"),
    ],
)
def test_nan_thresholds_are_refused(make, name):
    with pytest.raises(ConfigError, match=f"{name} must be a finite number"):
        make()


# ---------------------------------------------------------------------------------- classes where instances belong
def test_a_class_where_an_instance_belongs_says_to_pass_an_instance(dlm):
    with pytest.raises(ConfigTypeError, match=r"pass an instance: ThresholdRule\(\)"):
        dk.dlm.EoTStop(dk.dlm.ThresholdRule)
    with pytest.raises(ConfigTypeError, match=r"pass an instance: BlockCausalCache\(\)"):
        dk.dlm.generate(dlm, PROMPTS, cache=dk.dlm.BlockCausalCache, **SETTINGS)
    with pytest.raises(ConfigTypeError, match=r"pass an instance: SpiffyDrafts\(\)"):
        dk.dlm.generate(dlm, PROMPTS, draft=dk.dlm.SpiffyDrafts, **SETTINGS)
    with pytest.raises(ConfigTypeError, match="instance"):
        dk.dlm.generate(dk.dlm.DLMModel, PROMPTS, **SETTINGS)
    with pytest.raises(ConfigTypeError, match="the class DLMModel"):
        dk.dlm.load_model(dk.dlm.DLMModel)


def test_a_zoo_name_typo_is_an_unknown_name_not_a_missing_mask_id():
    with pytest.raises(ModelNotFoundError, match=r"did you mean 'smollm2-135m-bdlm'.*smollm2-135m-dlm") as error:
        dk.dlm.load_model("smollm2-135m-bdml")
    assert "mask_token_id=<" not in str(error.value)
    with pytest.raises(ModelNotFoundError, match="not a zoo diffusion LM"):  # with a mask id too
        dk.dlm.load_model("smollm2-135m-instrct", mask_token_id=16)


# ----------------------------------------------------------------------------------------- custom components' outputs
class Rule:
    """A rule returning ``out(eligible)``."""

    def __init__(self, out) -> None:
        self.out = out

    def select(self, state, proposal, eligible):
        return self.out(state, eligible)


@pytest.mark.parametrize(
    "out",
    [
        lambda st, el: el.tolist(),  # a list
        lambda st, el: el.long(),  # not bool
        lambda st, el: el[0],  # [G]
        lambda st, el: torch.cat([el, el[:, :1]], 1),  # [B, G + 1]
    ],
)
def test_a_rules_malformed_commits_are_refused(dlm, out):
    with pytest.raises(
        ComponentOutputError, match=r"Rule.select must return a \[B, G\] = \[2, 8\] bool tensor on cpu, got"
    ):
        dk.dlm.generate(dlm, PROMPTS, rule=Rule(out), **SETTINGS)


def test_a_wrapped_rules_commits_are_checked_by_the_wrapper(dlm):
    with pytest.raises(ComponentOutputError, match=r"Rule.select must return a \[B, G\]"):
        dk.dlm.generate(dlm, PROMPTS, rule=dk.dlm.EoTStop(Rule(lambda st, el: el.int()), eot_token_ids=5), **SETTINGS)


class Cache:
    """A cache returning ``out(logits [B, G, V])`` of the recompute."""

    def __init__(self, out) -> None:
        self.out, self.inner = out, dk.dlm.Recompute()

    def logits(self, dlm, state):
        return self.out(self.inner.logits(dlm, state), state)

    def logits_many(self, dlm, state, canvases):
        return self.out(self.inner.logits_many(dlm, state, canvases), state)


@pytest.mark.parametrize(
    "out",
    [
        lambda z, st: z[:, :-1],  # one slot short: the old loop spun forever on the slot no logits predicted
        lambda z, st: z[..., :-1],  # one token short of the vocabulary
        lambda z, st: z.argmax(-1),  # token ids, not logits
        lambda z, st: z.double().numpy(),  # not a tensor
        lambda z, st: SlotLogits(z[:, 1:4], 1),  # a window that misses the block's first slot
        lambda z, st: SlotLogits(z[:, :6], st.block[0]),  # past the generation's end in the second block
        lambda z, st: SlotLogits(z[:, :4], 0.0),  # lo not an integer
    ],
)
def test_a_caches_malformed_logits_are_refused_not_a_hang(dlm, out):
    with pytest.raises(ComponentOutputError, match=r"Cache.logits (must return|returned)"):
        dk.dlm.generate(dlm, PROMPTS, cache=Cache(out), **SETTINGS)


def test_a_caches_window_over_the_block_is_accepted(dlm):
    plain = dk.dlm.generate(dlm, PROMPTS, **SETTINGS)
    windowed = Cache(lambda z, st: SlotLogits(z[:, st.block[0] : st.block[1]], st.block[0]))
    assert dk.dlm.generate(dlm, PROMPTS, cache=windowed, **SETTINGS).sequences == plain.sequences


def test_logits_many_must_give_one_output_per_canvas(dlm):
    cache = Cache(lambda z, st: z[:-1] if z.ndim == 4 else z)
    with pytest.raises(ComponentOutputError, match=r"Cache.logits_many must return \[N, B, G, V\]"):
        dk.dlm.generate(dlm, PROMPTS, cache=cache, draft=dk.dlm.SpiffyDrafts(), **SETTINGS)


def test_nan_logits_are_refused_in_debug_mode(dlm):
    cache = Cache(lambda z, st: z.index_put((torch.tensor(0), torch.tensor(1)), torch.tensor(float("nan"))))
    with pytest.raises(ComponentOutputError, match="Cache.logits returned NaN logits"):
        dk.dlm.generate(dlm, PROMPTS, cache=cache, debug=True, **SETTINGS)


def test_a_rule_that_commits_only_unpredicted_slots_raises_instead_of_spinning(dlm):
    """Committing slots outside the window the cache predicted writes the mask id back: the old loop counted it as
    progress and never ended."""
    beyond = Rule(lambda st, el: st.masked & ~st.in_block)  # the next block's slots: no proposal there
    with pytest.raises(NoProgressError, match="Rule.select committed only slots without a proposal"):
        dk.dlm.generate(dlm, PROMPTS, rule=beyond, cache=dk.dlm.BlockCausalCache(), **SETTINGS)


class Schedule(dk.dlm.FixedBlocks):
    """Fixed blocks whose region is ``out(state)``."""

    def __init__(self, out) -> None:
        self.out = out

    def region(self, state, proposal):
        return self.out(state)


def test_a_schedules_malformed_region_is_refused(dlm):
    for out in (lambda st: st.in_block.long(), lambda st: st.in_block[:-1], lambda st: None):
        with pytest.raises(
            ComponentOutputError, match=r"Schedule.region must return a \[G\] = \[8\] or \[B, G\] = \[2, 8\] bool"
        ):
            dk.dlm.generate(dlm, PROMPTS, schedule=Schedule(out), **SETTINGS)


def test_a_schedule_that_names_no_masked_slot_raises_instead_of_spinning(dlm):
    empty = Schedule(lambda st: torch.zeros(st.gen_length, dtype=torch.bool))
    with pytest.raises(NoProgressError, match=r"Schedule.region named no masked slot of row\(s\) \[0, 1\]"):
        dk.dlm.generate(dlm, PROMPTS, schedule=empty, **SETTINGS)


class Draft:
    """Spiffy's drafts, passed through ``out(variants, state)``."""

    fixed_blocks = True

    def __init__(self, out) -> None:
        self.out, self.inner = out, dk.dlm.SpiffyDrafts()

    def variants(self, state, proposal, committed, left):
        found = self.inner.variants(state, proposal, committed, left)
        return None if found is None else self.out(found, state)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (lambda v, st: v[1], r"must return None or a \[1 \+ N, B, T\]"),  # 2-D
        (lambda v, st: v.int(), r"must return None or a \[1 \+ N, B, T\]"),  # not the canvas's dtype
        (lambda v, st: v[:, :1], r"must return None or a \[1 \+ N, B, T\]"),  # one row
        (lambda v, st: v.tolist(), r"must return None or a \[1 \+ N, B, T\]"),
        (lambda v, st: v.flip(0), "first canvas is not state.canvas"),
        (lambda v, st: torch.cat([v, v[-1:] + 500]), "outside the model's vocabulary"),
    ],
)
def test_a_draft_strategys_malformed_variants_are_refused(dlm, out, message):
    with pytest.raises(ComponentOutputError, match=f"Draft.variants {message}|Draft.variants returned .*{message}"):
        dk.dlm.generate(dlm, PROMPTS, draft=Draft(out), **SETTINGS)


# ---------------------------------------------------------------------------------------------------------- dlm-bench
@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (dict(gen_lengths="abc"), ConfigTypeError, "gen_lengths must be a list of integers"),
        (dict(gen_lengths=[128, "abc"]), ConfigTypeError, "gen_lengths must be an integer >= 1"),
        (dict(gen_lengths=[100]), ConfigError, "gen_lengths holds 100, which is not a whole number of blocks"),
        (dict(block_length="32"), ConfigTypeError, "block_length must be an integer"),
        (dict(synthetic=-1), ConfigError, "synthetic must be an integer >= 0"),
        (dict(progress="false"), ConfigTypeError, "progress must be True or False"),
        (dict(task="humaneavl"), ConfigError, "task must be one of"),
        (dict(methods="abc"), ConfigTypeError, "methods must be a mapping"),
        (dict(methods={"x": "abc"}), ConfigTypeError, "methods.x must be a mapping"),
        (dict(methods={"x": {"tokens_per_steps": 2}}), ConfigError, r"methods.x has unknown key\(s\) \['tokens_per_"),
        (
            dict(methods={"x": {"tokens_per_step": 0}}),
            ConfigError,
            "methods.x.tokens_per_step must be None or an integer >= 1",
        ),
        (dict(methods={"x": {"tokens_per_step": "2"}}), ConfigTypeError, "methods.x.tokens_per_step must be"),
        (dict(methods={"x": {"tokens_per_step": 3}}), ConfigError, "methods.x.tokens_per_step=3 gives gen_lengths 128"),
        (dict(methods={"x": {"tokens_per_step": 64}}), ConfigError, "methods.x.tokens_per_step=64 gives gen_lengths"),
        (dict(methods={"x": {"rule": dk.dlm.ThresholdRule}}), ConfigTypeError, "methods.x.rule must be an instance"),
        (dict(methods={"x": {"cache": "dual"}}), ConfigTypeError, "methods.x.cache must implement the DLMCache"),
        (dict(methods={"x": {"uncached": 3}}), ConfigTypeError, "methods.x.uncached must be None or a method's name"),
        (dict(base={"rule": None, "tokens_per_step": "abc"}), ConfigTypeError, "base.tokens_per_step must be"),
        (dict(only="threshold"), ConfigTypeError, "only must be None or a list"),
    ],
)
def test_dlm_bench_refuses_bad_overrides_before_loading(tmp_path, overrides, error, message):
    """Each refused before any model loads (``no-such-model`` would fail to load), naming the override."""
    from decodekit.bench.dlm import run

    with pytest.raises(error, match=message):
        run(tmp_path, **{"model": "no-such-model", "gen_lengths": [128], **overrides})


class BeginsBlockTypo(dk.dlm.ThresholdRule):
    """Fast-dLLM's threshold rule with a misspelt optional hook: ``begin_blok`` would never be called."""

    def begin_blok(self, state):
        raise AssertionError("a misspelt hook is never called")


def test_a_misspelt_diffusion_hook_warns_and_declared_hooks_are_read_once(dlm):
    """The diffusion parts' optional hooks are declared Protocols (:mod:`decodekit.dlm.interfaces`), read once when
    the call resolves its parts; a name one edit off a hook warns, as for the speculative components."""
    from decodekit.dlm.interfaces import Declared
    from decodekit.dlm.parts import resolve_parts

    with pytest.warns(UserWarning, match="BeginsBlockTypo.begin_blok looks like the hook 'begin_block'"):
        out = dk.dlm.generate(dlm, PROMPTS, rule=BeginsBlockTypo(), **SETTINGS)
    assert out.sequences == dk.dlm.generate(dlm, PROMPTS, rule=dk.dlm.ThresholdRule(), **SETTINGS).sequences
    parts = resolve_parts(dlm, None, None, None, "low_confidence", 4, dk.dlm.SpiffyDrafts())
    assert parts.declared == Declared(
        per_row_steps=True, begins_block=True, cache_begins=False, counts_forwards=False, slides=False,
        lookahead=True,
    )  # fmt: skip
