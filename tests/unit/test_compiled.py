"""``dk.generate(..., compile=True)``: static-shape compiled forwards (decodekit.models.compiled) give eager's tokens,
greedy and sampled, for chains, trees, a draft model and ragged rows that finish apart; later calls with other prompt
lengths compile nothing; what cannot compile runs eager with one warning naming why."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import decodekit as dk
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.errors import ConfigError
from decodekit.models.compile_switch import capacity_bucket, width_bucket
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength


@pytest.fixture(scope="module")
def llama():
    return dk.load_model(tiny_llama(0, layers=3))


@pytest.fixture(scope="module")
def draft_model(llama):
    """A noisy deep copy of the target, made after the target has compiled (the copy must compile its own step:
    a copied adapter once ran the original's compiled forward, with the original's weights)."""
    dk.generate(llama, [[1, 2, 3]], max_new_tokens=3, compile=True)
    return dk.load_model(perturbed(llama.hf, 0.2, seed=1))


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _both(model, prompts, drafter=None, verifier=None, policy=None, **kwargs):
    """The eager and the compiled output of the same call, each from fresh components (a suffix cache or a
    recycling matrix remembers earlier calls: its drafts, and so a sampled output, would differ)."""

    def fresh():
        for component in (drafter, verifier, policy):
            if callable(getattr(component, "clear", None)):
                component.clear()

    fresh()
    eager = dk.generate(model, prompts, drafter, verifier, policy, **kwargs)
    fresh()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="compile=True")  # a covered model compiles: no fallback
        compiled = dk.generate(model, prompts, drafter, verifier, policy, compile=True, debug=True, **kwargs)
    return eager, compiled


def test_buckets():
    assert [width_bucket(n) for n in (1, 2, 3, 5, 9, 17, 33, 64, 65)] == [1, 2, 4, 8, 16, 32, 64, 64, None]
    assert capacity_bucket(10) == 256 and capacity_bucket(192) == 256 and capacity_bucket(193) == 512


def test_plain_and_chain_drafts_equal_eager_and_later_calls_compile_nothing(llama, ragged_prompts):
    eager, compiled = _both(llama, ragged_prompts, max_new_tokens=20, eos_token_id=())
    assert compiled.sequences == eager.sequences
    drafter = dk.drafters.NGramDrafter()
    eager, compiled = _both(llama, ragged_prompts, drafter, policy=FixedLength(3), max_new_tokens=24, eos_token_id=())
    assert compiled.sequences == eager.sequences and compiled.stats.accepted > 0  # drafts of several widths ran
    graphs = _graphs()
    assert graphs > 0  # something was compiled
    others = [[3, 1, 4, 1, 5, 9, 2, 6][: n + 1] for n in range(1, 8, 2)]  # other prompt lengths and batch sizes
    for prompts in (others, others[:1], others[1:3], [[2, 7, 1, 8, 2, 8, 1, 8, 2, 8]]):
        eager, compiled = _both(llama, prompts, drafter, policy=FixedLength(5), max_new_tokens=18, eos_token_id=())
        assert compiled.sequences == eager.sequences
    assert _graphs() == graphs  # nothing new compiled (a batch of one's graphs were compiled up front)


def test_rows_that_stop_apart_and_a_draft_model_sampled_equal_eager(llama, draft_model, ragged_prompts):
    eos = 7  # rows end at different rounds: the batch compacts under the compiled step
    eager, compiled = _both(
        llama,
        ragged_prompts,
        dk.drafters.ModelDrafter(draft_model),
        policy=FixedLength(3),
        max_new_tokens=30,
        eos_token_id=eos,
        temperature=1.0,
        seed=[1, 2, 3, 4],
    )
    assert compiled.sequences == eager.sequences
    assert {len(s) for s in eager.sequences} != {30}  # some row did stop at the EOS


def test_tree_drafts_equal_eager(llama, draft_model, ragged_prompts):
    from decodekit.drafters.model_tree import ModelTreeDrafter

    drafter = ModelTreeDrafter(draft_model, shape="iid", branches=2, temperature=1.0)
    for temperature in (0.0, 0.8):
        eager, compiled = _both(
            llama,
            ragged_prompts,
            drafter,
            policy=FixedLength(3),
            max_new_tokens=16,
            eos_token_id=(),
            temperature=temperature,
            seed=5,
        )
        assert compiled.sequences == eager.sequences and compiled.stats.accepted > 0


def test_what_cannot_compile_runs_eager_with_one_warning(llama, ragged_prompts):
    from tests.archs import tiny_model

    gpt2 = dk.load_model(tiny_model("gpt2"))
    reference = dk.generate(gpt2, ragged_prompts, max_new_tokens=6, eos_token_id=())
    with pytest.warns(
        UserWarning, match="compile=True: GPT2LMHeadModel is not run by decodekit's compiled forward"
    ) as w:
        out = dk.generate(gpt2, ragged_prompts, max_new_tokens=6, eos_token_id=(), compile=True)
    assert out.sequences == reference.sequences
    assert sum("compile=True" in str(r.message) for r in w) == 1  # once a call, not once a forward


def test_early_exit_drafts_compile_to_eager_drafts(llama, ragged_prompts):
    """An early-exit drafter's partial forwards (the first layers) run compiled, a graph per exit layer, writing only
    the layers they run: the same drafts as eager (the same accepted counts per position, not only the target's
    tokens), without a warning. Layer-skipping forwards (a searched set each) run eager with one warning."""
    import warnings

    from decodekit.drafters import LayerSkipDrafter

    for make in (lambda: EarlyExitDrafter(1),):
        kwargs = dict(policy=FixedLength(3), max_new_tokens=12, eos_token_id=())
        eager = dk.generate(llama, ragged_prompts, make(), **kwargs)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="compile=True")
            compiled = dk.generate(llama, ragged_prompts, make(), **kwargs, compile=True)
        assert compiled.sequences == eager.sequences
        assert compiled.stats.acceptance_rate_per_pos == eager.stats.acceptance_rate_per_pos
        assert compiled.stats.accepted == eager.stats.accepted > 0
    reference = dk.generate(llama, ragged_prompts, LayerSkipDrafter(search_rounds=0), max_new_tokens=8)
    with pytest.warns(UserWarning, match="layer-skipping forwards"):
        out = dk.generate(llama, ragged_prompts, LayerSkipDrafter(search_rounds=0), max_new_tokens=8, compile=True)
    assert out.sequences == reference.sequences


def test_max_autotune_freezes_the_weights_and_recompiles_when_they_change(ragged_prompts, monkeypatch):
    """``compile="max-autotune"``: the weights are frozen into the compiled step (on the CPU its linear layers run
    as inductor's C++ GEMM templates); the same tokens as eager, and a weight updated in place after the compile
    is seen (the step compiles again) instead of the frozen copy running silently. Here the GEMMs are the packed
    ATen ones (the C++ templates compile for minutes on a 2-core machine; the benchmark's greedy-match column
    checks them on SmolLM2, docs/benchmarks.md); the freezing is the same."""
    from decodekit.models import compiled

    monkeypatch.setitem(compiled.CPU_AUTOTUNE, "max_autotune_gemm_backends", "ATEN")
    model = dk.load_model(tiny_llama(5, layers=2))
    prompts, kwargs = ragged_prompts[:1], dict(max_new_tokens=12, eos_token_id=())  # one row: no one-row graphs
    drafter = dk.drafters.NGramDrafter()
    eager = dk.generate(model, prompts, drafter, policy=FixedLength(3), **kwargs)
    tuned = dk.generate(model, prompts, drafter, policy=FixedLength(3), compile="max-autotune", **kwargs)
    assert tuned.sequences == eager.sequences and "max-autotune" in model._static._compiled
    before = dk.generate(model, prompts, **kwargs).sequences
    with torch.no_grad():
        model.hf.model.layers[0].mlp.down_proj.weight.mul_(-3.0)  # in place: same tensor, a new version
    changed = dk.generate(model, prompts, **kwargs).sequences
    assert changed != before  # the update matters: the frozen copy would give the old tokens
    assert dk.generate(model, prompts, compile="max-autotune", **kwargs).sequences == changed
    weight = model.hf.model.layers[1].mlp.up_proj.weight
    version = weight._version
    weight.data = weight.data * -2.0  # a loader's or LoRA merge's swap: the same Parameter at the same version
    assert weight._version == version
    swapped = dk.generate(model, prompts, **kwargs).sequences
    assert swapped != changed and dk.generate(model, prompts, compile="max-autotune", **kwargs).sequences == swapped


def test_one_model_compiles_more_kinds_of_forward_than_dynamos_default_limit(ragged_prompts, monkeypatch):
    """A model shared by a few drafters needs more graphs than dynamo's ``recompile_limit`` (8; past it a step runs
    eager in silence): the compiled step raises the limit for itself. Shown with the limit lowered to 1, which a
    batched call's two graphs (its rows, and one row alone) already pass."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    model = dk.load_model(tiny_llama(7, layers=2))
    before = _graphs()
    dk.generate(model, ragged_prompts, max_new_tokens=4, eos_token_id=(), compile=True)
    assert _graphs() - before == 2


