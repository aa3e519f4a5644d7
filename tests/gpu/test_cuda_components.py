"""Every drafter, verifier, DLM rule, cache and schedule on a GPU (skipped without CUDA): greedy output equal to the
CPU's, token for token, and sampling that runs, stays on the device and is reproducible under a seed."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.eagle import EagleDrafter, EagleHead
from decodekit.drafters.head_files import head_metadata
from decodekit.drafters.medusa import MedusaDrafter, MedusaHeads
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength, HeuristicLength, Stack

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = [[5, 9, 14, 2], [33, 7], [1, 2, 3, 4, 5, 6, 7]]
MASK = 127


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """Untrained EAGLE, Medusa, DFlash and FlexDraft head files for tiny_llama(0) (any head drafts; greedy output
    must not change)."""
    lm = dk.load_model(tiny_llama(0))
    folder = tmp_path_factory.mktemp("heads")
    eagle = EagleHead(lm.hf.config, None)
    eagle.init_from(lm)
    eagle.save(folder / "eagle.safetensors", head_metadata(lm, base="eagle"))
    medusa = MedusaHeads(lm.hf.config.hidden_size, 3, torch.arange(lm.vocab_size))
    medusa.save(folder / "medusa.safetensors", head_metadata(lm, base="medusa"))
    from decodekit.drafters.dflash_head import DFlashHead
    from decodekit.drafters.flexdraft_head import FlexDraftHead

    dflash = DFlashHead(lm.hf.config, (1,), 1, 4)
    dflash.init_from(lm)
    dflash.save(folder / "dflash.safetensors", head_metadata(lm, **dflash.file_fields()))
    flex = FlexDraftHead(lm, 1, 4)  # random projections: its mask slots draft something
    flex.save(folder / "flexdraft.safetensors", head_metadata(lm, **flex.file_fields()))
    return folder


def drafters(device: str, heads) -> dict[str, tuple]:
    """name -> (drafter, policy) built for a target on ``device``."""
    draft = dk.load_model(perturbed(tiny_llama(0), 0.3, seed=1), device=device)
    block_dlm = dk.dlm.DLMModel(dk.load_model(tiny_llama(0), device=device), MASK, shift_logits=True, block_length=4)
    return {
        "ngram": (dk.drafters.NGramDrafter(), FixedLength(4)),
        "diffusion": (dk.drafters.DiffusionDrafter(block_dlm, steps=2), FixedLength(4)),
        "diffusion_tree": (dk.drafters.DiffusionDrafter(block_dlm, template="smollm2_8"), FixedLength(8, depth=4)),
        "suffix": (dk.drafters.SuffixDrafter(), FixedLength(8, depth=8)),
        "recycling": (dk.drafters.RecyclingDrafter(template="smollm2_8"), FixedLength(8, depth=4)),
        "model_chain": (dk.drafters.ModelDrafter(draft), FixedLength(3)),
        "model_tree": (dk.build("drafter", "model_tree", draft), FixedLength(6, depth=3)),
        "eagle": (EagleDrafter(heads / "eagle.safetensors"), FixedLength(3)),
        "eagle_tree": (EagleDrafter(heads / "eagle.safetensors", shape="dynamic", top_k=2), FixedLength(6, depth=3)),
        "medusa": (MedusaDrafter(heads / "medusa.safetensors"), FixedLength(2)),
        "dflash": (dk.drafters.DFlashDrafter(heads / "dflash.safetensors"), FixedLength(3)),
        "flexdraft": (dk.drafters.FlexDraftDrafter(heads / "flexdraft.safetensors"), FixedLength(3)),
        "early_exit": (dk.drafters.EarlyExitDrafter(1), FixedLength(3)),
        "layer_skip": (dk.drafters.LayerSkipDrafter(), FixedLength(3)),
        "model_template": (dk.build("drafter", "model_tree", draft, shape="template"), FixedLength(6, depth=3)),
        "suffix_fallback": (
            dk.drafters.FallbackDrafter(dk.drafters.SuffixDrafter(cache_tokens=0), dk.drafters.ModelDrafter(draft), 3),
            FixedLength(8, depth=8),
        ),
        "model_chain_stack": (dk.drafters.ModelDrafter(draft), Stack(FixedLength(3), HeuristicLength())),
    }


def sync_cases(device: str, heads) -> dict[str, tuple]:
    """name -> (drafter, policy, host syncs a round at most, per-call syncs of the drafter) on ``device``; draft
    models count the rows leaving the batch, as in tests/unit/test_host_syncs.py."""
    from tests.unit.test_host_syncs import CountingModelDrafter, CountingTreeDrafter

    draft = dk.load_model(perturbed(tiny_llama(0), 0.3, seed=1), device=device)
    built = drafters(device, heads)
    lookup = dk.drafters.FallbackDrafter(dk.drafters.SuffixDrafter(cache_tokens=0), CountingModelDrafter(draft), 3)
    return {
        "model_chain": (CountingModelDrafter(draft), FixedLength(3), 1, 0),
        "model_tree": (CountingTreeDrafter(draft), FixedLength(6, depth=3), 1, 0),
        "eagle_tree": (*built["eagle_tree"], 1, 0),
        "recycling": (*built["recycling"], 1, 0),
        "suffix_fallback": (lookup, FixedLength(8, depth=8), 2, 1),  # suffix's read, and once a call its begin
    }


@pytest.mark.parametrize("name", ["model_chain", "model_tree", "eagle_tree", "recycling", "suffix_fallback"])
def test_host_syncs_a_round_on_cuda(heads, name):
    """What tests/unit/test_host_syncs.py counts on the CPU holds on a GPU, where every read stalls the host:
    declared widths (chains), bounds on them (trees) and suffix's host-known rows spare the trimming read."""
    from tests.unit.test_host_syncs import syncs_per_round

    target = dk.load_model(tiny_llama(0), device="cuda")
    drafter, policy, bound, per_call = sync_cases("cuda", heads)[name]
    assert syncs_per_round(target, drafter, policy, per_call=per_call) <= bound


