"""The EAGLE-1, Medusa and exit-head recipes with the target's features computed per batch (``online``: the path a
GPU takes, where nothing is cached), run here on the CPU on SmolLM2 cut to 8 layers (``smollm2_cut``): they start
where the cached path starts and write their head. The three share one data directory, as recipes may: the target's
responses are built once, by the first online run, and the cached runs share what they cache. A time budget's probe
is :func:`decodekit.train.feature_heads.fit`'s, the same for every head recipe: the EAGLE-3 recipe's online test
covers it."""

from __future__ import annotations

import pytest

from decodekit.train import dflash, eagle, exit_head, flexdraft, medusa
from tests.conftest import CUT
from tests.integration.test_eagle_recipe import ONE_VOCAB

pytestmark = pytest.mark.slow

RECIPES = {
    "eagle": (eagle.train, {"noise": 0.0}),  # no random feature noise in the validation loss
    "medusa": (medusa.train, {}),
    "exit_head": (exit_head.train, {"exit_layer": 3, "width": 64}),
}


def test_online_features_train_like_the_cached_ones(tmp_path, smollm2_cut):
    data = tmp_path / "data"
    settings = {**ONE_VOCAB, "base": smollm2_cut}
    online = {}
    for recipe, (run, extra) in RECIPES.items():
        online[recipe] = run(tmp_path / f"{recipe}_online", epochs=1, device="cpu", online=True, data_dir=str(data),
                             **settings, **extra)  # fmt: skip
        assert online[recipe]["steps"] > 0, recipe
        assert (tmp_path / f"{recipe}_online" / f"{recipe}_{CUT}.safetensors").is_file(), recipe
    assert (data / "sequences.json").is_file() and not (data / "features.pt").exists()  # online caches no features
    for recipe, (run, extra) in RECIPES.items():
        cached = run(tmp_path / f"{recipe}_cached", epochs=1, data_dir=str(data), **settings, **extra)
        assert (data / "features.pt").is_file()
        assert online[recipe]["initial_val_loss"] == pytest.approx(cached["initial_val_loss"], rel=1e-3), recipe
        assert online[recipe]["steps"] == cached["steps"], recipe
        assert online[recipe]["vocab"]["sizes"].keys() == cached["vocab"]["sizes"].keys(), recipe


def passes(monkeypatch) -> list[str]:
    """The data passes a run makes over its sequences (their progress labels)."""
    from decodekit.train import feature_data

    seen, real = [], feature_data.by_length

    def spy(tokens, lengths, batch_size, states, target, desc, progress):
        seen.append(desc)
        return real(tokens, lengths, batch_size, states, target, desc, progress)

    monkeypatch.setattr(feature_data, "by_length", spy)
    return seen


def test_the_dflash_recipe_writes_a_head_that_drafts(tmp_path, smollm2_cut, monkeypatch):
    """The DFlash recipe on the runner (one short epoch, a data directory of its own; its tapped states cached by
    the features' own pass): its head file loads in the ``dflash`` drafter, whose greedy output is plain
    decoding's."""
    import decodekit as dk
    from decodekit.drafters import DFlashDrafter

    seen = passes(monkeypatch)
    summary = dflash.train(tmp_path, epochs=1, device="cpu", **ONE_VOCAB, base=smollm2_cut, block_size=4, anchors=4)
    assert "target layer states" not in seen  # no second pass over the data
    assert summary["steps"] > 0 and summary["vocab"]["picked"] == 1024
    head = tmp_path / f"dflash_{CUT}.safetensors"
    target = dk.load_model(smollm2_cut)
    prompts = [[1, 504, 3107, 28], [1, 9690, 314]]
    plain = dk.generate(target, prompts, max_new_tokens=12, eos_token_id=()).sequences
    out = dk.generate(target, prompts, DFlashDrafter(head), max_new_tokens=12, eos_token_id=(), debug=True)
    assert out.sequences == plain and out.stats.drafted > 0


def test_the_flexdraft_recipe_writes_a_head_that_drafts(tmp_path, smollm2_cut, monkeypatch):
    """The FlexDraft recipe on the runner (one short epoch; the entry states cached by the features' own pass): its
    head file loads in the ``flexdraft`` drafter, whose greedy output is plain decoding's and whose first draft of a
    round, the target's own, is always accepted."""
    import decodekit as dk
    from decodekit.drafters import FlexDraftDrafter

    seen = passes(monkeypatch)
    summary = flexdraft.train(tmp_path, epochs=1, device="cpu", **ONE_VOCAB, base=smollm2_cut, block_size=4, anchors=4)
    assert "target layer states" not in seen  # no second pass over the data
    assert summary["steps"] > 0 and 0 <= summary["vocab"]["accept"] <= 3
    head = tmp_path / f"flexdraft_{CUT}.safetensors"
    target = dk.load_model(smollm2_cut)
    prompts = [[1, 504, 3107, 28], [1, 9690, 314]]
    plain = dk.generate(target, prompts, max_new_tokens=12, eos_token_id=()).sequences
    out = dk.generate(target, prompts, FlexDraftDrafter(head), max_new_tokens=12, eos_token_id=(), debug=True)
    assert out.sequences == plain and out.stats.accepted_per_pos[0] == out.stats.drafted_per_pos[0] > 0
