"""Training checkpoints (``decodekit.train.common.Checkpoints``) keep a model's trainable parameters only (a LoRA
adapter's base model stays out of them), resume restores those, and a checkpoint of another model is refused."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from safetensors import safe_open

from decodekit.errors import ConfigError
from decodekit.train.common import Checkpoints


def run(out, trainable: str = "adapter"):
    """A frozen 'base' and a trainable layer, prepared with an optimizer as the recipes do."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"base": torch.nn.Linear(8, 8), trainable: torch.nn.Linear(8, 2)})
    model["base"].requires_grad_(False)
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, optimizer, Checkpoints(accelerator, out)


def test_a_checkpoint_holds_the_trainable_parameters_and_resume_restores_them(tmp_path):
    model, optimizer, checkpoints = run(tmp_path)
    model["adapter"](torch.randn(3, 8)).sum().backward()
    optimizer.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    checkpoints.save(5, {"train": [[5, 1.0]]})
    with safe_open(str(tmp_path / "checkpoints" / "step_0000005" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == {"adapter.weight", "adapter.bias"}  # the frozen base left out

    model, _, checkpoints = run(tmp_path)  # a fresh run: the base as loaded, the adapter re-initialised
    with torch.no_grad():
        model["adapter"].weight.zero_()
    step, history = checkpoints.resume()
    assert step == 5 and history == {"train": [[5, 1.0]]}
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k  # the adapter restored, the base what it was


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    _, _, checkpoints = run(tmp_path)
    checkpoints.save(1, {"train": []})
    _, _, other = run(tmp_path, trainable="head")
    with pytest.raises(ConfigError, match="lacks 2 of this run's trainable parameters .*head.bias"):
        other.resume()


def test_a_fresh_run_removes_an_earlier_runs_checkpoints_so_a_later_resume_cannot_take_them(tmp_path):
    """A rerun into the same directory without resume once kept the earlier run's checkpoints (a same-numbered step
    was never replaced), and a later resume=true continued that earlier run in silence."""
    _, _, earlier = run(tmp_path)
    earlier.save(3, {"train": [[3, 9.0]]})
    earlier.save(6, {"train": [[6, 9.0]]})
    _, _, fresh = run(tmp_path)
    with pytest.warns(UserWarning, match=r"a fresh run \(resume=false\) .* removing the 2 checkpoint\(s\)"):
        assert fresh.start(resume=False) is None
    fresh.save(3, {"train": [[3, 1.0]]})
    _, _, resumed = run(tmp_path)
    assert resumed.start(resume=True) == (3, {"train": [[3, 1.0]]})  # this run's, not the earlier run's step 6
