"""``python -m decodekit bench -m ...``: a Hydra multirun is one interleaved benchmark with one table, the reference
measured once, rows named by what ran; sweeps that vary what the jobs must share fail before any model loads.

SmolLM2 and the task prompts are replaced by a tiny random model and fixed token prompts, so this stays fast;
tests/integration runs a sweep on the real model.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
from hydra import compose, initialize_config_dir

import decodekit as dk
from decodekit.bench import tasks
from decodekit.bench.config import ran_config
from decodekit.bench.sweep import Sweep
from decodekit.cli import RECIPES, main
from decodekit.errors import ConfigError
from decodekit.models import zoo
from decodekit.models.tiny import tiny_llama

PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [9, 3, 9, 3, 9], [1, 2, 3, 4]]
QUICK = ["model.kernels=null", "task.num_prompts=2", "max_new_tokens=8", "passes=2", "reruns=0", "progress=false"]
QUIET = ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]


@pytest.fixture
def loads(monkeypatch):
    """Count model and task loads; the zoo model is a tiny random Llama, the task fixed token prompts."""
    counts = Counter()

    def fake_model(name, num_layers=None, dtype=None, device=None, kernels=None):
        assert name in zoo.ZOO
        counts["model"] += 1
        return dk.load_model(tiny_llama(0, layers=num_layers or 2), kernels=kernels)

    def fake_task(name, tokenizer, num_prompts=None, max_prompt_tokens=512, seed=0):
        counts["task"] += 1
        rows = PROMPTS[:num_prompts]
        return datasets.Dataset.from_dict({"id": [f"{name}/{i}" for i in range(len(rows))], "input_ids": rows})

    monkeypatch.setattr(zoo, "load_zoo_model", fake_model)
    monkeypatch.setattr(dk.models, "load_zoo_model", fake_model, raising=False)
    monkeypatch.setattr(tasks, "load_task", fake_task)
    monkeypatch.setattr(sys, "argv", ["decodekit"])
    return counts


def bench(*args: str) -> int:
    """``python -m decodekit bench *args``, in process; its exit status (0 when it returns)."""
    try:
        main(["bench", *args, *QUIET])
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


def test_a_sweep_is_one_benchmark_with_a_row_per_k(loads, tmp_path, capsys):
    passes, batches = 2, 2  # QUICK: 2 passes over 2 prompts at batch 1
    assert bench("-m", "policy.k=2,3", "+baselines.hf={kind:greedy}", *QUICK, f"hydra.sweep.dir={tmp_path}") == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "results.json").read_text())
    rows = data["results"]
    assert [r["method"] for r in rows] == ["autoregressive", "ngram k=2", "ngram k=3", "hf"]
    assert all(r["greedy_match"] == 1.0 for r in rows)
    # the reference ran once per (pass, batch), not once per job, and every row ran in the same passes
    reference = [(c["pass_index"], c["batch"]) for r in rows for c in r["calls"] if c["method"] == "autoregressive"]
    assert sorted(reference) == [(p, b) for p in range(passes) for b in range(batches)]
    for p in range(passes):
        for b in range(batches):
            orders = [c["order"] for r in rows for c in r["calls"] if (c["pass_index"], c["batch"]) == (p, b)]
            assert sorted(orders) == list(range(len(rows)))  # interleaved: all four back to back on this batch
    assert loads == {"model": 1, "task": 1}
    # one table, one results folder: the sweep's; the jobs' folders hold only Hydra's config
    assert out.count("| method |") == 1 and out.count("\n| ngram k=3 |") == 1
    assert f"results: {tmp_path}/results.json" in out
    assert (tmp_path / "results.md").exists() and (tmp_path / "speedup.png").exists()
    assert not list(tmp_path.glob("*/results.*")) and (tmp_path / "1" / ".hydra" / "overrides.yaml").exists()
    config = data["config"]
    assert config["max_new_tokens"] == 8 and config["task"]["num_prompts"] == 2
    assert not {"drafter", "verifier", "policy"} & set(config)  # they vary: each row's spec says what ran
    assert {name: spec.get("policy", {}).get("k") for name, spec in config["methods"].items()} == {
        "autoregressive": None,
        "ngram k=2": 2,
        "ngram k=3": 3,
    }
    jobs = [(job["job"], job["overrides"][0], job["methods"]) for job in config["sweep"]["jobs"]]
    assert jobs == [
        (0, "policy.k=2", ["autoregressive", "ngram k=2"]),
        (1, "policy.k=3", ["autoregressive", "ngram k=3"]),
    ]


@pytest.mark.parametrize(
    ("sweep", "match"),
    [
        (
            ["max_new_tokens=8,16"],
            r"max_new_tokens varies across the sweep: 8 in job 0, 16 in job 1 \(max_new_tokens=16\)\. "
            r".* per max_new_tokens value \(",
        ),
        (
            ["task=humaneval,stdlib"],
            r"task.name varies across the sweep: 'humaneval' in job 0, 'stdlib' in job 1 \(task=stdlib\)\. "
            r".* per task \(",
        ),
        (["batch_sizes=[1],[1,2]"], r"batch_sizes varies across the sweep"),
        (["+baselines.hf={kind:greedy},{kind:prompt_lookup}"], r"baselines.hf.kind varies across the sweep"),
    ],
)
def test_a_sweep_over_what_jobs_share_fails_before_any_model(loads, tmp_path, capsys, sweep, match):
    fixed = [q for q in QUICK if q.split("=")[0] not in {s.split("=")[0] for s in sweep}]
    assert bench("-m", *sweep, *fixed, f"hydra.sweep.dir={tmp_path}") == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err  # the message, no traceback
    assert "a sweep may vary drafter / verifier / policy / methods" in err and re.search(match, err), err
    assert not loads and not (tmp_path / "results.json").exists()


def test_a_bad_override_in_one_job_fails_before_any_model(loads, tmp_path, capsys):
    assert bench("-m", "policy.k=2,abc", *QUICK, f"hydra.sweep.dir={tmp_path}") == 2
    assert "error: policy.k must be an integer >= 0" in capsys.readouterr().err
    assert not loads and not (tmp_path / "results.json").exists()


def test_rows_with_the_same_label_are_told_apart(loads, tmp_path):
    args = ["-m", "drafter.max_ngram=2,3", "policy.k=2", *QUICK, f"hydra.sweep.dir={tmp_path}"]
    assert bench(*args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    labels = ["autoregressive", "ngram k=2 (drafter.max_ngram=2)", "ngram k=2 (drafter.max_ngram=3)"]
    assert [r["method"] for r in data["results"]] == labels
    assert [spec.get("drafter", {}).get("max_ngram") for spec in data["config"]["methods"].values()] == [None, 2, 3]


def test_the_single_run_still_writes_its_own_folder(loads, tmp_path, capsys):
    assert bench("policy.k=2", *QUICK, f"hydra.run.dir={tmp_path}") == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["method"] for r in data["results"]] == ["autoregressive", "ngram k=2"]
    assert data["config"] == json.loads(json.dumps(ran_config(compose_bench(["policy.k=2", *QUICK]))))
    assert f"results: {tmp_path}/results.json" in capsys.readouterr().out


# ------------------------------------------------------------------ the sweep's rows, without running anything
def compose_bench(overrides: list[str]):
    with initialize_config_dir(config_dir=str(Path(RECIPES)), version_base="1.3"):
        return compose("bench", overrides=overrides)


def sweep_of(*jobs: list[str]) -> Sweep:
    """A :class:`Sweep` of jobs composed from these overrides, as Hydra's multirun would add them."""
    sweep = Sweep()
    for num, overrides in enumerate(jobs):
        hydra_cfg = SimpleNamespace(
            overrides=SimpleNamespace(task=overrides),
            job=SimpleNamespace(num=num),
            runtime=SimpleNamespace(output_dir=f"/sweep/{num}"),
            sweep=SimpleNamespace(subdir=str(num)),
        )
        sweep.add(compose_bench(overrides), hydra_cfg)
    return sweep


