"""Every decoder-only architecture of the installed transformers, tiny and random (``tests/archs.py``): decodekit's
greedy output equals ``model.generate(do_sample=False)`` token for token, or decodekit refuses the model up front.

Checks per supported case, each prompt run alone unless said otherwise (``MAX_NEW`` tokens, EOS off, sliding windows
of ``archs.WINDOW`` tokens, shorter than every prompt + output):

- ``test_greedy_matches_transformers``: plain decoding equals transformers' batch-1 greedy generate (two prompts);
- ``test_ngram_drafter``: the same with the n-gram drafter, prompt by prompt until it has drafted (the three
  prompts run with it in ``test_ragged_batch``);
- ``test_self_drafter``: a model drafter whose draft model is the target itself (every draft accepted), the three
  prompts in one ragged batch;
- ``test_perturbed_drafter``: a draft model with noisy weights (some drafts accepted, not all), the three prompts
  in one ragged batch (rows accept different counts, and both models' caches roll back per row; batch-1 rejections
  are the n-gram drafter's);
- ``test_ragged_batch``: the three prompts in one ragged batch with the n-gram drafter (rows with drafts of
  different lengths, or none) equal transformers' batch-1 output, which the batch-1 runs above equal.

Plain decoding of a ragged batch is what the self-drafter's draft model does, one token a row a step: a draft that
differs from the target's own verification would be rejected, so ``test_self_drafter``'s every-draft-accepted
check fails if ragged plain decoding is wrong.

A refused case (``EXPECTED[case] == "refused"``) must make ``load_model`` raise ``UnsupportedModelError`` naming the
architecture, and ``generate`` likewise, before any model code runs.
"""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.errors import IncompatibleDraftError, UnsupportedModelError
from decodekit.policies import FixedLength
from tests.archs import CASES, EXPECTED, build_model, case_id, tiny_model

MAX_NEW = 10  # the shortest prompt and its output span twice the window (7 + 10 > 2 x WINDOW)
PROMPTS = [  # lengths 10, 7, 13: prompt + output always exceeds the window; repetitions feed the n-gram drafter
    [5, 17, 33, 5, 17, 33, 5, 17, 33, 5],
    [40, 41, 42, 40, 41, 42, 40],
    [9, 8, 7, 6, 9, 8, 7, 6, 9, 8, 60, 61, 9],
]


def _params(expected: str) -> list:
    return [
        pytest.param(t, v, id=case_id(t, v)) for t, v in CASES if EXPECTED.get(case_id(t, v), "supported") == expected
    ]


SUPPORTED = _params("supported")
REFUSED = _params("refused")
if os.environ.get("DECODEKIT_SWEEP_ALL"):  # diagnosis: run the exactness checks on every case, refused ones too
    SUPPORTED, REFUSED = SUPPORTED + REFUSED, []


@functools.cache
def reference(model_type: str, variant: str | None) -> tuple[tuple[int, ...], ...]:
    """transformers' greedy continuation of each prompt, batch 1 (no padding), EOS off."""
    model = tiny_model(model_type, variant)
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW)
        out.append(tuple(tokens[0, len(prompt) :].tolist()))
    return tuple(out)


