"""Published diffusion-LM checkpoints read from their authors' on-disk layouts (``decodekit.dlm.families``), on tiny
random checkpoints written in each layout (``tests/unit/dlm_families.py``), against ports of the families' reference
code: the same logits, the reference ``generate``'s tokens at temperature 0, every layout the releases use, and a
clear error for what decodekit does not implement. The checkpoints' own code files raise when imported.

LLaDA: ``llada_forward`` transcribes ``modeling_llada.py`` (NVlabs/Fast-dLLM @ 24cc59e, the non-cached forward of
LLaDA's release); on these checkpoints it gave exactly that file's logits (difference 0.0 in float32, checked once
with the file at hand; it is not installed here). LLaDA's ``generate`` (low-confidence remasking, float64
confidences) is ``test_dlm_reference.fast_dllm`` without a cache. Dream: ``dream_forward`` transcribes
``modeling_dream.py`` (the same commit; SDPA attention, no cache), checked the same way; ``dream_generate``
transcribes ``diffusion_generate``'s ``_sample`` (``generation_utils.py``, the same commit) for its deterministic
algorithms, compared with ``DreamRule``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import decodekit as dk
from decodekit.errors import ConfigError, ModelNotFoundError, UnsupportedModelError
from tests.unit.dlm_common import MASK
from tests.unit.dlm_families import (
    DREAM_CONFIG,
    LLADA_CONFIG,
    dream_forward,
    dream_generate,
    llada_forward,
    write_dream,
    write_llada,
)
from tests.unit.test_dlm_reference import fast_dllm

ROWS = [[5, 9, 14, 2, 77, 40, 3], [33, 7, 100]]  # a ragged batch: decodekit pads, the reference runs each row alone


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    """A LLaDA checkpoint (one safetensors file), its tensors, and the model decodekit reads from it."""
    path = tmp_path_factory.mktemp("llada")
    tensors = write_llada(path)
    return path, tensors, dk.dlm.load_model(str(path))


def canvas_logits(dlm, rows: list[list[int]], start: int = 0) -> list[torch.Tensor]:
    """decodekit's logits for slots ``start ..`` of each row (slot ``j`` at position ``j``, or ``j - 1`` on a shifted
    model), the rows in one padded batch: ``[L_b - start, V]`` per row."""
    width = max(map(len, rows))
    canvas = torch.full((len(rows), width), dlm.mask_token_id)
    for b, row in enumerate(rows):
        canvas[b, : len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(r) for r in rows])
    logits, _ = dlm.forward(canvas, lengths, torch.full_like(lengths, start), width - start)
    return [logits[b, : len(row) - start] for b, row in enumerate(rows)]


def test_llada_reads_as_the_reference_computes(llada):
    path, tensors, dlm = llada
    assert (dlm.mask_token_id, dlm.shift_logits, dlm.block_length) == (MASK, False, None)  # 127, the ports' mask
    assert dlm.vocab_size == LLADA_CONFIG["embedding_size"] and dlm.tokenizer.convert_ids_to_tokens(5) == "w5"
    for row, got in zip(ROWS, canvas_logits(dlm, ROWS)):
        want = llada_forward(tensors, LLADA_CONFIG, torch.tensor([row]))[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        causal = llada_forward(tensors, LLADA_CONFIG, torch.tensor([row]), causal=True)[0]
        assert not torch.allclose(got, causal, atol=1e-2)  # the comparison sees the attention direction


class Reference:
    """LLaDA's forward (the port) called as ``test_dlm_reference``'s samplers call a model."""

    def __init__(self, tensors: dict) -> None:
        self.tensors = tensors

    def __call__(self, input_ids, position_ids, attention_mask, cache):
        assert torch.equal(position_ids[0], torch.arange(input_ids.shape[1]))  # the whole canvas, as LLaDA runs it
        return SimpleNamespace(logits=llada_forward(self.tensors, LLADA_CONFIG, input_ids))


@pytest.mark.parametrize(("gen", "block", "steps"), [(12, 12, 12), (12, 4, 6)])
def test_llada_generates_the_references_tokens(llada, gen, block, steps):
    """LLaDA's ``generate`` (temperature 0, low-confidence remasking) on the reference forward, and decodekit's
    baseline on the checkpoint it read: the same tokens, row by row."""
    _, tensors, dlm = llada
    out = dk.dlm.generate(dlm, ROWS, gen_length=gen, block_length=block, steps=steps)
    for row, got in zip(ROWS, out.sequences):
        assert got == fast_dllm(Reference(tensors), row, gen, block, steps)[0]


def test_llada_runs_fast_dllms_dual_cache_as_its_authors_do(llada):
    """A Fast-dLLM rule and cache on the read model: the reference's threshold rule with its dual cache, ported, on
    the same transformers model."""
    _, _, dlm = llada
    rule, cache = dk.build("dlm_rule", "threshold", threshold=0.9), dk.build("dlm_cache", "dual")
    out = dk.dlm.generate(dlm, ROWS[:1], gen_length=12, block_length=4, steps=12, rule=rule, cache=cache)
    assert out.sequences[0] == fast_dllm(dlm.lm.hf, ROWS[0], 12, 4, 12, cache="dual", threshold=0.9)[0]


@pytest.mark.parametrize("layout", ["shards", "bin", "tied"])
def test_llada_layouts(tmp_path, layout):
    """Sharded safetensors with their index, ``pytorch_model.bin`` (read with ``weights_only=True``), and a tied
    output layer (``weight_tying``: no ``transformer.ff_out``) read as the single file does."""
    config = dict(LLADA_CONFIG, weight_tying=layout == "tied")
    tensors = write_llada(tmp_path, config, layout="safetensors" if layout == "tied" else layout, seed=5)
    dlm = dk.dlm.load_model(str(tmp_path))
    got = canvas_logits(dlm, ROWS[:1])[0]
    torch.testing.assert_close(got, llada_forward(tensors, config, torch.tensor(ROWS[:1]))[0], atol=1e-4, rtol=1e-5)


def test_llada_arguments_replace_the_checkpoints_settings(llada):
    path, _, _ = llada
    dlm = dk.dlm.load_model(str(path), mask_token_id=126, dtype="bfloat16")
    assert dlm.mask_token_id == 126 and next(dlm.lm.hf.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        ({"block_type": "sequential"}, UnsupportedModelError, "LLaDA checkpoint with block_type='sequential'"),
        ({"alibi": True, "rope": False}, UnsupportedModelError, "rope=False"),
        ({"include_qkv_bias": True}, UnsupportedModelError, "include_qkv_bias=True"),
        ({"n_layers": 3}, ConfigError, "'model.transformer.blocks.2.attn_norm.weight' is missing"),
        ({"mlp_hidden_size": 40}, ConfigError, r"ff_proj.weight' has shape \(48, 32\), its config.json implies"),
    ],
)
def test_llada_refuses_what_it_cannot_run(tmp_path, edit, error, match):
    write_llada(tmp_path, LLADA_CONFIG)
    (tmp_path / "config.json").write_text(json.dumps(LLADA_CONFIG | edit))
    with pytest.raises(error, match=match):
        dk.dlm.load_model(str(tmp_path))


def test_llada_without_weights_says_what_it_looked_for(tmp_path):
    write_llada(tmp_path, LLADA_CONFIG)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match="expected model.safetensors, pytorch_model.bin"):
        dk.dlm.load_model(str(tmp_path))


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    path = tmp_path_factory.mktemp("dream")
    tensors = write_dream(path)
    return path, tensors, dk.dlm.load_model(str(path))


def test_dream_reads_as_the_reference_computes_with_shifted_slots(dream):
    """Slot ``j``'s logits are the reference's output at position ``j - 1``; the tokenizer is Dream's BPE read
    without its own class."""
    _, tensors, dlm = dream
    assert (dlm.mask_token_id, dlm.shift_logits, dlm.block_length) == (262, True, None)
    assert dlm.tokenizer.convert_ids_to_tokens(262) == "<|mask|>"
    assert dlm.tokenizer("def the")["input_ids"] == [260, 258]  # the merges: "def", " the"
    for row, got in zip(ROWS, canvas_logits(dlm, ROWS, start=1)):  # slots 1.. read positions 0..
        want = dream_forward(tensors, DREAM_CONFIG, torch.tensor([row]))[0, : len(row) - 1]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        causal = dream_forward(tensors, DREAM_CONFIG, torch.tensor([row]), causal=True)[0, : len(row) - 1]
        assert not torch.allclose(got, causal, atol=1e-2)


def test_dream_refuses_a_sliding_window(tmp_path):
    write_dream(tmp_path, DREAM_CONFIG | {"use_sliding_window": True})
    with pytest.raises(UnsupportedModelError, match="Dream checkpoint with use_sliding_window=True"):
        dk.dlm.load_model(str(tmp_path))


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize(("gen", "steps"), [(12, 12), (16, 6)])
def test_dream_generates_the_references_tokens(dream, alg, gen, steps):
    """``diffusion_generate`` at temperature 0 on the reference forward, and ``DreamRule`` on the checkpoint decodekit
    read (one block, as Dream samples): the same tokens; decodekit skips the steps that commit nothing."""
    _, tensors, dlm = dream
    settings = dict(gen_length=gen, block_length=gen, steps=steps)
    llada_differs = False
    for prompt in ROWS:
        want, forwards = dream_generate(lambda x: dream_forward(tensors, DREAM_CONFIG, x), prompt, gen, steps, alg, 262)
        out = dk.dlm.generate(dlm, [prompt], rule=dk.build("dlm_rule", "dream", alg=alg), **settings)
        assert out.sequences[0] == want and out.stats.nfe <= forwards
        llada_differs |= dk.dlm.generate(dlm, [prompt], **settings).sequences[0] != want
    assert llada_differs  # the comparison sees the schedule: LLaDA's rule commits other slots
