"""EAGLE-3: the training-time test unrolls the head exactly as the drafter drafts (a causal mask over the steps, the
shortcut that makes training cheaper, does not), the fused-feature fit, and the drafter on a fused head trained here:
greedy output equal to plain decoding, the exact output law under rejection sampling, the layers it asks the
verification forward for, and its refusals."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.cache import KVCache
from decodekit.drafters import FallbackDrafter, LookupEagle3Drafter, NGramDrafter
from decodekit.drafters.eagle import EagleDrafter, EagleHead
from decodekit.drafters.eagle3 import Eagle3Drafter
from decodekit.drafters.eagle3_head import default_layers
from decodekit.drafters.head_files import head_metadata
from decodekit.errors import ConfigError
from decodekit.kernels.cpu import PackedLinear
from decodekit.masks import chain_mask
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.train.eagle3 import fit_fuse, lead_with, new_head, ttt_loss, ttt_mask, ttt_unroll
from decodekit.train.feature_data import target_features
from decodekit.train.layer_features import final_and_layer_states, layer_states
from decodekit.verifiers import RejectionVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.test_eagle import sequences
from tests.unit.test_fallback import count_drafted
from tests.unit.test_lossless import assert_matches, sample_counts

LAYERS = (1, 2)  # the tiny targets' two layers


def fused_head(
    lm: dk.LanguageModel, seed: int = 0, vocab: torch.Tensor | None = None, release: bool = False
) -> EagleHead:
    """The recipe's start (``release``: EAGLE-3's own architecture) with a random ``fuse``."""
    torch.manual_seed(seed)
    head = new_head(lm, torch.arange(lm.vocab_size) if vocab is None else vocab, len(LAYERS), release)
    head.init_from(lm)
    torch.nn.init.normal_(head.fuse.weight, std=0.05)
    return head


def fused_data(lm: dk.LanguageModel, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The target's own samples as training data, and their states at ``LAYERS``."""
    data = target_features(lm, sequences(lm, 96, 40, seed), seq_len=48, batch_size=32, progress=False)
    return data, layer_states(lm, data["tokens"], LAYERS)


def train_fused(
    lm: dk.LanguageModel, steps: int, vocab: torch.Tensor | None = None, seed: int = 0, data: tuple | None = None
) -> EagleHead:
    """A fused head trained with :func:`ttt_loss` (3 steps) on the target's own samples (``data``: those of
    :func:`fused_data`, computed once by a caller that trains several heads)."""
    data, taps = fused_data(lm, seed) if data is None else data
    head = fused_head(lm, seed, vocab)
    fit_fuse(head, taps, data["feats"].float(), data["lengths"])
    w_d = lm.lm_head.weight[head.vocab].detach()
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.zeros(16, dtype=torch.long)
    for _ in range(steps):
        i = torch.randint(0, len(data["lengths"]), (16,), generator=gen)
        batch = (data["tokens"][i], taps[i], data["feats"][i], data["lengths"][i], starts)
        loss, _ = ttt_loss(head, lm.embed, w_d, *batch, 3, 0.8)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return head.eval()


def save(tmp_path_factory, lm: dk.LanguageModel, head: EagleHead, name: str):
    path = tmp_path_factory.mktemp("eagle3") / f"{name}.safetensors"
    head.save(path, head_metadata(lm, base=name, layers=list(LAYERS)))
    return path


@pytest.fixture(scope="module")
def trained() -> tuple[dk.LanguageModel, EagleHead, tuple]:
    """A fused head trained 120 steps on the tiny target's own samples, with the target and that data."""
    lm = dk.load_model(tiny_llama(0))
    data = fused_data(lm, seed=0)
    return lm, train_fused(lm, 120, data=data), data


@pytest.fixture(scope="module")
def greedy_setup(tmp_path_factory, trained):
    lm, head, _ = trained
    return lm, save(tmp_path_factory, lm, head, "tiny")


