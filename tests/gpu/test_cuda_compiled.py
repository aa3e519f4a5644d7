"""``compile=True`` on a GPU (skipped without CUDA): CUDA-graph replays (torch.compile's ``reduce-overhead``) give the
eager CUDA tokens for plain decoding, chains, trees and a draft model, with rows stopping apart, for sliding-window
layers, for the diffusion half's caches, and the EAGLE head's draft steps; a later call with other prompt lengths
compiles nothing. Not run yet (no GPU was lent when it was written): a GPU session runs ``bash .ci/gpu prepare`` here
and ``bash .ci/gpu run`` on the device (these tests and the compiled loop's speed on SmolLM2-135M's shape); with
SmolLM2 installed (a machine with network), ``python -m decodekit bench experiment=compiled_gpu`` and ``python -m
decodekit dlm-bench experiment=compiled device=cuda``."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import decodekit as dk
from decodekit.drafters.model_tree import ModelTreeDrafter
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_compiled_equals_eager_on_cuda(ragged_prompts):
    target = dk.load_model(tiny_llama(0, layers=3), device="cuda")
    draft = dk.load_model(perturbed(tiny_llama(0, layers=3), 0.2, seed=1), device="cuda")
    cases = [
        (None, {}),
        (dk.drafters.NGramDrafter(), {}),
        (dk.drafters.ModelDrafter(draft), dict(temperature=1.0, seed=[1, 2, 3, 4], eos_token_id=7)),
        (ModelTreeDrafter(draft, shape="iid", branches=2, temperature=1.0), dict(temperature=0.8, seed=3)),
        (dk.drafters.EarlyExitDrafter(1), {}),  # a partial forward: its own graph over the first layer
    ]
    for drafter, kwargs in cases:
        kwargs = {"eos_token_id": (), **kwargs}
        eager = dk.generate(target, ragged_prompts, drafter, policy=FixedLength(3), max_new_tokens=24, **kwargs)
        compiled = dk.generate(
            target, ragged_prompts, drafter, policy=FixedLength(3), max_new_tokens=24, compile=True, **kwargs
        )
        assert compiled.sequences == eager.sequences, type(drafter).__name__
    graphs = counters["stats"]["unique_graphs"]
    others = [p[:3] + p for p in ragged_prompts]
    out = dk.generate(target, others, dk.drafters.NGramDrafter(), max_new_tokens=20, eos_token_id=(), compile="auto")
    assert (
        out.sequences
        == dk.generate(target, others, dk.drafters.NGramDrafter(), max_new_tokens=20, eos_token_id=()).sequences
    )
    assert counters["stats"]["unique_graphs"] == graphs  # "auto" is on for CUDA; nothing new compiled


def test_sliding_window_layers_compiled_on_cuda(ragged_prompts):
    """Qwen2 with a windowed layer beside full ones: the masks per layer type stacked as planes, CUDA graphs."""
    from tests.unit.test_lean_forward import WINDOWED, family_model

    family, overrides = WINDOWED["qwen2-window"]
    model = dk.load_model(family_model(family, **overrides), device="cuda")
    for drafter in (None, dk.drafters.SuffixDrafter(cache_tokens=0)):
        eager = dk.generate(model, ragged_prompts, drafter, max_new_tokens=16, eos_token_id=())
        compiled = dk.generate(model, ragged_prompts, drafter, max_new_tokens=16, eos_token_id=(), compile=True)
        assert compiled.sequences == eager.sequences


def test_eagle_head_steps_compiled_on_cuda(ragged_prompts, tmp_path):
    """The EAGLE head's draft steps as CUDA graphs (its own cache, chains and EAGLE-2 trees): the drafts eager gives
    (the same accepted counts per position), the target's tokens."""
    from decodekit.drafters.eagle import EagleDrafter, EagleHead
    from decodekit.drafters.head_files import head_metadata

    target = dk.load_model(tiny_llama(0, layers=3), device="cuda")
    torch.manual_seed(0)
    head = EagleHead(target.hf.config)
    head.init_from(dk.load_model(tiny_llama(0, layers=3)))
    head.save(tmp_path / "head.safetensors", head_metadata(target, base="tiny"))
    for drafter, policy in (
        (EagleDrafter(tmp_path / "head.safetensors"), FixedLength(3)),
        (EagleDrafter(tmp_path / "head.safetensors", shape="dynamic", top_k=2), FixedLength(6, depth=3)),
    ):
        eager = dk.generate(target, ragged_prompts, drafter, policy=policy, max_new_tokens=24, eos_token_id=())
        compiled = dk.generate(
            target, ragged_prompts, drafter, policy=policy, max_new_tokens=24, eos_token_id=(), compile=True
        )
        assert compiled.sequences == eager.sequences
        assert compiled.stats.acceptance_rate_per_pos == eager.stats.acceptance_rate_per_pos
        assert "default" in drafter.head._static._compiled


def test_dlm_compiled_equals_eager_on_cuda():
    """The diffusion half under CUDA graphs: the recompute, dual, dKV and block-causal caches (Spiffy drafts on the
    last), greedy, compiled = eager; a second call with other prompt lengths compiles nothing."""
    dlm = dk.dlm.load_model(tiny_llama(3, init=0.6), mask_token_id=127, device="cuda")
    caches = [
        {},
        {"cache": dk.build("dlm_cache", "dual")},
        {"cache": dk.build("dlm_cache", "dkv", refresh=3)},
        {"cache": dk.build("dlm_cache", "block_causal"), "draft": dk.build("dlm_draft", "spiffy")},
    ]
    settings = dict(gen_length=32, block_length=8, steps=32)
    for prompts in ([[5, 6, 7, 8, 9], [10, 11, 12]], [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]):
        graphs = counters["stats"]["unique_graphs"]
        for parts in caches:
            eager = dk.dlm.generate(dlm, prompts, **parts, **settings)
            compiled = dk.dlm.generate(dlm, prompts, **parts, compile=True, **settings)
            assert compiled.sequences == eager.sequences, parts
    assert counters["stats"]["unique_graphs"] == graphs  # the second prompt set compiled nothing