def test_identical_jobs_add_one_row_and_share_components(loads, capsys):
    sweep = sweep_of(["policy.k=2"], ["policy.k=2"], ["policy.k=4"])
    assert [row.method.name for row in sweep.rows()] == ["autoregressive", "ngram k=2", "ngram k=4"]
    assert "job 1 (policy.k=2) runs no method an earlier job does not" in capsys.readouterr().err
    assert sweep.out_dir == Path("/sweep")
    drafters = [job.methods["speculative"].drafter for job in sweep.jobs]
    assert drafters[0] is drafters[1] is drafters[2]  # one instance per distinct drafter config
    assert not loads


def test_labels_keep_only_the_overrides_that_tell_rows_apart(loads):
    sweep = sweep_of(
        ["drafter.max_ngram=2", "policy.k=4", "verifier=greedy"],
        ["drafter.max_ngram=3", "policy.k=4", "verifier=greedy"],
        ["drafter.max_ngram=3", "policy.k=2", "verifier=greedy"],
    )
    assert [row.method.name for row in sweep.rows()] == [
        "autoregressive",
        "ngram k=4 greedy (drafter.max_ngram=2)",
        "ngram k=4 greedy (drafter.max_ngram=3)",
        "ngram k=2 greedy",
    ]


def test_the_reference_must_be_the_same_in_every_job(loads):
    sweep = sweep_of(["+methods.autoregressive.max_batch=1"], ["+methods.autoregressive.max_batch=2"])
    with pytest.raises(ConfigError, match="the reference method .*'autoregressive'.* differs between job 0 and job 1"):
        sweep.rows()