def drafted(head: EagleHead, lm: dk.LanguageModel, tokens: torch.Tensor, feat: torch.Tensor, p: int, steps: int):
    """What the drafter computes at anchor ``p``: the committed entries ``0 .. p`` in a cache, then ``steps - 1``
    single-token draft steps, each fed the previous step's output (teacher tokens); ``[steps, H]``."""
    cache, outs = KVCache(1, tokens.shape[1] + steps), []
    x, f = tokens[:, 1 : p + 2], feat[:, : p + 1]
    for _ in range(steps):
        view = cache.stage(x.shape[1])
        mask, positions = chain_mask(cache.lengths, x.shape[1], view.kv_len)
        g = head(lm.embed(x), f, positions, mask, view)
        cache.keep(torch.tensor([x.shape[1]]), host_counts=x.shape[1])
        outs.append(g[0, -1])
        at = cache.host_lengths()[0]
        x, f = tokens[:, at + 1 : at + 2], g[:, -1:]
    return torch.stack(outs)


@pytest.mark.parametrize("release", [False, True], ids=["fc", "eagle3"])
def test_training_unrolls_the_head_as_the_drafter_drafts(release):
    lm = dk.load_model(tiny_llama(0))
    head = fused_head(lm, release=release).eval()
    tokens = torch.randint(0, lm.vocab_size, (1, 14), generator=torch.Generator().manual_seed(0))
    feat = head.fuse(layer_states(lm, tokens, LAYERS)[:, :-1])
    with torch.no_grad():
        outs = torch.stack(ttt_unroll(head, lm.embed, tokens, feat, 3))[:, 0]  # [steps, n, H]
        for p in (0, 4, 9):
            torch.testing.assert_close(outs[:, p], drafted(head, lm, tokens, feat, p, 3), atol=1e-5, rtol=1e-4)
        # a plain causal mask over the stacked steps lets a step see other anchors' drafts: not what drafting sees
        wrong = torch.ones(1, 1, 13, 26, dtype=torch.bool).tril(13)
        g0 = ttt_unroll(head, lm.embed, tokens, feat, 1)[0]
        from transformers import DynamicCache

        cache = DynamicCache()
        positions = torch.arange(13)[None]
        head(lm.embed(tokens[:, 1:]), feat, positions, ttt_mask(13, 0), cache)
        g1 = head(lm.embed(torch.nn.functional.pad(tokens[:, 2:], (0, 1))), g0, positions + 1, wrong, cache)
    assert not torch.allclose(g1[0, 9], outs[1, 9], atol=1e-3)


def test_states_computed_per_batch_equal_the_cached_ones():
    """The GPU path (the target run on each batch) feeds the loss what the CPU path caches."""
    lm = dk.load_model(tiny_llama(0))
    data = target_features(lm, sequences(lm, 6, 20, seed=1), seq_len=28, batch_size=4, progress=False)
    feats, taps = final_and_layer_states(lm, data["tokens"], LAYERS)
    real = torch.arange(28)[None] < data["lengths"][:, None]  # the cache holds zeros past a row's length
    torch.testing.assert_close(feats.half()[real], data["feats"][real])
    torch.testing.assert_close(taps, layer_states(lm, data["tokens"], LAYERS))


def test_mask_sees_the_context_and_its_own_path():
    mask = ttt_mask(4, 2)[0, 0]
    assert mask.shape == (4, 12)
    assert mask[2, :4].tolist() == [True, True, True, False]  # the true entries up to the anchor
    assert mask[2, 4:8].tolist() == [False, False, True, False]  # step 1 at the same anchor only
    assert mask[2, 8:].tolist() == [False, False, True, False]  # and itself