@functools.cache
def draft_copy(model_type: str, variant: str | None) -> torch.nn.Module:
    """A noisy copy of the case's model (a fresh build: no adapter attached) whose argmax agrees with the target's
    on 30-90% of the reference tokens (teacher-forced, transformers' own forward): the first noise scale that
    does, or the one closest to 60%."""
    target, refs = tiny_model(model_type, variant), reference(model_type, variant)
    rows = [p + list(r[:-1]) for p, r in zip(PROMPTS, refs)]  # one right-padded batch: causal rows ignore the pad
    ids = torch.tensor([row + [0] * (max(map(len, rows)) - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (ids.shape[1] - len(row)) for row in rows])
    scored = torch.zeros_like(ids, dtype=torch.bool)  # the positions that predict a reference token
    for b, (row, prompt) in enumerate(zip(rows, PROMPTS)):
        scored[b, len(prompt) - 1 : len(row)] = True
    with torch.no_grad():
        want = target(ids, attention_mask=mask).logits.argmax(-1)[scored]
    best, fresh = None, build_model(model_type, variant)
    for scale in (0.2, 0.1, 0.05, 0.5, 0.02, 0.01, 0.005, 0.002):
        draft = _perturbed(copy.deepcopy(fresh), scale)
        with torch.no_grad():
            got = draft(ids, attention_mask=mask).logits.argmax(-1)[scored]
        agree = float((got == want).float().mean())
        if 0.3 <= agree <= 0.9:
            return draft
        if best is None or abs(agree - 0.6) < best[0]:
            best = (abs(agree - 0.6), draft)
    return best[1]


def _perturbed(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    """``model`` with Gaussian noise (``scale`` x each tensor's std) on its weight matrices (vectors such as norm
    weights, biases and activation parameters are left alone: some architectures diverge when those move)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp(min=1e-3))
    return model


def _generate(model: torch.nn.Module, prompts: list[list[int]], drafter=None, k: int = 4) -> dk.GenerationOutput:
    return dk.generate(model, prompts, drafter, policy=FixedLength(k), max_new_tokens=MAX_NEW, eos_token_id=())


def _check(what: str, got: list[list[int]], want: list[tuple[int, ...]], model: torch.nn.Module | None = None) -> None:
    """Fail with the first differing row and position (and transformers' top-2 logit margin there)."""
    for row, (g, w) in enumerate(zip(got, want)):
        g, w = list(g), list(w)
        if g == w:
            continue
        pos = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        detail = ""
        if model is not None and pos < min(len(g), len(w)):
            with torch.no_grad():
                logits = model(torch.tensor([PROMPTS[row] + w[:pos]])).logits[0, -1].float()
            top = logits.topk(2)
            detail = (
                f"; transformers' top-2 there {top.indices.tolist()} margin {float(top.values[0] - top.values[1]):.3g}"
            )
        pytest.fail(
            f"{what}: row {row} (prompt length {len(PROMPTS[row])}) diverges at new token {pos}: "
            f"expected {w[pos : pos + 4]}..., got {g[pos : pos + 4]}...{detail}",
            pytrace=False,
        )


@pytest.mark.parametrize(("model_type", "variant"), SUPPORTED)
def test_greedy_matches_transformers(model_type, variant):
    """Batch 1, the second and third prompts (the shortest and the longest: both outputs cross the sliding window
    twice); the first runs at batch 1 with the n-gram drafter in ``test_ngram_drafter``."""
    model = tiny_model(model_type, variant)
    want = reference(model_type, variant)
    got = [_generate(model, [p]).sequences[0] for p in PROMPTS[1:]]
    _check("plain greedy vs transformers", [want[0], *got], want, model)


@pytest.mark.parametrize(("model_type", "variant"), SUPPORTED)
def test_ngram_drafter(model_type, variant):
    """Batch 1, prompt by prompt until the drafter has drafted (the three prompts run with it in a ragged batch in
    ``test_ragged_batch``)."""
    model = tiny_model(model_type, variant)
    want = reference(model_type, variant)
    for row, prompt in enumerate(PROMPTS):
        out = _generate(model, [prompt], NGramDrafter())
        _check("n-gram drafter vs transformers", [*want[:row], *out.sequences], want[: row + 1], model)
        if out.stats.drafted > 0:
            return
    pytest.fail("the n-gram drafter drafted nothing on any prompt: the check is vacuous")


@pytest.mark.parametrize(("model_type", "variant"), SUPPORTED)
def test_self_drafter(model_type, variant):
    model = tiny_model(model_type, variant)
    want = reference(model_type, variant)
    out = _generate(model, PROMPTS, ModelDrafter(model))  # one ragged batch: every row accepts every draft
    _check("self-drafting (ragged batch) vs transformers", out.sequences, want, model)
    assert out.stats.accepted == out.stats.drafted > 0, f"accepted {out.stats.accepted} of {out.stats.drafted} drafted"


@pytest.mark.parametrize(("model_type", "variant"), SUPPORTED)
def test_perturbed_drafter(model_type, variant):
    model = tiny_model(model_type, variant)
    want = reference(model_type, variant)
    out = _generate(model, PROMPTS, ModelDrafter(draft_copy(model_type, variant)))  # rows accept different counts
    _check("perturbed draft model (ragged batch) vs transformers", out.sequences, want, model)
    accepted, drafted = out.stats.accepted, out.stats.drafted
    assert 0 < accepted < drafted, f"accepted {accepted} of {drafted} drafted: want some, not all"


@pytest.mark.parametrize(("model_type", "variant"), SUPPORTED)
def test_ragged_batch(model_type, variant):
    model = tiny_model(model_type, variant)
    want = reference(model_type, variant)  # what each prompt's batch-1 run gives (the tests above check it)
    batch = _generate(model, PROMPTS, NGramDrafter()).sequences
    _check("ragged batch (n-gram) vs transformers' batch-1 output", batch, want, model)


@pytest.mark.parametrize(("model_type", "variant"), REFUSED)
def test_refused(model_type, variant):
    model = tiny_model(model_type, variant)
    names = (model_type, type(model).__name__)
    before = (model.training, model.config._attn_implementation)
    with pytest.raises(UnsupportedModelError) as refused:
        dk.load_model(model)
    assert any(n in str(refused.value) for n in names), f"the refusal does not name the architecture: {refused.value}"
    with pytest.raises(UnsupportedModelError):
        _generate(model, PROMPTS[:1])
    assert (model.training, model.config._attn_implementation) == before  # refused before anything changed


def _bert_masked_lm() -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2))


def _bert_encoder_lm_head() -> torch.nn.Module:
    from transformers import BertConfig, BertLMHeadModel

    torch.manual_seed(0)  # is_decoder=False: bidirectional attention
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, is_decoder=False)
    return BertLMHeadModel(config)