def test_compile_argument_is_checked_and_auto_is_eager_on_the_cpu(llama):
    with pytest.raises(ConfigError, match="compile"):
        dk.generate(llama, [[1, 2]], max_new_tokens=2, compile="yes")
    graphs = _graphs()
    model = dk.load_model(tiny_llama(3))  # a fresh adapter: compiling it would add graphs
    out = dk.generate(model, [[1, 2, 3]], max_new_tokens=6, compile="auto")
    assert out.sequences == dk.generate(model, [[1, 2, 3]], max_new_tokens=6).sequences
    assert _graphs() == graphs and torch.device(model.device).type == "cpu"


def test_compiled_rounds_read_the_host_no_more_than_eager(llama):
    """The compiled step adds no host sync (its guards read shapes, not values): the same count as eager, which
    tests/unit/test_host_syncs.py holds to its per-round budget."""
    from tests.unit.test_host_syncs import PROMPTS, count_syncs

    counts = {}
    for compiled in (False, True):
        kwargs = dict(eos_token_id=(), compile=compiled)
        dk.generate(llama, PROMPTS, dk.drafters.NGramDrafter(), max_new_tokens=8, **kwargs)
        with count_syncs() as syncs:
            dk.generate(llama, PROMPTS, dk.drafters.NGramDrafter(), max_new_tokens=16, **kwargs)
        counts[compiled] = syncs[0]
    assert counts[True] == counts[False]


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_the_other_covered_families_compile_to_eager_tokens(family, ragged_prompts):
    from tests.archs import tiny_model

    model = dk.load_model(tiny_model(family))  # Qwen2: projection biases; Qwen3: per-head q/k norms
    eager, compiled = _both(model, ragged_prompts, max_new_tokens=12, eos_token_id=())  # one graph: the arithmetic
    assert compiled.sequences == eager.sequences and "default" in model._static._compiled