def test_fuse_fit_recovers_a_linear_map():
    head = fused_head(dk.load_model(tiny_llama(0)))
    taps = torch.randn(20, 40, 2 * 64)
    w = torch.randn(64, 2 * 64) / 10
    error = fit_fuse(head, taps, taps @ w.T, torch.full((20,), 30), ridge=1e-6)  # 600 real positions, 128 inputs
    assert error < 1e-4
    torch.testing.assert_close(head.fuse.weight.data, w, atol=1e-3, rtol=1e-2)
    fit_fuse(head, taps, taps @ w.T + 0.1 * torch.randn(20, 40, 64), torch.full((20,), 30))  # noisy targets
    assert (head.fuse.weight.data - w).abs().mean() < 0.01


def test_training_fits_its_data_at_every_step(trained):
    """The loss trains every unrolled step, the later ones reading the head's own outputs: the module's trained head
    against the same start untrained (its fitted ``fuse`` only), on training rows (it generalises little)."""
    lm, head, full = trained
    data, taps = {k: v[:32] for k, v in full[0].items()}, full[1][:32]
    batch = (data["tokens"], taps, data["feats"], data["lengths"], torch.zeros(32, dtype=torch.long))
    with torch.no_grad():
        before, b = ttt_loss(train_fused(lm, 0, data=full), lm.embed, lm.lm_head.weight, *batch, 3, 0.8)
        after, a = ttt_loss(head, lm.embed, lm.lm_head.weight, *batch, 3, 0.8)
    assert float(after) < 0.9 * float(before), (before, after)  # measured 0.81
    assert a["acc"] > b["acc"] + 0.04 and a["acc2"] > b["acc2"] + 0.03, (b, a)  # measured +0.053, +0.038


def test_the_drafter_reads_the_layers_its_file_names(greedy_setup, tmp_path):
    lm, path = greedy_setup
    drafter = EagleDrafter(path)
    assert drafter.hidden_layers == LAYERS and "hidden" not in drafter.needs
    plain = tmp_path / "eagle1.safetensors"
    head = EagleHead(lm.hf.config)
    head.save(plain, head_metadata(lm, base="tiny"))
    assert EagleDrafter(plain).hidden_layers == () and "hidden" in EagleDrafter(plain).needs
    assert default_layers(30) == (2, 15, 27)


def test_greedy_equals_plain_decoding_with_drafts_accepted(greedy_setup, ragged_prompts):
    lm, path = greedy_setup
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    assert_greedy_twice(lm, ragged_prompts, Eagle3Drafter(path), FixedLength(3), reference, 40)
    out = dk.generate(lm, ragged_prompts, Eagle3Drafter(path), max_new_tokens=40, eos_token_id=())
    assert out.stats.accepted > 0
    tree = Eagle3Drafter(path, shape="dynamic", top_k=2)
    assert_greedy_twice(lm, ragged_prompts, tree, FixedLength(6, depth=3), reference, 40)


