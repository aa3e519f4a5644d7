"""The loop on a GPU (skipped without CUDA): same greedy output as on the CPU, seeded sampling reproducible."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.models.tiny import perturbed, tiny_llama

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_greedy_on_cuda_matches_cpu(ragged_prompts):
    cpu_target = tiny_llama(0)
    draft = perturbed(cpu_target, 0.3, seed=1)
    expected = dk.generate(cpu_target, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    target = dk.load_model(tiny_llama(0), device="cuda")
    for drafter in (None, dk.drafters.NGramDrafter(), dk.drafters.ModelDrafter(dk.load_model(draft, device="cuda"))):
        out = dk.generate(target, ragged_prompts, drafter, max_new_tokens=24, eos_token_id=())
        assert out.sequences == expected
        assert out.stats.verify_time_s > 0


def test_seeded_sampling_on_cuda(ragged_prompts):
    target = dk.load_model(tiny_llama(0), device="cuda")
    draft = dk.drafters.ModelDrafter(dk.load_model(perturbed(tiny_llama(0), 0.3, seed=1), device="cuda"))

    def run(seed):
        return dk.generate(target, ragged_prompts, draft, temperature=1.0, max_new_tokens=16, seed=seed).sequences

    assert run(5) == run(5)


def test_timings_and_round_record_on_cuda(ragged_prompts):
    """CUDA-event timings: totals without per-phase syncs, exact per-round times for a component that needs them."""
    target = dk.load_model(tiny_llama(0), device="cuda")
    seen = []

    class Timed(dk.policies.FixedLength):
        needs = frozenset({"timings", "target_probs", "hidden"})

        def observe(self, state, round):
            seen.append((round.draft_time_s, round.verify_time_s, round.target_probs.device, round.hidden.device))

    out = dk.generate(target, ragged_prompts, dk.drafters.NGramDrafter(), policy=Timed(3), max_new_tokens=16)
    assert out.stats.prefill_time_s > 0 and out.stats.verify_time_s > 0
    assert all(d >= 0 and v > 0 and p.type == "cuda" and h.type == "cuda" for d, v, p, h in seen)
    plain = dk.generate(target, ragged_prompts, dk.drafters.NGramDrafter(), max_new_tokens=16)
    assert plain.stats.verify_time_s > 0  # read a round late from CUDA events