@pytest.mark.parametrize("name", ["mistral-window", "qwen2-window", "gemma2-window", "gemma3-window"])
def test_sliding_window_stacks_compile_to_eager_tokens(name, ragged_prompts):
    """A window of 4 over prompts of up to 13 tokens and 12 new ones: every layer type's mask matters (Mistral: one
    windowed mask for all layers; Qwen2: a full layer beside windowed ones, a mask per type, stacked as planes;
    Gemma 2: that, with sandwich norms and its softcapped eager attention under an additive mask; Gemma 3: per-head
    q/k norms and a rotary table per layer type)."""
    from tests.unit.test_lean_forward import WINDOWED, family_model

    family, overrides = WINDOWED[name]
    scale = dict(initializer_range=0.05) if family.startswith("gemma") else {}  # at 0.2 a tiny Gemma repeats a token
    if family == "gemma2":  # a cap that bites (the default 50 leaves a tiny model's attention logits as they are)
        scale = dict(initializer_range=0.1, attn_logit_softcapping=0.5)
    model = dk.load_model(family_model(family, **overrides, **scale))
    assert not model.full_attention and model._static is not None
    for drafter in (None, dk.drafters.NGramDrafter(), dk.drafters.SuffixDrafter(cache_tokens=0)):
        eager, compiled = _both(model, ragged_prompts, drafter, max_new_tokens=12, eos_token_id=())
        assert compiled.sequences == eager.sequences, drafter
    assert "default" in model._static._compiled
    plain = dk.generate(model, ragged_prompts, max_new_tokens=12, eos_token_id=())
    unwindowed = dk.load_model(family_model(family, **scale))  # the same weights without a window: other tokens
    assert plain.sequences != dk.generate(unwindowed, ragged_prompts, max_new_tokens=12, eos_token_id=()).sequences