@pytest.mark.parametrize("bf16", [False, True])
def test_the_head_takes_the_targets_cpu_kernels(greedy_setup, ragged_prompts, monkeypatch, bf16):
    """On a target with packed oneDNN linears the head and its trimmed output head are packed too (faster one-token
    steps; bfloat16 weights where the CPU computes them natively), its layer run lean; on a stock target they stay
    stock. Greedy output is plain decoding's either way."""
    if bf16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU cannot run oneDNN's bfloat16 linears")
    monkeypatch.setattr("decodekit.kernels.cpu.native_bf16", lambda: bf16)
    lm, path = greedy_setup
    packed = dk.load_model(tiny_llama(0), kernels="onednn")
    for target, kind in ((lm, torch.nn.Linear), (packed, PackedLinear)):
        drafter = Eagle3Drafter(path, target=target)
        assert type(drafter.head.fc) is kind and type(drafter.head.fuse) is kind
        assert type(drafter.trimmed.proj) is kind and drafter.head.lean is not None
    assert drafter.head.fc.compute_dtype == (torch.bfloat16 if bf16 else torch.float32)
    reference = dk.generate(packed, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    assert_greedy_twice(packed, ragged_prompts, Eagle3Drafter(path), FixedLength(3), reference, 40)


def test_a_lookup_drafter_backed_by_the_head_is_greedy_decoding(greedy_setup, ragged_prompts):
    """n-gram lookup first, the head where it finds no match: the head catches up on the rounds it did not draft
    (its queue of target features grows), and greedy output is plain decoding's."""
    lm, path = greedy_setup
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    ngram, head = NGramDrafter(max_ngram=2), Eagle3Drafter(path)
    looked_up, headed = count_drafted(ngram), count_drafted(head)
    assert_greedy_twice(lm, ragged_prompts, FallbackDrafter(ngram, head), FixedLength(3), reference, 40)
    assert sum(looked_up) > 0 and sum(headed) > 0
    lookup = LookupEagle3Drafter(path, cache_tokens=0)  # suffix first, the head's greedy chain of 3 after
    assert_greedy_twice(lm, ragged_prompts, lookup, FixedLength(16, depth=16), reference, 40)
    sampled = dk.generate(lm, ragged_prompts, lookup, max_new_tokens=8, temperature=1)  # its default policy
    assert sampled.stats.drafted > 0  # one kind at every temperature: the head drafts greedily


def test_sampling_is_lossless(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, init=0.3))
    path = save(tmp_path_factory, lm, train_fused(lm, 60, vocab=torch.tensor([1, 2, 4, 6, 7])), "tiny8")
    counts, stats = sample_counts(lm, Eagle3Drafter(path), RejectionVerifier(), FixedLength(2), "T1", seed=25)
    assert_matches(lm.hf, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_init_vocab_needs_an_init_head(tmp_path):
    from decodekit.train.eagle3 import train

    with pytest.raises(ConfigError, match="init_vocab=true keeps the init head"):
        train(tmp_path, base="no-such-model", init_vocab=True)
    assert not any(tmp_path.iterdir())


def test_a_kept_draft_vocabulary_leads_the_training_vocabulary():
    vocab = torch.tensor([3, 1, 2, 5, 7])  # the data's tokens, most frequent first
    assert lead_with(torch.tensor([5, 9]), vocab).tolist() == [5, 9, 3, 1, 2]  # its tokens first, then the data's
    assert lead_with(torch.tensor([1]), vocab).tolist() == [1, 3, 2, 5, 7]
    with pytest.raises(ConfigError, match="more than train_vocab"):
        lead_with(torch.arange(6), vocab)


def test_missing_weights_say_how_to_train_them(tmp_path):
    with pytest.raises(ConfigError, match="recipe=eagle3"):
        Eagle3Drafter(tmp_path / "absent.safetensors")


def test_a_single_draft_vocabulary_is_taken_without_timing(monkeypatch):
    """A GPU run names the size the CPU picked: its agreement is measured, nothing is timed."""
    from decodekit.train import eagle_vocab
    from decodekit.train.feature_data import FeatureData

    lm = dk.load_model(tiny_llama(0))
    data = target_features(lm, sequences(lm, 4, 20, seed=2), seq_len=24, batch_size=4, progress=False)
    n = len(data["lengths"])
    val = FeatureData(data["tokens"], data["lengths"], data["feats"], torch.zeros(n, dtype=torch.long),
                      torch.ones(n, dtype=torch.bool), torch.arange(lm.vocab_size), 0.0)  # fmt: skip
    taps = layer_states(lm, data["tokens"], LAYERS)
    head = fused_head(lm)
    timed = eagle_vocab.pick_vocab(head, lm, val, [16, 64], 2, taps)
    assert set(timed["sizes"]) == {16, 64} and "draft_step_ms" in timed["sizes"][16]

    def no_timing(*args, **kwargs):
        raise AssertionError("timed a single size")

    monkeypatch.setattr(eagle_vocab, "step_ms", no_timing)
    single = eagle_vocab.pick_vocab(head, lm, val, [64], 2, taps)
    assert single["picked"] == 64 and single["sizes"][64]["agreement"] == timed["sizes"][64]["agreement"]
