"""What the training recipes share: the learning-rate schedule (resettable for a time budget), the budget's step
count, and the self-distilled sequences (answered in length-sorted batches, cached with their response starts)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import decodekit as dk
from decodekit.train.common import WarmupCosine, budgeted_steps, warmup_cosine
from decodekit.train.sequences import answer, load_sequences, write_sequences


def test_warmup_cosine_warms_up_anneals_to_zero_and_follows_a_new_total():
    shape = WarmupCosine(100, 0.1)
    assert shape(0) == pytest.approx(0.1) and shape(9) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.09)))
    assert shape(50) == pytest.approx(0.5) and shape(100) == pytest.approx(0.0, abs=1e-12)
    shape.total = 20  # a time budget shortened the run: the cosine now ends at step 20
    assert shape(10) == pytest.approx(0.5) and shape(20) == pytest.approx(0.0, abs=1e-12)


def test_warmup_cosine_total_survives_a_checkpoint():
    weight = torch.nn.Parameter(torch.zeros(1))
    schedule = warmup_cosine(torch.optim.SGD([weight], lr=1.0), 100, 0.0)
    schedule.lr_lambdas[0].total = 30
    state = schedule.state_dict()
    fresh = warmup_cosine(torch.optim.SGD([weight], lr=1.0), 100, 0.0)
    fresh.load_state_dict(state)
    assert fresh.lr_lambdas[0].total == 30


def test_budgeted_steps_counts_steps_and_validations_in_the_time_left():
    # 60 s left; a step 0.5 s and a 5 s validation every 10 steps: 1 s a step on average.
    assert budgeted_steps(100.0, 40.0, 12, 0.5, 5.0, 10) == 12 + 60
    assert budgeted_steps(10.0, 40.0, 12, 0.5, 5.0, 10) == 13  # over budget already: one more step, not fewer


def test_answer_batches_by_length_and_returns_each_prompts_own_greedy_response(target, ragged_prompts):
    out = answer(target, ragged_prompts, max_new_tokens=6, batch_size=2, progress=False)
    alone = [dk.generate(target, [p], max_new_tokens=6).sequences[0] for p in ragged_prompts]
    assert out == alone


def test_sequences_are_cached_with_their_response_starts(target, ragged_prompts, tmp_path):
    cfg = {"max_new_tokens": 4, "gen_batch_size": 3}
    chunks = [[5, 6, 7, 8], [9, 10, 11, 12]]
    seqs, starts = write_sequences(target, ragged_prompts, chunks, cfg, tmp_path, progress=False)
    assert starts == [len(p) for p in ragged_prompts] + [0, 0]
    assert all(s[: len(p)] == p and len(s) > len(p) for s, p in zip(seqs, ragged_prompts)) and seqs[-2:] == chunks
    assert json.loads((tmp_path / "starts.json").read_text()) == starts
    # read back without rebuilding (this model has no tokenizer, so a rebuild would fail)
    assert load_sequences(target, cfg, tmp_path, 0, False) == (seqs, starts)


def test_reused_sequences_built_with_other_knobs_are_named(tmp_path):
    """A data directory records the knobs its sequences were built with; a run that asks for others reuses them
    with a warning naming both (``text_chunks=0``, the responses only, is no difference)."""
    import warnings

    from decodekit.train.sequences import check_data_plan

    built = {"chat_prompts": 128, "code_prompts": 128, "text_chunks": 64, "max_new_tokens": 128}
    check_data_plan(tmp_path, built, 0, record=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_data_plan(tmp_path, built, 0, record=False)  # the same knobs: quiet
        check_data_plan(tmp_path, {**built, "text_chunks": 0}, 0, record=False)  # the responses only
    with pytest.warns(
        UserWarning, match=r"built with text_chunks=64, seed=0; this run asks for text_chunks=512, seed=3"
    ):
        check_data_plan(tmp_path, {**built, "text_chunks": 512}, 3, record=False)


def test_target_features_keep_the_starts_of_the_sequences_they_keep(target):
    from decodekit.train.feature_data import target_features

    lm = dk.load_model(target)
    seqs, starts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]], [2, 1, 0]  # the 2-token sequence is dropped
    data = target_features(lm, seqs, seq_len=4, batch_size=2, progress=False, starts=starts)
    assert data["lengths"].tolist() == [4, 3] and data["starts"].tolist() == [2, 0]
    assert "starts" not in target_features(lm, seqs, seq_len=4, batch_size=2, progress=False)


def test_zero_prompts_asked_for_are_none():
    """``code_prompts=0`` / ``chat_prompts=0`` in a recipe: no prompts, not every prompt the corpus gives (the
    loops stopped on ``len == num`` after appending, which 0 never meets)."""
    from decodekit.train.acceptance_data import pydoc_prompts
    from decodekit.train.sequences import code_prompts

    assert code_prompts(None, 0, 64) == [] and pydoc_prompts(None, 0, 64) == []  # no tokenizer call either


def test_states_of_length_sorted_batches_are_each_sequence_alone(target, tmp_path):
    """Features and layer states are computed in batches of similar length, each cut to its longest row: every
    row's states equal its own unpadded forward's, and are zero past its length."""
    from decodekit.train.feature_data import target_features
    from decodekit.train.layer_features import cached_layer_states, final_states, layer_states

    lm = dk.load_model(target)
    seqs = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 0], [9, 8, 7, 6], [1, 2, 3], [4, 0, 0, 5, 6]]  # 0 is also the pad id
    data = target_features(lm, seqs, seq_len=6, batch_size=2, progress=False)
    taps = cached_layer_states(lm, data["tokens"], data["lengths"], (1, 2), tmp_path, 2, False)
    for i, s in enumerate(seqs):
        n, alone = min(len(s), 6), torch.tensor([s[:6]])
        torch.testing.assert_close(data["feats"][i, :n], final_states(lm, alone)[0].half(), atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(taps[i, :n], layer_states(lm, alone, (1, 2))[0].half(), atol=1e-3, rtol=1e-3)
        assert not data["feats"][i, n:].any() and not taps[i, n:].any()


@pytest.mark.parametrize("recipe", ["eagle", "eagle3", "medusa", "exit_head", "dflash", "flexdraft"])
@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"device": "gpu0"}, "device must be a device"),
        ({"time_budget_s": 0}, "time_budget_s"),
        ({"online": 1}, "online"),
    ],
)
def test_feature_head_recipes_refuse_bad_run_settings_before_loading(tmp_path, recipe, bad, match):
    import importlib

    train = importlib.import_module(f"decodekit.train.{recipe}").train
    with pytest.raises(dk.ConfigError, match=match):
        train(tmp_path, base="no-such-model", **bad)  # refused before the (missing) target is looked up
    assert not any(tmp_path.iterdir())


def test_cached_features_built_with_other_knobs_are_named_too(target, tmp_path):
    """The warning holds where the features are already cached (no sequences are read then)."""
    from decodekit.train.feature_data import prepare
    from decodekit.train.sequences import check_data_plan

    lm = dk.load_model(target)
    seqs, starts = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 9, 1], [9, 8, 7, 6, 2], [1, 2, 3], [4, 7, 7, 5, 6]], [2, 1, 2, 1, 0]
    (tmp_path / "sequences.json").write_text(json.dumps(seqs))
    (tmp_path / "starts.json").write_text(json.dumps(starts))
    cfg = {"chat_prompts": 1, "code_prompts": 4, "text_chunks": 1, "max_prompt_tokens": 4, "max_new_tokens": 4,
           "seq_len": 6, "gen_batch_size": 2}  # fmt: skip
    check_data_plan(tmp_path, cfg, 0, record=True)
    prepare(lm, cfg, tmp_path, train_vocab=16, val_fraction=0.4, seed=0, progress=False)
    assert (tmp_path / "features.pt").is_file()
    with pytest.warns(UserWarning, match="built with text_chunks=1; this run asks for text_chunks=8"):
        data = prepare(
            lm, {**cfg, "text_chunks": 8}, tmp_path, train_vocab=16, val_fraction=0.4, seed=0, progress=False
        )
    assert data.summary()["data_plan"]["text_chunks"] == 1  # a head's metadata records the data it was trained on
    with pytest.warns(UserWarning, match="built with seq_len=6; this run asks for seq_len=16"):  # cut when cached
        data = prepare(lm, {**cfg, "seq_len": 16}, tmp_path, train_vocab=16, val_fraction=0.4, seed=0, progress=False)
    assert data.summary()["data_plan"]["seq_len"] == 6


def test_one_forward_gives_the_features_and_the_layer_states_the_second_pass_would(target, tmp_path):
    """``prepare(..., layers=...)`` (EAGLE-3's cached run) keeps the layer states from the features' forward;
    ``cached_layer_states`` then reads them instead of running the target again, and they equal its own pass."""
    from decodekit.train.feature_data import prepare
    from decodekit.train.layer_features import cached_layer_states, layers_file

    lm = dk.load_model(target)
    seqs, starts = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 9, 1], [9, 8, 7, 6, 2], [1, 2, 3], [4, 7, 7, 5, 6]], [2, 1, 2, 1, 0]
    (tmp_path / "sequences.json").write_text(json.dumps(seqs))
    (tmp_path / "starts.json").write_text(json.dumps(starts))
    cfg = {"chat_prompts": 1, "code_prompts": 4, "text_chunks": 1, "max_prompt_tokens": 4, "max_new_tokens": 4,
           "seq_len": 6, "gen_batch_size": 2}  # fmt: skip
    data = prepare(lm, cfg, tmp_path, train_vocab=16, val_fraction=0.4, seed=0, progress=False, layers=(1, 2))
    assert layers_file(tmp_path, (1, 2)).is_file()
    read = cached_layer_states(lm, data.tokens, data.lengths, (1, 2), tmp_path, 2, False)
    (tmp_path / "elsewhere").mkdir()
    fresh = cached_layer_states(lm, data.tokens, data.lengths, (1, 2), tmp_path / "elsewhere", 2, False)
    torch.testing.assert_close(read, fresh, atol=1e-3, rtol=1e-3)
    assert read.abs().sum() > 0


def test_data_passes_run_on_a_packed_copy_only_while_there_is_data_to_compute(target, tmp_path):
    from decodekit.kernels.cpu import PackedLinear
    from decodekit.train.feature_heads import data_target

    lm = dk.load_model(target)
    copy = data_target(lm, tmp_path)
    assert copy is not lm and any(isinstance(m, PackedLinear) for m in copy.hf.modules())
    assert not any(isinstance(m, PackedLinear) for m in lm.hf.modules())  # the target itself is left as it is
    (tmp_path / "features.pt").write_bytes(b"")
    assert data_target(lm, tmp_path) is lm  # nothing to compute: no copy
