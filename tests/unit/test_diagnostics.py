"""Exactness diagnostics: the first differing token is found, the target's margin there is recomputed exactly as a
plain transformers forward gives it, and a float near-tie is told apart from a bug."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import decodekit as dk
from decodekit.errors import ConfigError, EmptyPromptError
from decodekit.models.tiny import tiny_llama
from decodekit.spec.diagnostics import NEAR_TIE_ULPS, first_divergence, first_divergences, logit_ulp

PROMPT = [5, 6, 7, 8, 5, 6]
OTHER = [1, 2, 3]


@pytest.fixture(scope="module")
def hf() -> torch.nn.Module:
    return tiny_llama(0)


@pytest.fixture(scope="module")
def greedy(hf) -> list[int]:
    return dk.generate(dk.load_model(hf), [PROMPT], max_new_tokens=12).sequences[0]


def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """``[V]`` next-token logits from a plain transformers forward, no decodekit involved."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1]


def replaced(tokens: list[int], position: int, token: int) -> list[int]:
    return tokens[:position] + [token] + tokens[position + 1 :]


def tie_with(hf: torch.nn.Module, a: int, b: int) -> torch.nn.Module:
    """A copy of ``hf`` whose output head gives token ``b`` exactly token ``a``'s logit everywhere."""
    model = copy.deepcopy(hf)
    with torch.no_grad():
        model.lm_head.weight[b] = model.lm_head.weight[a]
    return model


def test_equal_outputs_and_prefixes_are_not_divergences(hf, greedy):
    assert first_divergence(hf, PROMPT, greedy, greedy) is None
    assert first_divergence(hf, PROMPT, greedy, greedy[:5]) is None  # candidate stopped early (EOS, length)
    assert first_divergence(hf, PROMPT, greedy[:5], greedy) is None
    assert first_divergence(hf, PROMPT, [], greedy) is None


@pytest.mark.parametrize("k", [0, 4])
def test_a_replaced_token_is_a_mismatch_at_its_position(hf, greedy, k):
    direct = hf_logits(hf, PROMPT + greedy[:k])  # [V]
    worst = int(direct.argmin())
    d = first_divergence(hf, PROMPT, greedy, replaced(greedy, k, worst))
    assert d is not None and d.position == k
    assert (d.reference_token, d.candidate_token) == (greedy[k], worst)
    top = direct.topk(2)
    assert d.top_tokens == tuple(top.indices.tolist()) and d.top_tokens[0] == greedy[k]
    assert d.top_logits == pytest.approx(top.values.tolist(), abs=1e-5)
    assert d.margin == pytest.approx((top.values[0] - top.values[1]).item(), abs=1e-5)
    assert d.candidate_logit == pytest.approx(direct[worst].item(), abs=1e-5)
    assert d.reference_logit == d.top_logits[0]
    assert d.dtype == "float32" and d.ulp == logit_ulp(direct.abs().max().item(), torch.float32)
    assert d.tolerance == NEAR_TIE_ULPS.get(torch.float32, 256.0) * d.ulp
    assert d.verdict == "mismatch" and d.suspect == "candidate"
    assert f"token {k}:" in str(d) and "MISMATCH" in str(d) and "\n" not in str(d)


def test_the_side_that_left_the_top_is_named(hf, greedy):
    wrong = replaced(greedy, 2, int(hf_logits(hf, PROMPT + greedy[:2]).argmin()))
    d = first_divergence(hf, PROMPT, wrong, greedy)  # the reference is the one off
    assert d.verdict == "mismatch" and d.suspect == "reference"
    assert d.to_dict()["suspect"] == "reference" and d.to_dict()["top_tokens"] == list(d.top_tokens)


def test_an_exact_tie_is_a_near_tie(hf, greedy):
    a = greedy[3]
    b = max(set(range(hf.config.vocab_size)) - set(PROMPT) - set(greedy))  # never chosen, never an input
    model = tie_with(hf, a, b)
    reference = dk.generate(dk.load_model(model), [PROMPT], max_new_tokens=12).sequences[0]
    k = next(i for i, t in enumerate(reference) if t in (a, b))  # the first place the tie decides
    other = a + b - reference[k]
    d = first_divergence(model, PROMPT, reference, replaced(reference, k, other))
    assert d is not None and d.position == k and set(d.top_tokens) == {a, b}
    assert d.margin <= d.tolerance and d.candidate_logit == pytest.approx(d.reference_logit, abs=d.tolerance)
    assert d.verdict == "near_tie" and d.suspect is None
    assert "near-tie" in str(d)


def test_the_window_is_in_ulps_of_the_logit_scale(hf, greedy):
    k = max(range(len(greedy)), key=lambda i: float(hf_logits(hf, PROMPT + greedy[:i]).topk(2).values.diff().abs()))
    second = int(hf_logits(hf, PROMPT + greedy[:k]).topk(2).indices[1])
    candidate = replaced(greedy, k, second)
    d = first_divergence(hf, PROMPT, greedy, candidate)
    assert d.verdict == "mismatch" and d.margin > d.tolerance
    wide = first_divergence(hf, PROMPT, greedy, candidate, near_tie=2 * d.margin / d.ulp)
    assert wide.verdict == "near_tie" and wide.tolerance == pytest.approx(2 * d.margin)


def test_logit_ulp_is_the_dtype_grid_spacing():
    assert logit_ulp(20.0, torch.bfloat16) == 0.125
    assert logit_ulp(-20.0, torch.float32) == 2.0**-19
    assert logit_ulp(1.0, torch.float16) == torch.finfo(torch.float16).eps
    assert logit_ulp(0.0, torch.float32) == torch.finfo(torch.float32).eps


def test_bf16_targets_are_judged_on_the_bf16_grid(hf, greedy):
    model = copy.deepcopy(hf).to(torch.bfloat16)
    reference = dk.generate(dk.load_model(model), [PROMPT], max_new_tokens=6).sequences[0]
    worst = int(hf_logits(model, PROMPT + reference[:1]).argmin())
    d = first_divergence(model, PROMPT, reference, replaced(reference, 1, worst))
    assert d.dtype == "bfloat16" and d.tolerance == NEAR_TIE_ULPS[torch.bfloat16] * d.ulp
    assert math.log2(d.ulp / torch.finfo(torch.bfloat16).eps).is_integer() and d.verdict == "mismatch"


def test_batch_helper_returns_one_result_per_row(hf, greedy):
    model = dk.load_model(hf)
    other = dk.generate(model, [OTHER], max_new_tokens=8).sequences[0]
    bad = replaced(other, 5, int(hf_logits(hf, OTHER + other[:5]).argmin()))
    out = first_divergences(model, [PROMPT, OTHER, OTHER], [greedy, other, other], [greedy, bad, other[:3]])
    assert out[0] is None and out[2] is None
    assert out[1].position == 5 and out[1].verdict == "mismatch"
    assert out[1] == first_divergence(hf, OTHER, other, bad)  # batch rows are computed alone, at batch 1


def test_bad_input_fails_with_a_message(hf, greedy):
    with pytest.raises(ConfigError, match="one reference and one candidate per prompt"):
        first_divergences(hf, [PROMPT], [greedy, greedy], [greedy])
    with pytest.raises(EmptyPromptError):
        first_divergence(hf, [], greedy, replaced(greedy, 0, greedy[0] + 1))
