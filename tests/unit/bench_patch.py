"""The distributed test's three changes to the bench, applied alike in the launched processes (its ``MAIN`` script)
and in the test's own process: each result's outputs kept in ``results.json``; transformers' prompt lookup off by
one token on odd seeds (prompts 1 and 3, one in each process's share), so that both runs explain a greedy
difference; and no ``speedup.png`` (matplotlib's import and the figure: ~3 s a run; the plot is tested in
test_bench.py). Imports nothing heavy until applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def apply(setattr_: Callable[[Any, str, Any], None] = setattr) -> None:
    """Make the three changes with ``setattr_`` (``setattr``, or a ``MonkeyPatch``'s to undo them afterwards)."""
    import decodekit.bench.report as report
    from decodekit.bench.methods import TransformersBaseline

    plain, generate = report.result_dict, TransformersBaseline.generate

    def edited(self, model, prompts, setting, max_new_tokens, seed):
        run = generate(self, model, prompts, setting, max_new_tokens, seed)
        if self.name == "hf_lookup" and seed % 2:
            run.sequences = [s[:2] + [(s[2] + 1) % 128] + s[3:] for s in run.sequences]
        return run

    setattr_(report, "result_dict", lambda result: plain(result) | {"sequences": result.sequences})
    setattr_(TransformersBaseline, "generate", edited)
    setattr_(report, "plot", lambda results, path: None)
