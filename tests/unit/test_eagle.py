"""The EAGLE drafter: a feature head trained here on tiny targets with the training recipe's own loss, then
greedy output equal to plain decoding, the exact output law under rejection sampling (full and trimmed draft
vocabulary; a drafter that misreports q fails the same test), and the refusals (missing weights, another target)."""

from __future__ import annotations

import json

import pytest
import torch

import decodekit as dk
from decodekit.drafters.eagle import EagleDrafter, EagleHead
from decodekit.drafters.head_files import head_metadata
from decodekit.errors import ConfigError
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.train.eagle import head_loss
from decodekit.train.feature_data import target_features
from decodekit.verifiers import RejectionVerifier, TraversalVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.test_lossless import MisreportsQ, assert_detected, assert_matches, sample_counts


def sequences(lm: dk.LanguageModel, n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` sequences the target samples (temperature 1) from random 3-8 token prompts."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(0, lm.vocab_size, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(n)
    ]
    out = dk.generate(lm, prompts, max_new_tokens=length, temperature=1.0, eos_token_id=(), seed=seed)
    return [p + s for p, s in zip(prompts, out.sequences)]


def own_samples(lm: dk.LanguageModel, seed: int = 0) -> dict[str, torch.Tensor]:
    """The target's features of 96 of its own 40-token samples: the heads' training data."""
    return target_features(lm, sequences(lm, 96, 40, seed), seq_len=48, batch_size=32, progress=False)


def train_head(
    lm: dk.LanguageModel, steps: int, vocab: torch.Tensor | None = None, seed: int = 0, data: dict | None = None
) -> EagleHead:
    """A head trained with :func:`decodekit.train.eagle.head_loss` on the target's own samples (``data``:
    :func:`own_samples`, computed once by a caller that trains several heads)."""
    data = own_samples(lm, seed) if data is None else data
    torch.manual_seed(seed)
    head = EagleHead(lm.hf.config, vocab)
    head.init_from(lm)
    w_d = lm.lm_head.weight[head.vocab].detach()
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(data["lengths"]), (16,), generator=gen)
        batch = (data["tokens"][idx], data["feats"][idx], data["lengths"][idx], torch.zeros(16, dtype=torch.long))
        loss, _ = head_loss(head, lm.embed, w_d, *batch, 0.0, 1.0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return head.eval()


def head_file(tmp_path_factory, lm: dk.LanguageModel, head: torch.nn.Module, name: str):
    """``head`` (an EAGLE head or Medusa heads) saved for ``lm`` as a head file; its path."""
    path = tmp_path_factory.mktemp("heads") / f"{name}.safetensors"
    head.save(path, head_metadata(lm, base=name))
    return path


@pytest.fixture(scope="module")
def greedy_setup(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0))
    return lm, head_file(tmp_path_factory, lm, train_head(lm, 150), "tiny")


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, init=0.3))
    full = head_file(tmp_path_factory, lm, train_head(lm, 100), "tiny8")
    trimmed = head_file(tmp_path_factory, lm, train_head(lm, 100, vocab=torch.tensor([1, 2, 4, 6, 7])), "tiny8_trim")
    return lm, full, trimmed


def test_training_fits_its_data():
    """The recipe's loss trains the head (on a random tiny target only the training data can be fitted; the
    held-out agreement of the real recipe is tests/integration/test_eagle_recipe.py's)."""
    lm = dk.load_model(tiny_llama(3))
    data = own_samples(lm)
    batch = (data["tokens"][:32], data["feats"][:32], data["lengths"][:32], torch.zeros(32, dtype=torch.long))
    stats = []
    for steps in (0, 150):
        head = train_head(lm, steps, seed=0, data=data)
        with torch.no_grad():
            loss, numbers = head_loss(head, lm.embed, lm.lm_head.weight, *batch, 0.0, 1.0)
        stats.append((float(loss), numbers["acc"]))
    assert stats[1][0] < 0.9 * stats[0][0] and stats[1][1] > stats[0][1] + 0.1, stats


def test_greedy_equals_plain_decoding(greedy_setup, ragged_prompts):
    lm, path = greedy_setup
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    assert_greedy_twice(lm, ragged_prompts, EagleDrafter(path), FixedLength(3), reference, 40)


def test_rows_finishing_at_different_times(greedy_setup, ragged_prompts):
    lm, path = greedy_setup
    lengths = [5, 17, 9, 30]
    reference = [
        dk.generate(lm, [p], max_new_tokens=n, eos_token_id=()).sequences[0] for p, n in zip(ragged_prompts, lengths)
    ]
    out = dk.generate(lm, ragged_prompts, EagleDrafter(path), max_new_tokens=30, eos_token_id=(), debug=True)
    assert [s[:n] for s, n in zip(out.sequences, lengths)] == reference
    eos = dk.generate(lm, ragged_prompts, max_new_tokens=30, eos_token_id=[7, 9]).sequences
    assert (
        dk.generate(
            lm, ragged_prompts, EagleDrafter(path), max_new_tokens=30, eos_token_id=[7, 9], debug=True
        ).sequences
        == eos
    )


@pytest.mark.parametrize("trimmed", [False, True])
def test_sampling_is_lossless(small_vocab, trimmed):
    lm, full, trim = small_vocab
    drafter = EagleDrafter(trim if trimmed else full)
    counts, stats = sample_counts(lm, drafter, RejectionVerifier(), FixedLength(2), "T1", seed=21)
    assert_matches(lm.hf, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_trimmed_head_drafts_only_its_vocabulary(small_vocab):
    lm, _, trim = small_vocab
    drafter = EagleDrafter(trim)
    seen = []

    class Spy:
        def plan(self, state):
            return FixedLength(3).plan(state)

    out = dk.generate(
        lm, [[1, 2, 3]] * 64, drafter, policy=Spy(), max_new_tokens=12, temperature=1.0, seed=3, eos_token_id=()
    )
    seen = drafter.head.vocab.tolist()
    assert seen == [1, 2, 4, 6, 7] and out.stats.drafted > 0
    logits = drafter.logits(torch.randn(2, lm.hf.config.hidden_size))
    assert torch.isinf(logits[:, [0, 3, 5]]).all() and torch.isfinite(logits[:, [1, 2, 4, 6, 7]]).all()


def test_a_drafter_that_misreports_q_is_detected(small_vocab):
    lm, full, _ = small_vocab
    counts, _ = sample_counts(lm, MisreportsQ(EagleDrafter(full)), RejectionVerifier(), FixedLength(2), "T1", seed=22)
    assert_detected(lm.hf, counts, "T1")


def test_missing_weights_say_how_to_train_them(tmp_path):
    with pytest.raises(ConfigError, match="recipe=eagle"):
        EagleDrafter(tmp_path / "absent.safetensors")


def test_a_head_for_another_target_is_refused(greedy_setup, ragged_prompts):
    _, path = greedy_setup
    other = dk.load_model(tiny_llama(5))  # same shapes, other weights
    with pytest.raises(ConfigError, match="trained for 'tiny'.*other weights"):
        dk.generate(other, ragged_prompts, EagleDrafter(path), max_new_tokens=4)
    with pytest.raises(ConfigError, match="other weights"):
        EagleDrafter(path, target=other)  # given the target, the head is checked when the drafter is built
    wider = dk.load_model(tiny_llama(0, hidden=32))
    with pytest.raises(ConfigError, match="hidden size 64"):
        dk.generate(wider, ragged_prompts, EagleDrafter(path), max_new_tokens=4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_at_most_two_host_syncs_per_round(tmp_path, temperature):
    """Like a draft model: the loop's own read of the row lengths and the draft's used width, nothing more (the
    head's host lengths are kept from the loop's)."""
    from tests.unit.test_host_syncs import syncs_per_round

    lm = dk.load_model(tiny_llama(0))
    path = tmp_path / "head.safetensors"
    head = EagleHead(lm.hf.config)
    head.init_from(lm)
    head.save(path, head_metadata(lm, base="tiny"))
    assert syncs_per_round(lm, EagleDrafter(path), FixedLength(3), temperature) <= 2


def test_runs_on_a_target_with_onednn_kernels(greedy_setup, ragged_prompts):
    """kernels="onednn" keeps the output head prepacked: the head reads a dense copy of its rows."""
    lm, path = greedy_setup
    packed = dk.load_model(lm, kernels="onednn")
    reference = dk.generate(packed, ragged_prompts, max_new_tokens=20, eos_token_id=()).sequences
    out = dk.generate(packed, ragged_prompts, EagleDrafter(path), max_new_tokens=20, eos_token_id=(), debug=True)
    assert out.sequences == reference and out.stats.drafted > 0


# ------------------------------------------------------------------------------------------- EAGLE-2 trees
def test_dynamic_tree_greedy_equals_plain_decoding(greedy_setup, ragged_prompts):
    lm, path = greedy_setup
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    drafter = EagleDrafter(path, shape="dynamic", top_k=3)
    assert_greedy_twice(lm, ragged_prompts, drafter, FixedLength(8, depth=4), reference, 40)


def test_dynamic_tree_accepts_more_than_its_chain(greedy_setup, ragged_prompts):
    """The same head and depth: the tree's best path is at least the chain's (the chain is the tree's argmax
    path), and its other branches add acceptances where the argmax missed."""
    lm, path = greedy_setup
    lengths = []
    for drafter, policy in (
        (EagleDrafter(path), FixedLength(3)),
        (EagleDrafter(path, shape="dynamic"), FixedLength(10, depth=3)),
    ):
        out = dk.generate(lm, ragged_prompts, drafter, policy=policy, max_new_tokens=40, eos_token_id=())
        lengths.append(out.stats.mean_acceptance_length)
    assert lengths[1] > lengths[0], lengths


def test_dynamic_tree_is_lossless_when_sampling(small_vocab):
    lm, full, trim = small_vocab
    for path, seed in ((full, 23), (trim, 24)):
        drafter = EagleDrafter(path, shape="dynamic", top_k=2)
        counts, stats = sample_counts(lm, drafter, TraversalVerifier(), FixedLength(4, depth=2), "T0.7-p0.9", seed)
        assert_matches(lm.hf, counts, "T0.7-p0.9")
        assert stats.accepted > 0


def test_tree_settings_are_checked(greedy_setup, ragged_prompts):
    _, path = greedy_setup
    with pytest.raises(ConfigError, match="shape must be one of 'chain', 'dynamic'"):
        EagleDrafter(path, shape="static")
    with pytest.raises(ConfigError, match="top_k is for shape='dynamic'"):
        EagleDrafter(path, top_k=3)


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_a_released_eagle_head_drafts_as_its_authors_code(tmp_path, ragged_prompts, fmt):
    """An EAGLE-1/2 head in its authors' release layout (``config.json``, ``pytorch_model.bin`` or
    ``model.safetensors``: ``fc``, ``layers.0.*`` without an input norm, no final norm): the first round's chain is
    the one a port of their head's forward drafts; greedy output equals plain decoding, chains and EAGLE-2 trees; a
    release for another target is refused with both sizes."""
    from tests.unit.eagle_release import first_draft, first_round, write_release

    hf = tiny_llama(0)
    lm = dk.load_model(hf)
    tensors = write_release(tmp_path / "eagle", hf.config, fmt=fmt)
    prompt = ragged_prompts[0]
    drafter = EagleDrafter(tmp_path / "eagle", target=lm)
    assert first_round(lm, drafter, prompt, 4) == first_draft(tensors, hf, prompt, 4)
    plain = dk.generate(lm, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    for shape, policy in (("chain", FixedLength(4)), ("dynamic", FixedLength(8))):
        out = dk.generate(lm, ragged_prompts, EagleDrafter(tmp_path / "eagle", shape=shape), policy=policy,
                          max_new_tokens=24, eos_token_id=())  # fmt: skip
        assert out.sequences == plain and out.stats.drafted > 0, shape  # a random head: rejections, rollbacks
    write_release(tmp_path / "wide", hf.config, fmt=fmt, hidden_size=2 * hf.config.hidden_size)
    with pytest.raises(
        ConfigError, match=rf"hidden size {2 * hf.config.hidden_size}.*hidden size {hf.config.hidden_size}"
    ):
        EagleDrafter(tmp_path / "wide", target=lm)


@pytest.mark.parametrize("fusion_bias", [True, False], ids=["hass", "eagle"])
def test_a_speculators_eagle_head_drafts_as_the_authors_head(tmp_path, ragged_prompts, fusion_bias):
    """The EAGLE-1 head saved as ``speculators`` (up to 0.3) saved EAGLE / HASS heads (``fusion_fc``,
    ``transformer.*``, ``fusion_bias``): the first round's chain is the port's (without a bias when there is none);
    greedy output equals plain decoding; ``layernorms=True`` is refused by name."""
    from tests.unit.eagle_release import first_draft, first_round, release_tensors, write_speculators_eagle

    hf = tiny_llama(0)
    lm = dk.load_model(hf)
    sizes = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    tensors = release_tensors({key: getattr(hf.config, key) for key in sizes}, seed=0)
    write_speculators_eagle(tmp_path / "s", hf.config, tensors, fusion_bias)
    want = tensors if fusion_bias else {**tensors, "fc.bias": torch.zeros(hf.config.hidden_size)}
    assert first_round(lm, EagleDrafter(tmp_path / "s", target=lm), ragged_prompts[0], 4) == first_draft(
        want, hf, ragged_prompts[0], 4
    )
    plain = dk.generate(lm, ragged_prompts, max_new_tokens=16, eos_token_id=()).sequences
    out = dk.generate(lm, ragged_prompts, EagleDrafter(tmp_path / "s"), policy=FixedLength(4), max_new_tokens=16,
                      eos_token_id=())  # fmt: skip
    assert out.sequences == plain and out.stats.drafted > 0
    config = tmp_path / "s" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"layernorms": True}))
    with pytest.raises(ConfigError, match="layernorms=True"):
        EagleDrafter(tmp_path / "s", target=lm)


def test_a_released_eagle3_head_drafts_as_its_authors_code(tmp_path, ragged_prompts):
    """An EAGLE-3 release (``midlayer.*`` reading ``[norm(embed) ; norm(u)]``, its own ``lm_head`` over a draft
    vocabulary mapped by ``d2t``; ``fc`` fusing the states entering layers 2, 4, 5 of 8) for a tiny 8-layer target:
    the first round's chain is the one a port of their head drafts; greedy output equals plain decoding, chains and
    trees; a head for another target is refused with both sizes."""
    from tests.unit.eagle_release import first_draft3, first_round, write_release3

    hf = tiny_llama(0, layers=8)
    lm = dk.load_model(hf)
    draft_ids = list(range(0, lm.vocab_size, 2))  # half the vocabulary: d2t moves every draft id
    tensors = write_release3(tmp_path / "eagle3", hf.config, draft_ids)
    prompt = ragged_prompts[0]
    drafter = dk.build("drafter", "eagle3", weights=str(tmp_path / "eagle3"), target=lm)
    assert drafter.hidden_layers == (2, 4, 5)
    seen = first_round(lm, drafter, prompt, 4)
    assert seen == first_draft3(tensors, hf, prompt, 4) and all(t % 2 == 0 for t in seen)
    plain = dk.generate(lm, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    for shape, policy in (("chain", FixedLength(4)), ("dynamic", FixedLength(8))):
        heads = dk.build("drafter", "eagle3", weights=str(tmp_path / "eagle3"), shape=shape)
        out = dk.generate(lm, ragged_prompts, heads, policy=policy, max_new_tokens=24, eos_token_id=())
        assert out.sequences == plain and out.stats.drafted > 0, shape
    write_release3(tmp_path / "other", hf.config, draft_ids, vocab_size=2 * lm.vocab_size)
    with pytest.raises(ConfigError, match=rf"vocabulary {2 * lm.vocab_size}.*vocabulary {lm.vocab_size}"):
        dk.build("drafter", "eagle3", weights=str(tmp_path / "other"), target=lm)


def test_a_released_eagle_head_with_parts_decodekit_would_drop_is_refused(tmp_path):
    """Attention biases on an EAGLE-3 layer, a second EAGLE-1 layer with its own norm and output head, and a d2t of
    absolute ids instead of the authors' offsets once loaded without a word (the biases or layers dropped: fewer
    tokens accepted) or failed deep in a forward."""
    from tests.unit.eagle_release import write_release, write_release3

    hf = tiny_llama(0, layers=8)
    lm = dk.load_model(hf)
    draft_ids = list(range(0, lm.vocab_size, 2))
    tensors = write_release3(tmp_path / "bias", hf.config, draft_ids, attention_bias=True)
    torch.save({**tensors, "midlayer.self_attn.q_proj.bias": torch.ones(hf.config.hidden_size)},
               tmp_path / "bias" / "pytorch_model.bin")  # fmt: skip
    with pytest.raises(ConfigError, match="no place for: midlayer.self_attn.q_proj.bias"):
        dk.build("drafter", "eagle3", weights=str(tmp_path / "bias"), target=lm)
    torch.save({**tensors, "d2t": torch.tensor(draft_ids)}, tmp_path / "bias" / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"d2t does not map .* it must hold offsets"):
        dk.build("drafter", "eagle3", weights=str(tmp_path / "bias"), target=lm)
    tensors = write_release(tmp_path / "two", hf.config, num_hidden_layers=2)
    torch.save({**tensors, "norm.weight": torch.ones(hf.config.hidden_size)}, tmp_path / "two" / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="num_hidden_layers=2 and tensors norm.weight"):
        EagleDrafter(tmp_path / "two", target=lm)


@pytest.mark.parametrize("before", [False, True])
def test_a_speculators_eagle3_head_drafts_as_the_authors_head(tmp_path, ragged_prompts, before):
    """The same EAGLE-3 head saved as vLLM's ``speculators`` saves it (``layers.0.*``, ``transformer_layer_config``,
    ``norm_before_residual``): its first round's chain is the port's (with the residual after ``hidden_norm`` when
    the flag says so, which drafts otherwise); greedy output equals plain decoding; a normalisation variant it does
    not implement is refused by name."""
    from tests.unit.eagle_release import first_draft3, first_round, write_release3, write_speculators

    hf = tiny_llama(0, layers=8)
    lm = dk.load_model(hf)
    tensors = write_release3(tmp_path / "authors", hf.config, list(range(0, lm.vocab_size, 2)))
    write_speculators(tmp_path / "speculators", hf.config, tensors, before)
    drafter = dk.build("drafter", "eagle3", weights=str(tmp_path / "speculators"), target=lm)
    plain = dk.generate(lm, ragged_prompts, max_new_tokens=16, eos_token_id=()).sequences
    out = dk.generate(lm, ragged_prompts, drafter, policy=FixedLength(4), max_new_tokens=16, eos_token_id=())
    assert out.sequences == plain
    want, other = (first_draft3(tensors, hf, ragged_prompts[0], 4, flag) for flag in (before, not before))
    assert first_round(lm, drafter, ragged_prompts[0], 4) == want != other
    config = tmp_path / "speculators" / "config.json"
    written = json.loads(config.read_text())
    for edit, match in (({"norm_output": True}, "norm_output=True"), ({"transformer_layer_config": {
            **written["transformer_layer_config"], "num_hidden_layers": 2}}, "2 decoder layers")):  # fmt: skip
        config.write_text(json.dumps(written | edit))
        with pytest.raises(ConfigError, match=match):
            dk.build("drafter", "eagle3", weights=str(tmp_path / "speculators"), target=lm)