def test_every_drafter_greedy_on_cuda_equals_cpu(heads, ragged_prompts):
    cpu = dk.load_model(tiny_llama(0))
    expected = dk.generate(cpu, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    target = dk.load_model(tiny_llama(0), device="cuda")
    for name, (drafter, policy) in drafters("cuda", heads).items():
        kwargs = dict(policy=policy, max_new_tokens=24, eos_token_id=(), debug=True)
        out = dk.generate(target, ragged_prompts, drafter, **kwargs)
        assert out.sequences == expected, name


@pytest.mark.parametrize("verifier", ["rejection", "block", "traversal", "specinfer", "spectr", "typical"])
def test_every_verifier_samples_on_cuda(verifier, ragged_prompts):
    target = dk.load_model(tiny_llama(0), device="cuda")
    draft = dk.load_model(perturbed(tiny_llama(0), 0.3, seed=1), device="cuda")
    chain = verifier in ("rejection", "block")
    drafter = dk.drafters.ModelDrafter(draft) if chain else dk.build("drafter", "model_tree", draft, shape="iid")
    policy = FixedLength(3) if chain else FixedLength(6, depth=3)

    def run(seed):
        out = dk.generate(
            target, ragged_prompts, drafter, dk.build("verifier", verifier), policy,
            temperature=0.8, top_p=0.9, max_new_tokens=16, eos_token_id=(), seed=seed,
        )  # fmt: skip
        return out.sequences

    first = run(3)
    assert first == run(3) and all(len(row) == 16 for row in first)


def dlm_methods() -> dict[str, dict]:
    """name -> generate kwargs: every rule uncached, every cache and schedule under the threshold rule, drafts."""
    rules = ("llada", "threshold", "factor", "local_leap", "dream")
    methods = {name: {"rule": dk.build("dlm_rule", name)} for name in rules}
    methods["prophet"] = {"rule": dk.build("dlm_rule", "prophet")}
    for cache in ("prefix", "dual", "dkv", "block_causal"):
        methods[cache] = {"rule": dk.dlm.ThresholdRule(0.5), "cache": dk.build("dlm_cache", cache)}
    schedules = {"adablock": dk.dlm.AdaBlock(delimiters=[5, 9], threshold=0.0), "dcd": dk.dlm.DeferredWindow(size=3)}
    for name, schedule in schedules.items():
        methods[name] = {"rule": dk.dlm.ThresholdRule(0.5), "schedule": schedule}
    for cache in (None, "block_causal"):  # self-speculative drafts, on both caches that run them
        built = None if cache is None else dk.build("dlm_cache", cache)
        methods[f"spiffy_{cache}"] = {"rule": None, "cache": built, "draft": dk.build("dlm_draft", "spiffy")}
    return methods


def test_every_dlm_rule_cache_and_schedule_greedy_on_cuda_equals_cpu():
    hf = tiny_llama(3, init=0.6)  # peaked distributions: no near-ties for the two devices' rounding to flip
    cpu = dk.dlm.load_model(hf, mask_token_id=MASK)
    gpu = dk.dlm.load_model(dk.load_model(tiny_llama(3, init=0.6), device="cuda"), mask_token_id=MASK)
    kwargs = dict(gen_length=8, block_length=4, steps=8)
    want = {name: dk.dlm.generate(cpu, PROMPTS, **method, **kwargs).sequences for name, method in dlm_methods().items()}
    for name, method in dlm_methods().items():  # fresh components: caches and schedules keep per-call state
        assert dk.dlm.generate(gpu, PROMPTS, **method, **kwargs).sequences == want[name], name


@pytest.mark.parametrize("name", ["random_order", "dkv_greedy"])
def test_dlm_sampling_on_cuda_is_seeded(name):
    gpu = dk.dlm.load_model(dk.load_model(tiny_llama(3, init=0.6), device="cuda"), mask_token_id=MASK)

    def run():
        cache = dk.build("dlm_cache", "dkv_greedy") if name == "dkv_greedy" else None
        out = dk.dlm.generate(
            gpu, PROMPTS, gen_length=8, block_length=4, steps=8, rule=dk.dlm.RandomOrderRule(), cache=cache,
            temperature=0.9, seed=[1, 2, 3],
        )  # fmt: skip
        return out.sequences

    first = run()
    assert first == run() and all(MASK not in row for row in first)


# family -> (block length, the runs compared: each a {part: registry name})
RELEASED = {
    "llada": (4, ({"rule": "llada"}, {"rule": "threshold", "cache": "dual"})),
    "dream": (8, ({"rule": "dream"}, {"rule": "threshold", "cache": "dual"})),
    "sdar": (4, ({"rule": "sdar"}, {"rule": "sdar", "cache": "block_causal"})),
    "fast_dllm_v2": (8, ({"rule": "fast_dllm_v2"}, {"rule": "fast_dllm_v2", "cache": "block_causal"})),
    "llada2": (4, ({"rule": "sdar"}, {"rule": "sdar", "cache": "block_causal"})),  # read with blocks of 4
}


@pytest.mark.parametrize("family", list(RELEASED))
def test_released_checkpoints_on_cuda_equal_cpu(tmp_path, family):
    """Each released-layout checkpoint (tests/unit/dlm_families.py), read onto the GPU in float32: the same greedy
    tokens as on the CPU, with the family's own rule and with a cache (Fast-dLLM's dual cache on the bidirectional
    families, the exact block cache on the block-causal ones, whose prompts' tails open the first block)."""
    import tests.unit.dlm_families as families
    import tests.unit.dlm_llada2 as llada2

    getattr(families if family != "llada2" else llada2, f"write_{family}")(tmp_path)
    block, runs = RELEASED[family]
    extra = {"block_length": block} if family == "llada2" else {}  # its configs name none: generate's 32
    cpu, gpu = dk.dlm.load_model(str(tmp_path), **extra), dk.dlm.load_model(str(tmp_path), device="cuda", **extra)
    assert next(gpu.lm.hf.parameters()).is_cuda
    for kwargs in runs:

        def run(m, kwargs=kwargs):
            built = {k: dk.build(f"dlm_{k}", v) for k, v in kwargs.items()}
            return dk.dlm.generate(m, PROMPTS, gen_length=8, block_length=block, steps=8, **built)

        assert run(gpu).sequences == run(cpu).sequences, kwargs
