"""The EAGLE-3 recipe on SmolLM2 cut to 8 layers (``smollm2_cut``; a smoke run: files, the layers in the head file,
an export read back, resume) and the shipped head on the full SmolLM2 (greedy output equal to plain decoding, with
drafts accepted, alone and backing suffix lookup)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import decodekit as dk
from decodekit.drafters.eagle3 import DEFAULT_WEIGHTS, Eagle3Drafter
from decodekit.drafters.eagle3_head import Eagle3ReleaseHead
from decodekit.errors import ConfigError
from decodekit.resources import shipped_weights
from decodekit.train.eagle3 import train
from tests.conftest import CUT
from tests.integration.head_prompts import HEAD_NEW, head_prompts
from tests.integration.test_eagle_recipe import ONE_VOCAB as SMALL_ONE
from tests.integration.test_eagle_recipe import SMALL

# the recipe's own learning rate: the released architecture starts close to the target (fuse fitted to the state its
# copied layer reads), which the EAGLE smoke runs' 3e-3 overshoots in these 6 steps (val loss 10.5 -> 13.1; 10.0 here)
ONE_VOCAB = {**SMALL_ONE, "lr": 5e-4}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, smollm2_cut) -> tuple[Path, dict]:
    """A 2-epoch smoke run: its folder and summary (the smoke test resumes it; the continued head starts from it).
    One draft vocabulary size: picking between sizes is the EAGLE recipe's smoke test (the same picker)."""
    out = tmp_path_factory.mktemp("eagle3_smoke")
    return out, train(out, base=smollm2_cut, epochs=2, export="speculators", **ONE_VOCAB)


def test_smoke_run_writes_a_head_that_names_its_layers_and_resumes(smoke_run, smollm2_cut):
    tmp_path, summary = smoke_run
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    assert summary["layers"] == [2, 4, 5] and summary["fuse_fit_error"] < 1.0  # 2, L // 2, L - 3 of 8 layers
    path = tmp_path / f"eagle3_{CUT}.safetensors"
    for name in (path.name, "loss.png", "summary.json", "history.json", "data/layers_2-4-5.pt"):
        assert (tmp_path / name).is_file()
    drafter = Eagle3Drafter(path, target=smollm2_cut)
    assert drafter.hidden_layers == (2, 4, 5) and len(drafter.head.vocab) == summary["vocab"]["picked"]
    assert isinstance(drafter.head, Eagle3ReleaseHead)  # the default architecture: EAGLE-3's own, exportable
    exported = Eagle3Drafter(str(tmp_path / f"eagle3_{CUT}_speculators"), target=smollm2_cut)  # export=speculators
    assert exported.hidden_layers == (2, 4, 5) and torch.equal(exported.head.vocab, drafter.head.vocab.sort().values)
    resumed = train(tmp_path, base=smollm2_cut, epochs=3, resume=True, export="eagle", **ONE_VOCAB)  # cached states
    assert (tmp_path / f"eagle3_{CUT}_eagle" / "config.json").is_file()
    assert resumed["steps"] == summary["steps"] * 3 // 2


def test_online_states_train_like_the_cached_ones_within_a_time_budget(smoke_run, tmp_path, monkeypatch, smollm2_cut):
    """``online`` (the GPU path: the target runs on each batch, nothing cached) on the smoke run's data starts where
    the smoke run's cached states started (the same sequences, split and initial head), and caches nothing; a time
    budget fixes the step count after the timed probe steps (3 here instead of the recipes' 10, to save online
    steps)."""
    from decodekit.train import feature_heads

    monkeypatch.setattr(feature_heads, "BUDGET_PROBE", 3)
    data = smoke_run[0] / "data"
    files = {p.name: p.stat().st_mtime_ns for p in data.iterdir()}
    small = {**ONE_VOCAB, "base": smollm2_cut}
    online = train(tmp_path, epochs=100, online=True, time_budget_s=1e-3, data_dir=str(data), **small)
    assert {p.name: p.stat().st_mtime_ns for p in data.iterdir()} == files  # read the sequences, wrote nothing
    assert online["steps"] == 3 + 3  # 2 warm-up steps, the timed ones, then one the budget allows
    assert online["initial_val_loss"] == pytest.approx(smoke_run[1]["initial_val_loss"], rel=1e-3)


def test_self_instruct_requests_join_the_data(smollm2, tmp_path):
    """``self_instruct`` (EAGLE-3's key): a chat request SmolLM2 writes after its own template's system part joins
    the sequences, answered (a model cut to a few layers writes none that end)."""
    from decodekit.train.sequences import load_sequences

    cfg = {"chat_prompts": 0, "code_prompts": 0, "text_chunks": 1, "max_prompt_tokens": 128, "max_new_tokens": 8,
           "seq_len": 64, "gen_batch_size": 4, "self_instruct": 1}  # fmt: skip
    seqs, starts = load_sequences(smollm2, cfg, tmp_path, seed=0, progress=False)
    assert len(seqs) == 2 and starts[1] == 0 and len(seqs[0]) > starts[0] > 0  # the request, answered; one chunk
    request = smollm2.tokenizer.decode(seqs[0][: starts[0]])
    assert "<|im_start|>user\n" in request and request.endswith("<|im_start|>assistant\n")


