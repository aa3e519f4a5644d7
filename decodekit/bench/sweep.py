"""A Hydra multirun as one benchmark.

``python -m decodekit bench -m policy.k=1,2,4,8`` is a sweep: Hydra composes one config per job, and each job only
checks its config and builds its components (:meth:`Sweep.add`), so a bad override fails before any model is loaded.
Then :meth:`Sweep.run` measures every job's methods in ONE interleaved benchmark (how one config runs:
:mod:`decodekit.bench.run_config`, whose names are also importable from here), because a speedup is a ratio within a
pass of that protocol (``decodekit/bench/runner.py``), never between separately timed runs: the reference and the
transformers baselines run once, each job's other methods add rows named by what ran (``ngram k=4``; ``ngram k=4
(drafter.max_ngram=2)`` where two jobs' methods would share a name), the model loads once, and one table,
``results.json``, ``results.md`` and ``speedup.png`` go to the sweep directory. The jobs must therefore agree on
everything but their methods (model, task, settings, batch sizes, max_new_tokens, seed, passes, baselines); a sweep
that varies one of those is refused before anything is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decodekit.bench.config import COMPONENTS, check_bench_config
from decodekit.bench.run_config import add_oracle_costs as add_oracle_costs
from decodekit.bench.run_config import build_baselines as build_baselines
from decodekit.bench.run_config import build_methods as build_methods
from decodekit.bench.run_config import measure as measure
from decodekit.errors import ConfigError
from decodekit.instantiate import build_component

if TYPE_CHECKING:
    from decodekit.bench.methods import Method, TransformersBaseline

METHOD_KEYS = (*COMPONENTS, "methods")  # what a sweep's jobs may vary; everything else they must agree on
_UNSET = "<unset>"


@dataclass
class Job:
    """One job of a sweep: its number, its overrides (``policy.k=4``), its composed config, its methods by config
    name with each one's resolved spec (canonical JSON, what identifies a method across jobs), and the resolved
    config it must share with every other job."""

    num: int
    overrides: list[str]
    cfg: Any
    methods: dict[str, Method]
    specs: dict[str, str]
    common: dict[str, Any]
    baselines: list[TransformersBaseline]


@dataclass
class Row:
    """A method the sweep measures once: its config name and spec, the jobs that run it, and the method (its
    ``name`` is the row's label)."""

    name: str
    spec: str
    method: Method
    jobs: list[Job] = field(default_factory=list)


class Sweep:
    """A Hydra multirun's jobs, collected by :meth:`add` (one call per job) and measured together by :meth:`run`."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.out_dir: Path | None = None
        self._components: dict[str, Any] = {}  # one instance per distinct component config (a draft model loads once)

    def add(self, cfg: Any, hydra_cfg: Any) -> None:
        """Check one job's config (values, agreement with the jobs before it) and build its components; no model
        of the benchmark is loaded. ``hydra_cfg`` is the job's ``HydraConfig.get()``."""
        from omegaconf import OmegaConf

        check_bench_config(cfg)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        common = {key: value for key, value in resolved.items() if key not in METHOD_KEYS}
        overrides = [str(o) for o in hydra_cfg.overrides.task]
        num = int(hydra_cfg.job.num)
        if self.jobs:
            _check_agreement(self.jobs[0], num, overrides, common)
        out_dir = Path(hydra_cfg.runtime.output_dir)
        for _ in Path(str(hydra_cfg.sweep.subdir)).parts:  # the job's folder is <sweep.dir>/<sweep.subdir>
            out_dir = out_dir.parent
        self.out_dir = self.out_dir or out_dir
        if not self.jobs:  # as run_bench: one of several processes (accelerate launch) joins them before any load
            from decodekit.bench.distributed import init_process

            init_process()
        methods = build_methods(cfg, self._build)
        baselines = build_baselines(cfg, methods)  # every job's are checked; they agree, so the first job's run
        specs = {name: _canonical(resolved["methods"][name]) for name in methods}
        self.jobs.append(Job(num, overrides, cfg, methods, specs, common, baselines))

    def _build(self, cfg: Any, key: str) -> Any:
        """:func:`build_component`, once per distinct resolved config: jobs that share a drafter share its
        instance (methods run one after the other, and every ``generate`` call begins its components afresh)."""
        canonical = _canonical(cfg)
        if canonical not in self._components:
            self._components[canonical] = build_component(cfg, key)
        return self._components[canonical]

    def rows(self) -> list[Row]:
        """The methods to measure: the reference once (it must be the same in every job), then each distinct method
        of the jobs, grouped by config name in order of appearance; labels made unique (:func:`_distinct`)."""
        first = self.jobs[0]
        reference = next(iter(first.specs.items()))
        shared = set.intersection(*(set(job.overrides) for job in self.jobs))
        rows: dict[tuple[str, str], Row] = {}
        for job in self.jobs:
            swept = _named(job.num, [o for o in job.overrides if o not in shared])
            if next(iter(job.specs.items())) != reference:
                raise ConfigError(
                    f"the reference method (the first under methods, {reference[0]!r}) differs between job "
                    f"{first.num} and {swept}: every speedup of a sweep is measured against one reference; vary "
                    "drafter / verifier / policy or the other methods"
                )
            new = False
            for name, spec in job.specs.items():
                row = rows.get((name, spec))
                if row is None:
                    row = rows[name, spec] = Row(name, spec, dataclasses.replace(job.methods[name]))
                    new = True
                row.jobs.append(job)
            if not new:
                message = "runs no method an earlier job does not: its overrides change nothing that runs"
                print(f"note: {swept} {message}, so it adds no row", file=sys.stderr)
        order = list(dict.fromkeys(name for name, _ in rows))
        ordered = sorted(rows.values(), key=lambda row: order.index(row.name))  # stable: job order within a name
        _distinct(ordered)
        return ordered

    def config(self, rows: Sequence[Row]) -> dict[str, Any]:
        """What ``results.json`` records: the config the jobs share, each row's method spec by its label, and each
        job's overrides and the labels of the rows its methods are."""
        labels = {(row.name, row.spec): row.method.name for row in rows}
        jobs = [
            {"job": job.num, "overrides": job.overrides, "methods": [labels[item] for item in job.specs.items()]}
            for job in self.jobs
        ]
        methods = {row.method.name: json.loads(row.spec) for row in rows}
        return self.jobs[0].common | {"methods": methods, "sweep": {"jobs": jobs}}

    def run(self) -> str:
        """Measure every job's methods in one interleaved benchmark, write the reports to the sweep directory and
        return the table."""
        assert self.jobs and self.out_dir is not None, "Sweep.run needs at least one job (Sweep.add)"
        rows = self.rows()
        first = self.jobs[0]
        methods = [*(row.method for row in rows), *first.baselines]
        return measure(first.cfg, methods, self.out_dir, self.config(rows))


def _canonical(value: Any) -> str:
    """A config value (OmegaConf node or plain), resolved, as sorted JSON: equal configs give equal strings."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return json.dumps(value, sort_keys=True, default=str)


def _check_agreement(first: Job, num: int, overrides: list[str], common: dict[str, Any]) -> None:
    """Refuse a job whose non-method config differs from the first job's, naming the key that varies."""
    found = _difference(first.common, common)
    if found is None:
        return
    key, before, after = found
    top = key.split(".")[0].split("[")[0]
    per = top if top in ("task", "model") else f"{top} value"
    job = _named(num, [o for o in overrides if o not in first.overrides])
    raise ConfigError(
        f"{key} varies across the sweep: {before!r} in job {first.num}, {after!r} in {job}. A sweep runs as one "
        "benchmark against one reference, so its jobs must agree on everything but their methods: run one sweep per "
        f"{per} (a sweep may vary drafter / verifier / policy / methods)"
    )


def _named(num: int, overrides: Sequence[str]) -> str:
    """``job 1 (task=stdlib)``: a job by its number and the overrides that tell it apart, for messages."""
    return f"job {num} ({' '.join(overrides)})" if overrides else f"job {num}"


def _difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first key (dotted path) where two resolved configs differ, with both values; None if they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            found = _difference(a.get(key, _UNSET), b.get(key, _UNSET), f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    return None if a == b else (path, a, b)


def _distinct(rows: Sequence[Row]) -> None:
    """Make the rows' labels unique: rows that share a label get the overrides of the job that first ran each,
    less the overrides they all share (``ngram k=4 (drafter.max_ngram=2)``); ``#n`` if that still collides."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.method.name, []).append(row)
    for label, group in groups.items():
        if len(group) == 1:
            continue
        shared = set.intersection(*(set(row.jobs[0].overrides) for row in group))
        for row in group:
            own = [o for o in row.jobs[0].overrides if o not in shared]
            row.method.name = f"{label} ({', '.join(own) if own else f'job {row.jobs[0].num}'})"
    seen: dict[str, int] = {}
    for row in rows:
        seen[row.method.name] = seen.get(row.method.name, 0) + 1
        if seen[row.method.name] > 1:
            row.method.name = f"{row.method.name} #{seen[row.method.name]}"
