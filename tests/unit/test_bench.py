"""The benchmark harness on tiny models: every method runs, greedy outputs match, reports are written."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

import decodekit as dk
from decodekit.bench.machine import machine_info
from decodekit.bench.methods import Method, Run, Setting, TransformersBaseline
from decodekit.bench.report import markdown, save
from decodekit.bench.runner import run_benchmark
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
        model,
        prompts,
        methods,
        settings=settings,
        batch_sizes=[1, 2],
        max_new_tokens=8,
        passes=2,
        progress=False,
        reruns=0,  # what is checked is not the times: no re-runs of calls the other xdist worker disturbed
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
            assert r.greedy_match == 1.0 and r.greedy_diffs == [], r.method
        assert r.speedup is not None and r.speedup > 0
    assert "| 4/4 |" in markdown(rows) and "Greedy outputs that differ" not in markdown(rows)


def test_zero_overhead_speedup_comes_from_measured_acceptance(results):
    _, rows = results
    for r in rows:
        if r.method.startswith("draft model"):
            assert r.zero_overhead is not None and 0 < r.zero_overhead <= r.ceiling
            assert r.stats.drafted > 0 and r.stats.mean_acceptance_length > 1.0
        if r.method.startswith("transformers"):
            assert r.zero_overhead is None and r.stats is None


def test_calls_are_interleaved_and_all_kept(results):
    """Every timed call is recorded; on each batch all methods run back to back, in an order that rotates."""
    _, rows = results
    group = [r for r in rows if (r.setting, r.batch_size) == ("greedy", 1)]
    for r in group:
        assert len(r.calls) == 2 * 4  # passes x batches
        assert {(c.pass_index, c.batch) for c in r.calls} == {(p, b) for p in range(2) for b in range(4)}
        assert len({c.order for c in r.calls}) > 1  # not always at the same place in the order
        low, high = r.speedup_range
        assert low <= r.speedup <= high and len(r.pass_decode_s) == 2
    for p, b in [(0, 0), (1, 3)]:  # one batch's calls: each method once, positions 0 .. n-1
        assert sorted(c.order for r in group for c in r.calls if (c.pass_index, c.batch) == (p, b)) == list(
            range(len(group))
        )


def test_reports_are_written(results, tmp_path):
    model, rows = results
    table = save(rows, tmp_path, machine_info(model), {"max_new_tokens": 16})
    assert "| ngram k=3 |" in table and "greedy, batch 2" in table
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["results"]) == len(rows) and "cpu" in data["machine"]
    assert {"cpu_count", "cpus_usable", "torch_threads", "gpu", "git_commit", "torch"} <= set(data["machine"])
    assert len(data["results"][0]["calls"]) == 2 * 4 and "warnings" in data
    assert "(" in table.split("| ngram k=3 |")[1].split("|")[2]  # speedup with its min-max spread
    assert (tmp_path / "speedup.png").stat().st_size > 10_000
    assert markdown(rows).count("| autoregressive |") == 4


def test_tokens_per_forward_and_the_lookup_bound(results):
    """Every greedy table reads the lookup drafters against the context-lookup bound; transformers' forwards are
    counted at batch 1 (greedy: one a token)."""
    _, rows = results
    one = {r.method: r for r in rows if (r.setting, r.batch_size) == ("greedy", 1)}
    assert one["transformers greedy"].tokens_per_forward == 1.0
    assert one["ngram k=3"].tokens_per_forward == one["ngram k=3"].stats.tokens_per_step
    looked_up = one["transformers prompt lookup k=3"].tokens_per_forward
    assert looked_up is not None and 1.0 <= looked_up <= one["ngram k=3"].lookup_bound[4] + 1e-9
    assert one["ngram k=3"].tokens_per_forward <= one["ngram k=3"].lookup_bound[4] + 1e-9  # drafts of 3 <= 4
    assert all(r.tokens_per_forward is None for r in rows if r.batch_size == 2 and r.stats is None)
    assert all(r.lookup_bound is None for r in rows if r.setting != "greedy")
    assert "Context-lookup bound, tokens a forward" in markdown([r for r in rows if r.setting == "greedy"])
    assert "Context-lookup bound" not in markdown([r for r in rows if r.setting != "greedy"])


@dataclass
class EditedAutoregressive:
    """Autoregressive decoding whose output is edited per prompt: stands in for a method with a bug."""

    name: str
    edits: dict[tuple[int, ...], Callable[[list[int]], list[int]]] = field(default_factory=dict)
    max_batch: int | None = 1

    def generate(self, model, prompts, setting, max_new_tokens, seed) -> Run:
        run = Method(self.name).generate(model, prompts, setting, max_new_tokens, seed)
        sequences = [self.edits.get(tuple(p), list)(s) for p, s in zip(prompts, run.sequences)]
        return Run(sequences, run.wall_s, run.prefill_s, run.stats)


def test_greedy_differences_are_explained(tmp_path):
    """A near-tie, a wrong token and an early stop are told apart in the table and in results.json."""
    prompts = [[5, 6, 7, 8, 5, 6], [1, 2, 3], [9, 9, 9, 9, 9, 4, 2], [3, 1]]
    base = tiny_llama(0)
    plain = dk.generate(dk.load_model(base), prompts, max_new_tokens=8).sequences
    a = plain[0][2]
    b = max(set(range(128)) - {t for seq in prompts + plain for t in seq})  # never chosen, never an input
    target = copy.deepcopy(base)
    with torch.no_grad():
        target.lm_head.weight[b] = target.lm_head.weight[a]  # b's logit is a's everywhere: an exact tie
    model = dk.load_model(target)
    plain = [dk.generate(model, [p], max_new_tokens=8).sequences[0] for p in prompts]  # batch 1, as benched
    tie_at = next(i for i, t in enumerate(plain[0]) if t in (a, b))
    with torch.no_grad():
        worst = int(target(torch.tensor([prompts[1] + plain[1][:3]])).logits[0, -1].argmin())

    def swap(position: int, token: int) -> Callable[[list[int]], list[int]]:
        return lambda s: s[:position] + [token] + s[position + 1 :]

    edits = {
        tuple(prompts[0]): swap(tie_at, a + b - plain[0][tie_at]),
        tuple(prompts[1]): swap(3, worst),
        tuple(prompts[2]): lambda s: s[:5],
    }
    methods = [Method("autoregressive"), EditedAutoregressive("edited", edits)]
    ids = ["p0", "p1", "p2", "p3"]
    rows = run_benchmark(model, prompts, methods, max_new_tokens=8, progress=False, prompt_ids=ids, reruns=0)
    edited = rows[1]
    assert edited.greedy_match == 0.25
    assert [(d.prompt, d.position, d.verdict) for d in edited.greedy_diffs] == [
        ("p0", tie_at, "near_tie"),
        ("p1", 3, "mismatch"),
        ("p2", 5, "length"),
    ]
    table = markdown(rows)
    assert "| 1/4 (1 near-tie, 1 MISMATCH, 1 LENGTH) |" in table and "| 4/4 |" in table
    assert "- edited: prompt p1, token 3:" in table and "MISMATCH" in table.split("- edited: prompt p1")[1]
    save(rows, tmp_path, machine_info(model))
    diffs = json.loads((tmp_path / "results.json").read_text())["results"][1]["greedy_diffs"]
    assert [(d["prompt"], d["position"], d["verdict"]) for d in diffs] == [
        ("p0", tie_at, "near_tie"),
        ("p1", 3, "mismatch"),
        ("p2", 5, "length"),
    ]
    assert diffs[0]["margin"] <= diffs[0]["tolerance"] and diffs[1]["margin"] >= 0 and diffs[2]["margin"] is None
    assert diffs[1]["candidate_token"] == worst and diffs[1]["suspect"] == "candidate"


@dataclass
class Slowed:
    """A method whose calls take ``delay(pass)`` seconds longer: a slow reference or a noisy machine."""

    name: str
    delay: Callable[[int], float]
    max_batch: int | None = None
    calls: int = 0

    def generate(self, model, prompts, setting, max_new_tokens, seed) -> Run:
        import time

        run = Method(self.name).generate(model, prompts, setting, max_new_tokens, seed)
        extra = self.delay(self.calls)
        self.calls += 1
        time.sleep(extra)
        return Run(run.sequences, run.wall_s + extra, run.prefill_s, run.stats)


def test_warnings_for_a_slow_reference_and_a_wide_spread(tmp_path):
    model = dk.load_model(tiny_llama(0))
    prompts = [[5, 6, 7, 8], [1, 2, 3]]
    slow_reference = Slowed("autoregressive", lambda call: 0.05)
    bursty = Slowed("bursty", lambda call: 0.0 if call < 3 else 0.1)  # warm-up + pass 1 quiet, pass 2 loaded
    methods = [slow_reference, TransformersBaseline("transformers greedy"), bursty]
    rows = run_benchmark(model, prompts, methods, max_new_tokens=6, passes=2, progress=False)
    table = markdown(rows)
    assert "WARNING transformers greedy: transformers' generate is" in table
    assert "WARNING bursty: speedup varies" in table
    save(rows, tmp_path, machine_info(model))
    warnings = json.loads((tmp_path / "results.json").read_text())["warnings"]
    assert any("slow reference" in w for w in warnings) and any("varies" in w for w in warnings)
    quiet = run_benchmark(model, prompts, [Method("autoregressive"), Method("again")], max_new_tokens=6, progress=False)
    assert not any("transformers' generate" in w for r in quiet for w in r.warnings)


def test_oracle_costs_are_profiled_once_per_drafter_and_cached(tmp_path, monkeypatch):
    from decodekit.bench.costs import measured_costs
    from decodekit.drafters import ModelDrafter, NGramDrafter

    model = dk.load_model(tiny_llama(0))
    prompts, machine = [[5, 6, 7, 8], [1, 2, 3]], {"cpu": "test"}
    first = measured_costs(model, NGramDrafter(), prompts, 2, [1, 2], machine, tmp_path, progress=False)
    assert sorted(first) == [1, 2] and len(first[1].draft) == 3
    monkeypatch.setattr("decodekit.policies.profile_costs", lambda *a, **k: pytest.fail("profiled again"))
    assert measured_costs(model, NGramDrafter(), prompts, 2, [1, 2], machine, tmp_path) == first
    with pytest.raises(pytest.fail.Exception, match="profiled again"):  # another drafter, machine or length: new
        measured_costs(model, ModelDrafter(model), prompts, 2, [1, 2], machine, tmp_path)
    with pytest.raises(pytest.fail.Exception, match="profiled again"):
        measured_costs(model, NGramDrafter(), prompts, 2, [1, 2], {"cpu": "other"}, tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 1 and not list(tmp_path.glob("*.tmp"))


def test_speedup_per_task_is_a_ratio_within_each_pass():
    """Two tasks, two passes: the method is 2x on task a and 1x on task b in pass 0, 4x / 1x in pass 1 (a slow
    pass for the reference on task a); per task, the median of the per-pass ratios."""
    from decodekit.bench.report import task_speedups
    from decodekit.bench.results import Call, Result

    def result(name, seconds):  # seconds[pass][prompt]: decode time of 11 tokens (+1 from prefill) per prompt
        calls = [
            Call("greedy", 1, name, p, i, 0, 1, 12, s + 0.5, 0.5)
            for p, row in enumerate(seconds)
            for i, s in enumerate(row)
        ]
        return Result(name, "greedy", 1, 3, 36, 1.0, 0.1, [], calls=calls)

    ref = result("autoregressive", [[2.0, 2.0, 1.0], [4.0, 4.0, 1.0]])
    fast = result("fast", [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    lines = task_speedups([ref, fast], ["a", "a", "b"])
    assert lines[0] == "| method | a | b |" and lines[2] == "| fast | 3.00x | 1.00x |"
    table = markdown([ref, fast], tasks=["a", "a", "b"])
    assert "Speedup per task (greedy, batch 1" in table and "| fast | 3.00x | 1.00x |" in table
    assert "Speedup per task" not in markdown([ref, fast], tasks=["a", "a", "a"])


def test_a_fresh_method_clears_its_components_before_every_call():
    """``Method(fresh=True)`` calls ``clear()`` on each component that has one before each call (outside the timing);
    without it, what a drafter remembers carries over from call to call."""

    class Counted(dk.drafters.RecyclingDrafter):
        def __init__(self) -> None:
            super().__init__("chain4")
            self.cleared: list[bool] = []  # per clear(): whether an earlier call's matrix was there

        def clear(self) -> None:
            self.cleared.append(self.matrix is not None)
            super().clear()

    model = dk.load_model(tiny_llama(0))
    prompts, setting = [[5, 6, 7, 8, 5, 6]], Setting(name="greedy")
    for fresh in (True, False):
        drafter = Counted()
        method = Method("recycling", drafter, policy=dk.policies.FixedLength(4), fresh=fresh)
        for _ in range(2):
            method.generate(model, prompts, setting, max_new_tokens=8, seed=0)
        assert drafter.cleared == ([False, True] if fresh else [])  # the second call found the first's matrix
        assert drafter.matrix is not None


def test_median_time_stops_at_its_budget_after_the_least_calls(monkeypatch):
    """``median_time(budget_s=...)``: calls are timed until they add up to the budget, never fewer than ``least``
    nor more than ``repeats`` (each timed call measured at 0.3 s)."""
    import decodekit.timing as timing

    monkeypatch.setattr(timing, "timed_call", lambda fn, device=None: (fn(), 0.3))
    calls = []
    _, median = timing.median_time(lambda: calls.append(1), repeats=30, budget_s=1.0, least=2)
    assert len(calls) == 1 + 4 and median == pytest.approx(0.3)  # warm-up, then 4 calls of 0.3 s pass 1.0 s
    calls.clear()
    timing.median_time(lambda: calls.append(1), repeats=30, budget_s=1.0, least=8)
    assert len(calls) == 1 + 8  # at least `least`
    calls.clear()
    timing.median_time(lambda: calls.append(1), repeats=3, budget_s=100.0, least=1)
    assert len(calls) == 1 + 3  # never more than `repeats`
    calls.clear()
    timing.median_time(lambda: calls.append(1), repeats=6)
    assert len(calls) == 1 + 6  # no budget: `repeats` calls
