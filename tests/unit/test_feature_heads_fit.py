"""The feature heads' training loop (:func:`decodekit.train.feature_heads.fit`): epochs, or a wall-clock budget that
fixes the step count (and the cosine schedule) once the first steps are timed."""

from __future__ import annotations

import torch

from decodekit.train.common import BUDGET_PROBE
from decodekit.train.feature_data import FeatureData
from decodekit.train.feature_heads import fit


def run(tmp_path, **kwargs):
    n = 40
    data = FeatureData(
        torch.zeros(n, 4, dtype=torch.long), torch.full((n,), 4), None, torch.zeros(n, dtype=torch.long),
        torch.arange(n) % 10 == 0, torch.arange(4), 0.0,
    )  # fmt: skip
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    y = x @ torch.tensor([1.0, -2.0, 0.5])
    torch.manual_seed(0)
    head = torch.nn.Linear(3, 1)

    def batch_loss(idx):
        idx = idx.cpu()
        return ((head(x[idx])[:, 0] - y[idx]) ** 2).mean(), {"acc": 0.0}

    common = dict(batch_size=4, lr=0.3, weight_decay=0.0, warmup=0.0, save_every=1000, resume=False, seed=0)
    return fit(head, batch_loss, data, tmp_path, progress=False, desc="test", **common, **kwargs)


def test_epochs_run_in_full_and_validate_each(tmp_path):
    _, history, numbers = run(tmp_path, epochs=6)
    assert numbers["steps"] == 6 * 9  # 36 training rows in batches of 4
    assert [s for s, _ in history["val"]] == [0, 9, 18, 27, 36, 45, 54]
    assert numbers["final_val_loss"] < 0.1 * numbers["initial_val_loss"]


def test_a_time_budget_stops_after_the_steps_it_allows(tmp_path):
    _, history, numbers = run(tmp_path, epochs=1000, time_budget_s=1e-6)
    assert numbers["steps"] == BUDGET_PROBE + 3  # 2 warm-up steps, the timed ones, then at least one more
    assert [s for s, _ in history["val"]] == [0, 9, BUDGET_PROBE + 3]  # each epoch, and where it stopped