def test_a_continued_head_keeps_its_draft_vocabulary_on_other_data(smoke_run, tmp_path, smollm2_cut):
    """``init`` an EAGLE-3 head of the same layers with ``init_vocab``: its fuse and its draft vocabulary carry over,
    whatever the new data's token counts."""
    path = smoke_run[0] / f"eagle3_{CUT}.safetensors"
    kept = Eagle3Drafter(path, target=smollm2_cut).head.vocab
    settings = {**SMALL, "base": smollm2_cut, "chat_prompts": 3, "code_prompts": 0, "vocab_sizes": [len(kept)]}
    again = train(tmp_path / "again", epochs=1, init=str(path), init_vocab=True, seed=1, **settings)
    assert again["fuse_fit_error"] is None  # continued with the init head's fuse
    head = Eagle3Drafter(tmp_path / "again" / path.name, target=smollm2_cut).head
    assert torch.equal(head.vocab, kept)


def test_an_fc_head_of_the_same_layers_starts_a_released_one(smoke_run, tmp_path, smollm2_cut):
    """``architecture=eagle3 init=<an fc EAGLE-3 head>``: the fc head mapped onto the released layer
    (:func:`~decodekit.train.eagle3_start.from_fc_head`, its ``fuse`` kept), whose first draft step is the fc head's
    up to the embedding's share of the residual: on the same held-out split it starts where the fc head ended."""
    data = {"data_dir": str(smoke_run[0] / "data"), "base": smollm2_cut, "epochs": 1}
    fc = train(tmp_path / "fc", architecture="fc", **data, **ONE_VOCAB)
    path = tmp_path / "fc" / f"eagle3_{CUT}.safetensors"
    released = train(tmp_path / "released", init=str(path), **data, **ONE_VOCAB)
    assert released["fuse_fit_error"] is None and 0.8 < released["converted_from_fc"]["scale_feature"] < 1.2
    assert abs(released["initial_val_top1_agreement"] - fc["final_val_top1_agreement"]) < 0.05
    assert isinstance(Eagle3Drafter(tmp_path / "released" / path.name, target=smollm2_cut).head, Eagle3ReleaseHead)
    cached = sorted(p.name for p in (smoke_run[0] / "data").iterdir())
    with pytest.raises(ConfigError, match=r"reads layers \[2, 4, 5\] and this run reads \[1, 4, 5\]"):
        train(tmp_path / "other", init=str(path), layers=[1, 4, 5], **data, **ONE_VOCAB)
    assert sorted(p.name for p in (smoke_run[0] / "data").iterdir()) == cached  # refused before any states


def test_layers_outside_the_target_and_an_init_of_another_architecture_are_refused_before_any_data(tmp_path):
    from decodekit.drafters.eagle import DEFAULT_WEIGHTS as EAGLE1

    with pytest.raises(ConfigError, match="layers must be decoder layers 1 .. 30"):
        train(tmp_path, layers=[2, 31], **SMALL)
    with pytest.raises(ConfigError, match="architecture='eagle3': pass architecture=fc"):
        train(tmp_path, init=str(shipped_weights(EAGLE1)), **SMALL)  # an EAGLE-1 head: fc, reading no taps
    with pytest.raises(ConfigError, match="export=eagle writes an EAGLE-3 head of the released architecture"):
        train(tmp_path, architecture="fc", export="eagle", **SMALL)
    assert not (tmp_path / "data").exists()


def test_shipped_head_and_lookup_backed_by_it_are_greedy_decoding_on_packed_kernels():
    """The zoo's target with its oneDNN kernels, as the benchmark runs it (the head takes them too): the shipped head's
    greedy output is plain decoding's, with drafts accepted and every round checked; suffix lookup backed by the
    head is too, and commits more a round than the head alone; it samples too. (The head on stock kernels: the
    README's example, and tests/unit/test_eagle3.py on a tiny target.)"""
    assert shipped_weights(DEFAULT_WEIGHTS).is_file()
    smollm2 = dk.load_model("smollm2-135m-instruct", kernels="onednn")
    ids = head_prompts(smollm2.tokenizer)
    plain = dk.generate(smollm2, ids, max_new_tokens=HEAD_NEW)
    policy = dk.policies.FixedLength(16, depth=16)
    head = dk.generate(smollm2, ids, dk.build("drafter", "eagle3"), max_new_tokens=HEAD_NEW, debug=True)
    assert head.stats.mean_acceptance_length > 1.05
    lookup = dk.generate(
        smollm2, ids, dk.build("drafter", "lookup_eagle3"), policy=policy, max_new_tokens=HEAD_NEW, debug=True
    )
    assert lookup.sequences == plain.sequences == head.sequences
    assert lookup.stats.mean_acceptance_length > head.stats.mean_acceptance_length
    sampled = dk.generate(
        smollm2, ids, dk.build("drafter", "lookup_eagle3"), policy=policy, max_new_tokens=8, temperature=0.8, seed=0
    )
    assert all(0 < len(s) <= 8 for s in sampled.sequences)