def _t5() -> torch.nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config)


@pytest.mark.parametrize(
    "build", [_bert_masked_lm, _bert_encoder_lm_head, _t5], ids=["bert-masked-lm", "bert-not-decoder", "t5"]
)
def test_non_causal_model_refused(build):
    model = build()
    with pytest.raises(UnsupportedModelError) as refused:
        dk.load_model(model)
    names = (model.config.model_type, type(model).__name__)
    assert any(n in str(refused.value) for n in names), f"the refusal does not name the architecture: {refused.value}"


def test_sweep_tables_name_real_cases():
    ids = {case_id(t, v) for t, v in CASES}
    assert set(EXPECTED) <= ids, sorted(set(EXPECTED) - ids)
    assert set(EXPECTED.values()) <= {"supported", "refused"}


def test_chain_only_model_refuses_token_trees():
    """MPT's ALiBi comes from key slots: exact on chains (the checks above), refused on trees instead of wrong."""
    from tests.unit.test_greedy_equality import DecoyTreeDrafter

    model = tiny_model("mpt", None)
    with pytest.raises(IncompatibleDraftError, match="cannot score token trees"):
        dk.generate(model, PROMPTS[:1], DecoyTreeDrafter(model, depth=2), policy=FixedLength(4), max_new_tokens=4)


def test_supported_models_page_lists_every_case():
    """docs/supported-models.md stays true: each case under the heading of its expected status."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "supported-models.md").read_text()
    supported, refused = page.split("\n## Refused")[0].split("\n## Supported")[1], page.split("\n## Refused")[1]
    refused = refused.split("\n## ")[0]
    for t, v in CASES:
        name = f"`{case_id(t, v)}`"
        expected = EXPECTED.get(case_id(t, v), "supported")
        assert name in (supported if expected == "supported" else refused), f"{name} is not listed as {expected}"
        assert name not in (refused if expected == "supported" else supported), f"{name} is listed twice"
