"""The benchmark harness on tiny models: every method runs, greedy outputs match, reports are written."""

from __future__ import annotations

import json

import pytest

import decodekit as dk
from decodekit.bench.methods import Method, Setting, TransformersBaseline
from decodekit.bench.report import markdown, save
from decodekit.bench.runner import machine_info, run_benchmark
from decodekit.models.tiny import perturbed, tiny_llama


@pytest.fixture(scope="module")
def results():
    target = tiny_llama(0)
    draft = perturbed(target, 0.3, seed=1)
    model = dk.load_model(target)
    prompts = [[5, 6, 7, 8, 5, 6], [1, 2, 3], [9, 9, 9, 9, 9, 4, 2], [3, 1]]
    methods = [
        Method("autoregressive"),
        Method("ngram k=3", dk.drafters.NGramDrafter(), policy=dk.policies.FixedLength(3)),
        Method("draft model k=3", dk.drafters.ModelDrafter(draft), policy=dk.policies.FixedLength(3)),
        TransformersBaseline("transformers greedy"),
        TransformersBaseline("transformers prompt lookup k=3", "prompt_lookup", k=3),
        TransformersBaseline("transformers assisted k=3", "assisted", k=3, assistant=draft),
    ]
    settings = [Setting(name="greedy"), Setting(name="t0.8", temperature=0.8)]
    return model, run_benchmark(
        model, prompts, methods, settings=settings, batch_sizes=[1, 2], max_new_tokens=16, progress=False
    )


def test_every_method_runs_where_it_can(results):
    _, rows = results
    combos = {(r.setting, r.batch_size, r.method) for r in rows}
    assert ("greedy", 2, "transformers assisted k=3") not in combos  # batch-1 only in transformers
    assert ("t0.8", 1, "transformers assisted k=3") in combos
    assert len(rows) == 2 * (6 + 4)


def test_greedy_outputs_match_autoregressive(results):
    _, rows = results
    for r in rows:
        if r.setting == "greedy":
            assert r.greedy_match == 1.0, r.method
        assert r.speedup is not None and r.speedup > 0


def test_bounds_come_from_measured_acceptance(results):
    _, rows = results
    for r in rows:
        if r.method.startswith("draft model"):
            assert r.bound is not None and 0 < r.bound <= r.ceiling
            assert r.stats.drafted > 0 and r.stats.mean_acceptance_length > 1.0
        if r.method.startswith("transformers"):
            assert r.bound is None and r.stats is None


def test_reports_are_written(results, tmp_path):
    model, rows = results
    table = save(rows, tmp_path, machine_info(model), {"max_new_tokens": 16})
    assert "| ngram k=3 |" in table and "greedy, batch 2" in table
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["results"]) == len(rows) and "cpu" in data["machine"]
    assert (tmp_path / "speedup.png").stat().st_size > 10_000
    assert markdown(rows).count("| autoregressive |") == 4