def _drafters(draft_model):
    from decodekit.drafters import (
        DelayedTreeDrafter,
        FallbackDrafter,
        ModelDrafter,
        ModelTreeDrafter,
        RecyclingDrafter,
        SuffixDrafter,
    )

    return {
        "suffix": SuffixDrafter(),
        "recycling": RecyclingDrafter("smollm2_8"),
        "fallback": FallbackDrafter(),
        "delayed": DelayedTreeDrafter(draft_model, branches=2, temperature=1.0),
        "model_tree_dynamic": ModelTreeDrafter(draft_model, shape="dynamic", top_k=3),
        "model_chain": ModelDrafter(draft_model),
    }


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_drafter_and_verifier_compiled_gives_eager_tokens(llama, draft_model, ragged_prompts, temperature):
    """The drafters that run without trained weights, under the default verifiers, and the tree and block
    verifiers on their drafts: compiled = eager, greedy and seeded sampling."""
    from decodekit.drafters import ModelDrafter, ModelTreeDrafter
    from decodekit.verifiers import BlockVerifier, SpecInferVerifier, SpecTrVerifier, TypicalAcceptanceVerifier

    cases = [(name, drafter, None) for name, drafter in _drafters(draft_model).items()]
    iid = ModelTreeDrafter(draft_model, shape="iid", branches=2, temperature=1.0)
    cases += [
        ("block", ModelDrafter(draft_model), BlockVerifier()),
        ("specinfer", iid, SpecInferVerifier()),
        ("spectr", iid, SpecTrVerifier()),
        ("typical", ModelDrafter(draft_model), TypicalAcceptanceVerifier()),
    ]
    for name, drafter, verifier in cases:
        if temperature == 0.0 and verifier is not None and not isinstance(verifier, BlockVerifier):
            continue  # the sampling verifiers
        eager, compiled = _both(
            llama,
            ragged_prompts,
            drafter,
            verifier,
            FixedLength(3),
            max_new_tokens=16,
            eos_token_id=(),
            temperature=temperature,
            seed=[4, 3, 2, 1],
        )
        assert compiled.sequences == eager.sequences, name
        assert compiled.stats.drafted > 0, name


def test_eagle_head_draft_steps_compile_and_draft_what_eager_drafts(llama, ragged_prompts, tmp_path):
    """The EAGLE head's draft steps (its one layer against its own cache: chains and EAGLE-2's staged trees) run
    compiled at static shapes: the same drafts as eager (the same accepted counts per position), and later calls
    with other prompt lengths compile nothing."""
    from decodekit.drafters.eagle import EagleDrafter, EagleHead
    from decodekit.drafters.head_files import head_metadata

    torch.manual_seed(0)
    head = EagleHead(llama.hf.config)
    head.init_from(llama)  # the target's last layer, f_t passed through: it drafts what the target would, mostly
    path = tmp_path / "head.safetensors"
    head.save(path, head_metadata(llama, base="tiny"))
    drafter, policy = EagleDrafter(path, shape="dynamic", top_k=2), FixedLength(6, depth=3)  # feeds chains too
    eager, compiled = _both(llama, ragged_prompts, drafter, policy=policy, max_new_tokens=16, eos_token_id=())
    assert compiled.sequences == eager.sequences
    assert compiled.stats.acceptance_rate_per_pos == eager.stats.acceptance_rate_per_pos
    assert compiled.stats.accepted == eager.stats.accepted > 0
    assert "default" in drafter.head._static._compiled  # the head's steps did run compiled
    graphs = _graphs()
    others = [[3, 1, 4, 1, 5, 9, 2, 6][: n + 1] for n in range(1, 8, 3)]
    eager, compiled = _both(llama, others, drafter, policy=policy, max_new_tokens=12, eos_token_id=())
    assert compiled.sequences == eager.sequences
    assert _graphs() == graphs


def test_a_released_eagle3_layer_compiles_to_its_eager_steps(tmp_path):
    """The released EAGLE-3 layer (its q / k / v reading ``[norm(embed) ; norm(u)]``) runs its draft steps compiled
    too: against the same cache views, ragged rows and a later step of another width, the same outputs and the same
    keys and values written as eager."""
    from decodekit.cache import KVCache
    from decodekit.masks import chain_mask
    from decodekit.models.compile_switch import compiling
    from tests.unit.eagle_release import write_release3

    lm = dk.load_model(tiny_llama(0, layers=8))
    write_release3(tmp_path / "eagle3", lm.hf.config, list(range(0, lm.vocab_size, 2)))
    head = dk.build("drafter", "eagle3", weights=str(tmp_path / "eagle3"), target=lm).head
    width = lm.hf.config.hidden_size

    def steps(mode):
        gen, cache, outs = torch.Generator().manual_seed(0), KVCache(2, 64), []
        with torch.no_grad(), compiling(mode):
            for n, kept in ((6, [6, 4]), (1, [1, 1]), (3, [2, 3]), (2, [2, 2])):  # the first: an empty cache, eager
                view = cache.stage(n)
                mask, positions = chain_mask(cache.lengths, n, view.kv_len)
                embeds, feats = (torch.randn(2, n, width, generator=gen) for _ in range(2))
                outs.append(head(embeds, feats, positions, mask, view))
                cache.keep(torch.tensor(kept))
        return outs, [buf[:, :, :20] for buf in (cache.keys[0], cache.values[0])]

    eager, compiled = steps(None), steps("default")
    for got, want in zip(compiled[0] + compiled[1], eager[0] + eager[1]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert "default" in head._static._compiled
