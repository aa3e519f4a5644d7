"""The EAGLE-1, Medusa and exit-head recipes with the target's features computed per batch (``online``: the path a
GPU takes, where nothing is cached), run here on the CPU: they start where the cached path starts, write their head,
and a time budget fixes the step count after the timed probe steps (the EAGLE-3 recipe's own test covers it)."""

from __future__ import annotations

import pytest

from decodekit.train import eagle, exit_head, medusa
from decodekit.train.common import BUDGET_PROBE
from tests.integration.test_eagle_recipe import ONE_VOCAB

pytestmark = pytest.mark.slow

RECIPES = {
    "eagle": (eagle.train, {"noise": 0.0}),  # no random feature noise in the validation loss
    "medusa": (medusa.train, {}),
    "exit_head": (exit_head.train, {"exit_layer": 3, "width": 64}),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_online_features_train_like_the_cached_ones_within_a_time_budget(tmp_path, recipe):
    run, extra = RECIPES[recipe]
    small, data = {**ONE_VOCAB, **extra}, tmp_path / "data"
    online = run(tmp_path / "online", epochs=100, device="cpu", online=True, time_budget_s=1e-3, data_dir=str(data),
                 **small)  # fmt: skip
    assert (data / "sequences.json").is_file() and not (data / "features.pt").exists()
    assert online["steps"] == BUDGET_PROBE + 3  # 2 warm-up steps, the timed ones, then one the budget allows
    assert (tmp_path / "online" / f"{recipe}_smollm2-135m-instruct.safetensors").is_file()
    cached = run(tmp_path / "cached", epochs=1, data_dir=str(data), **small)
    assert (data / "features.pt").is_file()
    assert online["initial_val_loss"] == pytest.approx(cached["initial_val_loss"], rel=1e-3)
    assert online["vocab"]["sizes"].keys() == cached["vocab"]["sizes"].keys()
