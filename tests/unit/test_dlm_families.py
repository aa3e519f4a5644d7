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
algorithms, compared with ``DreamRule``. SDAR and Fast-dLLM v2 (block-causal on the absolute grid): ``sdar_forward`` /
``fast_dllm_v2_forward`` are the forwards their ``generate`` drives (Qwen3 / Qwen2 under the mask they build; their
modeling files are published beside the weights only: SDAR's ``generate.py`` @ JetAstra/SDAR c2041a8 and a public
copy of Fast-dLLM v2's ``modeling.py``, Satgoy152/DualDiffusion @ 1aeb3d4), and ``sdar_generate`` /
``fast_dllm_v2_generate`` their ``generate`` loops, compared with ``SDARRule`` / ``FastDLLMv2Rule``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import decodekit as dk
from decodekit.dlm.rules.dream import origin_plan
from decodekit.errors import ConfigError, ModelNotFoundError, UnsupportedModelError
from tests.unit.dlm_common import MASK
from tests.unit.dlm_families import (
    DREAM_CONFIG,
    FAST_DLLM_V2_CONFIG,
    FAST_DLLM_V2_MASK,
    LLADA_CONFIG,
    SDAR_CONFIG,
    dream_forward,
    dream_generate,
    fast_dllm_v2_forward,
    fast_dllm_v2_generate,
    llada_forward,
    sdar_forward,
    sdar_generate,
    write_dream,
    write_fast_dllm_v2,
    write_llada,
    write_sdar,
)
from tests.unit.dlm_llada2 import LLADA2_MASK, write_llada2
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
    with pytest.raises(UnsupportedModelError, match="Dream checkpoint with sliding-window layers"):
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


@pytest.mark.parametrize(("gen", "steps"), [(12, 12), (16, 6)])
def test_dream_origin_draws_the_references_slots(dream, gen, steps):
    """``alg="origin"`` (Dream's default: which slots commit drawn with ``torch.rand``), one block at temperature 0:
    with ``seed=s`` the reference's tokens when its generator is seeded with ``s``, in at most its forwards (steps
    that draw nothing are skipped); another seed commits other slots, so the comparison sees the draws. Two rows
    in one batch draw, row by row, what the reference's flattened batch draws."""
    _, tensors, dlm = dream
    settings = dict(gen_length=gen, block_length=gen, steps=steps)
    rule = dk.build("dlm_rule", "dream", alg="origin")
    forward = lambda x: dream_forward(tensors, DREAM_CONFIG, x)  # noqa: E731
    for seed, prompt in enumerate(ROWS):
        g = torch.Generator().manual_seed(seed)
        want, forwards = dream_generate(forward, prompt, gen, steps, "origin", 262, generator=g)
        out = dk.dlm.generate(dlm, [prompt], rule=rule, seed=seed, **settings)
        assert out.sequences[0] == want and out.stats.nfe <= forwards
        assert dk.dlm.generate(dlm, [prompt], rule=rule, seed=seed + 100, **settings).sequences[0] != want
    rows = dk.dlm.generate(dlm, ROWS[:2], rule=rule, seed=[4, 5], **settings)  # per-row seeds: a row as alone
    assert [rows.sequences[i] for i in (0, 1)] == [
        dk.dlm.generate(dlm, [ROWS[i]], rule=rule, seed=[4 + i], **settings).sequences[0] for i in (0, 1)
    ]
    planned = dk.dlm.generate(dlm, ROWS[:2], rule=rule, seed=[4, 5], cache=dk.build("dlm_cache", "dkv_greedy"),
                              **settings)  # fmt: skip
    assert all(262 not in s for s in planned.sequences)  # the plan it publishes feeds dKV-Cache-Greedy
    plan = origin_plan(torch.ones(2, gen, dtype=torch.bool), steps, 1e-3, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    left, grid = torch.ones(2, gen, dtype=torch.bool), torch.linspace(1, 1e-3, steps + 1)
    for i in range(steps - 1):  # the reference's draw over x[mask_index]: both rows' masked slots, row by row
        hit = torch.zeros_like(left)
        hit[left] = torch.rand(int(left.sum()), generator=g) < 1 - grid[i + 1] / grid[i]
        assert torch.equal(plan == i, hit)
        left &= ~hit
    assert torch.equal(plan == steps - 1, left)


# prompts around SDAR's blocks of 4 and Fast-dLLM v2's of 8: shorter than a block, a tail of 3 (7 % 4, 11 % 8), and
# whole blocks (16: the first generated block opens on an empty slot)
BLOCK_ROWS = [[5, 9, 14, 2, 77, 40, 3], [33, 7, 100], [3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8],
              [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]  # fmt: skip


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    """An SDAR checkpoint (seed 7: its greedy outputs hold a dozen distinct tokens) and the model read from it."""
    path = tmp_path_factory.mktemp("sdar")
    tensors = write_sdar(path, seed=7)
    return path, tensors, dk.dlm.load_model(str(path))


@pytest.fixture(scope="module")
def fast_dllm_v2(tmp_path_factory):
    path = tmp_path_factory.mktemp("fast_dllm_v2")
    tensors = write_fast_dllm_v2(path)
    return path, tensors, dk.dlm.load_model(str(path))


# family -> (config, reference forward, mask id, mask token, shift, block length)
BLOCK_FAMILIES = {
    "sdar": (SDAR_CONFIG, sdar_forward, 127, "<|MASK|>", False, 4),
    "fast_dllm_v2": (FAST_DLLM_V2_CONFIG, fast_dllm_v2_forward, FAST_DLLM_V2_MASK, "|<MASK>|", True, 8),
}


@pytest.mark.parametrize("family", list(BLOCK_FAMILIES))
def test_block_causal_families_read_as_the_references_compute(family, request):
    """Settings from the checkpoint (block size, absolute grid, mask id from the config or the tokenizer, shift);
    the logits of a canvas whose generation starts on a block boundary equal the reference forward under its
    block-causal mask (slot ``j`` at position ``j - 1`` when shifted), and not the same forward without the mask."""
    _, tensors, dlm = request.getfixturevalue(family)
    config, forward, mask, mask_token, shift, block = BLOCK_FAMILIES[family]
    assert (dlm.mask_token_id, dlm.shift_logits, dlm.block_length, dlm.block_grid) == (mask, shift, block, "absolute")
    assert dlm.tokenizer.convert_ids_to_tokens(mask) == mask_token
    ids = torch.tensor([BLOCK_ROWS[2] + BLOCK_ROWS[3]])  # 27 tokens
    length, shift = ids.shape[1], int(shift)
    got, _ = dlm.forward(ids, torch.tensor([length]), torch.tensor([block]), length - block, block_causal=block)
    want = forward(tensors, config, ids)[0, block - shift : length - shift]
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-5)
    causal = forward(tensors, config, ids, causal=True)[0, block - shift : length - shift]
    assert not torch.allclose(got[0], causal, atol=1e-2)


def test_sdar_generates_the_references_tokens(sdar):
    """``block_diffusion_generate`` (its greedy ``top_k=1`` with the sequential strategy; the confidence strategies
    with the argmax and its probability, one commit a step) and ``SDARRule``: the same tokens on every prompt shape,
    uncached and with the exact block cache. Counted from the generation start instead (the grid decodekit's own
    block-causal models use), the tokens differ: the comparison sees the grid."""
    _, tensors, dlm = sdar
    forward = lambda x: sdar_forward(tensors, SDAR_CONFIG, x)  # noqa: E731
    shifted_grid = dk.dlm.DLMModel(dlm.lm, dlm.mask_token_id, block_length=4)
    grid_differs = False
    for strategy, steps, greedy in [("sequential", 2, "top_k"), ("low_confidence_dynamic", 4, "argmax"),
                                    ("low_confidence_static", 4, "argmax")]:  # fmt: skip
        want = [sdar_generate(forward, row, 127, 12, 4, steps, strategy, greedy=greedy) for row in BLOCK_ROWS]
        rule = dk.build("dlm_rule", "sdar", strategy=strategy)
        settings = dict(gen_length=12, block_length=4, steps=3 * steps, rule=rule)
        for cache in (None, dk.build("dlm_cache", "block_causal")):
            assert dk.dlm.generate(dlm, BLOCK_ROWS, cache=cache, **settings).sequences == want, (strategy, cache)
        grid_differs |= dk.dlm.generate(shifted_grid, BLOCK_ROWS, **settings).sequences != want
    assert grid_differs


def test_fast_dllm_v2_generates_the_references_tokens(fast_dllm_v2):
    """Fast-dLLM v2's ``generate`` (temperature 0, no sub-block cache) and ``FastDLLMv2Rule``: the same tokens on
    every prompt shape (a whole-block prompt's first token by the AR step), uncached and with the exact block cache;
    Fast-dLLM's block-wide threshold rule gives other tokens."""
    _, tensors, dlm = fast_dllm_v2
    forward = lambda x: fast_dllm_v2_forward(tensors, FAST_DLLM_V2_CONFIG, x)  # noqa: E731
    threshold_differs = False
    for threshold, small in [(0.9, 8), (0.3, 2), (1.0, 4)]:
        want = [fast_dllm_v2_generate(forward, row, FAST_DLLM_V2_MASK, 16, 8, small, threshold) for row in BLOCK_ROWS]
        rule = dk.build("dlm_rule", "fast_dllm_v2", threshold=threshold, sub_block=small)
        for cache in (None, dk.build("dlm_cache", "block_causal")):
            out = dk.dlm.generate(dlm, BLOCK_ROWS, gen_length=16, block_length=8, steps=16, rule=rule, cache=cache)
            assert out.sequences == want, (threshold, small, cache)
        plain = dk.dlm.generate(dlm, BLOCK_ROWS, gen_length=16, block_length=8, rule=dk.dlm.ThresholdRule(threshold))
        threshold_differs |= plain.sequences != want
    assert threshold_differs


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    """A LLaDA 2 checkpoint (tests/unit/dlm_llada2.py) read with blocks of 8 instead of its 32."""
    path = tmp_path_factory.mktemp("llada2")
    return path, write_llada2(path), dk.dlm.load_model(str(path), block_length=8)


@pytest.mark.parametrize("rule", ["llada", "prophet", "sdar", "fast_dllm_v2"])
@pytest.mark.parametrize(("family", "mask"), [("fast_dllm_v2", FAST_DLLM_V2_MASK), ("llada2", LLADA2_MASK)])
def test_every_rule_runs_on_the_absolute_grid_cached_or_not(family, mask, rule, request):
    """On an absolute-grid model, shifted (Fast-dLLM v2) or a mixture of experts (LLaDA 2), ragged prompts with
    tails carried into the first block: every rule fills every slot; the exact block cache gives the recompute's
    tokens, sampling with per-row seeds too; self-speculative drafts leave the output as it is."""
    dlm = request.getfixturevalue(family)[2]
    settings = dict(gen_length=16, block_length=8, steps=8, temperature=0.7, seed=[3, 4, 5, 6])
    full, cached, drafted = (
        dk.dlm.generate(dlm, BLOCK_ROWS, rule=dk.build("dlm_rule", rule), **settings, **extra)
        for extra in ({}, {"cache": dk.dlm.BlockCausalCache()}, {"draft": dk.dlm.SpiffyDrafts()})
    )
    assert all(len(row) == 16 and mask not in row for row in full.sequences)
    assert cached.sequences == full.sequences and drafted.sequences == full.sequences


@pytest.mark.parametrize(
    ("write", "edit", "match"),
    [
        (write_sdar, {"architectures": ["SDARMoeForCausalLM"], "num_experts": 8}, "SDAR MoE checkpoint"),
        (write_fast_dllm_v2, {"layer_types": ["full_attention", "sliding_attention"]}, "Fast-dLLM v2 checkpoint with "
         "sliding-window layers"),
    ],
)  # fmt: skip
def test_block_causal_families_refuse_what_they_cannot_run(tmp_path, write, edit, match):
    write(tmp_path, BLOCK_FAMILIES[write.__name__.removeprefix("write_")][0] | edit)
    with pytest.raises(UnsupportedModelError, match=match):
        dk.dlm.load_model(str(tmp_path))


@pytest.mark.parametrize("write", [write_dream, write_sdar, write_fast_dllm_v2])
def test_a_qwen_config_with_yarn_rope_scaling_loads_with_its_tokenizer(tmp_path, write):
    """Qwen's long-context YaRN entry made transformers' generic config fail inside AutoTokenizer (an AttributeError
    decodekit did not catch); the tokenizer now comes from its own files."""
    config = {"dream": DREAM_CONFIG, "sdar": SDAR_CONFIG, "fast_dllm_v2": FAST_DLLM_V2_CONFIG}
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    write(tmp_path, config[write.__name__.removeprefix("write_")] | {"rope_scaling": yarn})
    dlm = dk.dlm.load_model(str(tmp_path))
    assert dlm.tokenizer is not None and dlm.lm.hf.config.rope_parameters["rope_type"] == "yarn"


def test_a_release_with_float32_norms_beside_bfloat16_matrices_runs_in_one_dtype(tmp_path):
    """Each tensor kept its own dtype, and the first forward failed deep in torch (``mat1 and mat2 must have the same
    dtype``); the model now takes the dtype most of its weights have on disk."""
    from safetensors.torch import save_file

    tensors = write_dream(tmp_path)
    save_file({k: v if "norm" in k else v.bfloat16() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    dlm = dk.dlm.load_model(str(tmp_path))
    assert {p.dtype for p in dlm.lm.hf.parameters()} == {torch.bfloat16}
    out = dk.dlm.generate(dlm, ROWS[:1], gen_length=4, block_length=4, steps=4)
    assert len(out.sequences[0]) == 4


def test_llada2_keeps_its_router_in_float32_as_transformers_does(tmp_path):
    """GLM-4 MoE's ``_keep_in_fp32_modules_strict`` (the router's weight and score bias), as LLaDA 2's own code
    computes the router in float32, whatever dtype the rest takes."""
    write_llada2(tmp_path)
    dlm = dk.dlm.load_model(str(tmp_path), dtype="bfloat16")
    dtypes = {name: t.dtype for name, t in dlm.lm.hf.state_dict().items()}
    router = [n for n in dtypes if n.endswith(("mlp.gate.weight", "e_score_correction_bias"))]
    assert router and all(dtypes[n] == torch.float32 for n in router)
    assert dtypes["model.embed_tokens.weight"] == torch.bfloat16
