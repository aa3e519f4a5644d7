"""Benchmark reports: JSON (everything), a markdown table, a PNG (speedup bars, acceptance per position)."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from decodekit.bench.distributed import current_world
from decodekit.bench.results import Result


def result_dict(result: Result) -> dict[str, Any]:
    """One :class:`Result` as ``results.json`` records it: every field but the outputs, every timed call, the greedy
    differences explained, the derived rates and, for decodekit methods, the median pass's stats."""
    skip = ("sequences", "stats", "greedy_diffs", "calls")
    out = {k: v for k, v in asdict(result).items() if k not in skip}
    out.update(calls=[asdict(c) for c in result.calls])
    out.update(greedy_diffs=[d.to_dict() for d in result.greedy_diffs])
    out.update(decode_s=result.decode_s, tokens_per_s=result.tokens_per_s)
    out.update(decode_tokens_per_s=result.decode_tokens_per_s)
    if result.stats is not None:
        s = result.stats
        out.update(
            mean_acceptance_length=s.mean_acceptance_length,
            tokens_per_step=s.tokens_per_step,
            acceptance_rate_per_pos=s.acceptance_rate_per_pos,
            draft_s=s.draft_time_s,
            verify_s=s.verify_time_s,
            other_s=s.other_time_s,
            rounds=s.rounds,
        )
    return out


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def greedy_match(result: Result) -> str:
    """``12/12``, ``11/12 (1 near-tie)``, ``9/12 (1 near-tie, 1 MISMATCH, 1 LENGTH)``; ``-`` when not greedy.

    Capitals mark what float rounding cannot explain: a token the target did not rank first, or a different stop.
    """
    if result.greedy_match is None:
        return "-"
    same = round(result.greedy_match * result.prompts)
    counts = Counter(d.verdict for d in result.greedy_diffs)
    labels = {"near_tie": "near-tie", "mismatch": "MISMATCH", "length": "LENGTH"}
    notes = ", ".join(f"{counts[v]} {label}" for v, label in labels.items() if counts[v])
    return f"{same}/{result.prompts}" + (f" ({notes})" if notes else "")


def speedup(result: Result) -> str:
    """``1.74x (1.70-1.78)``: the median pass's speedup and the min-max over passes; ``-`` when not measured."""
    if result.speedup is None:
        return "-"
    low, high = result.speedup_range or (result.speedup, result.speedup)
    spread = f" ({low:.2f}-{high:.2f})" if len(result.pass_decode_s) > 1 else ""
    return f"{result.speedup:.2f}x{spread}"


def task_speedups(results: Sequence[Result], tasks: Sequence[str]) -> list[str]:
    """Markdown rows of each method's batch-1 speedup per task (``tasks[i]``: prompt ``i``'s task), for a setting's
    ``results`` (the first is the reference): per pass, the method's decode tokens/s on that task's prompts over
    the reference's on the same prompts in the same pass; the median over passes."""
    names = list(dict.fromkeys(tasks))
    reference = results[0]

    def rate(result: Result, pass_index: int, task: str) -> float:
        calls = [c for c in result.calls if c.pass_index == pass_index and tasks[c.batch] == task]
        return sum(c.tokens - c.rows for c in calls) / max(sum(c.wall_s - c.prefill_s for c in calls), 1e-9)

    passes = sorted({c.pass_index for c in reference.calls})
    lines = ["| method | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for r in results[1:]:
        cells = []
        for task in names:
            ratios = [rate(r, p, task) / rate(reference, p, task) for p in passes if rate(reference, p, task) > 0]
            cells.append(f"{statistics.median(ratios):.2f}x" if ratios else "-")
        lines.append(f"| {r.method} | " + " | ".join(cells) + " |")
    return lines


def markdown(
    results: Sequence[Result], title: str = "", info: dict[str, Any] | None = None, tasks: Sequence[str] | None = None
) -> str:
    """One table per (setting, batch size), methods as rows; under it, each greedy difference explained. With
    ``tasks`` (each prompt's task) naming more than one task, batch-1 tables get a speedup-per-task table too."""
    lines = [f"## {title}"] if title else []
    if info:
        lines.append(", ".join(f"{k}: {v}" for k, v in info.items()))
    groups: dict[tuple[str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.setting, r.batch_size), []).append(r)
    for (setting, batch), rows in groups.items():
        passes = len(rows[0].pass_decode_s)
        oracle = any(r.oracle is not None for r in rows)
        lines += [
            "",
            f"**{setting}, batch {batch}** ({rows[0].prompts} prompts, {passes} interleaved passes; speedup: median "
            "(min-max) of the per-pass ratios)",
            "",
            "| method | tok/s | decode tok/s | speedup | zero-overhead speedup | ceiling | mean acc. len | "
            "acceptance per position | draft / verify / other s | prefill s | greedy match |"
            + (" oracle | rejected / token |" if oracle else ""),
            "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|" + ("---:|---:|" if oracle else ""),
        ]
        for r in rows:
            s = r.stats
            per_pos = acc = split = "-"
            if s is not None:
                acc = f"{s.mean_acceptance_length:.2f}"
                per_pos = " ".join(f"{a:.2f}" for a in s.acceptance_rate_per_pos[:8]) or "-"
                split = f"{s.draft_time_s:.1f} / {s.verify_time_s:.1f} / {s.other_time_s:.1f}"
            lines.append(
                f"| {r.method} | {r.tokens_per_s:.1f} | {r.decode_tokens_per_s:.1f} | {speedup(r)} | "
                f"{_fmt(r.zero_overhead, suffix='x')} | {_fmt(r.ceiling, suffix='x')} | {acc} | "
                f"{per_pos} | {split} | "
                f"{r.prefill_s:.1f} | {greedy_match(r)} |"
                + (f" {_fmt(r.oracle, suffix='x')} | {_fmt(s.rejected_per_token if s else None)} |" if oracle else "")
            )
        if rows[0].lookup_bound:
            lines += ["", lookup_line(rows)]
        if tasks is not None and batch == 1 and len(set(tasks)) > 1:
            lines += ["", f"Speedup per task ({setting}, batch 1; median of per-pass ratios):", ""]
            lines += task_speedups(rows, tasks)
        warnings = list(dict.fromkeys(f"- WARNING {r.method}: {w}" for r in rows for w in r.warnings))
        if warnings:
            lines += ["", *warnings]
        diffs = [f"- {r.method}: {d}" for r in rows for d in r.greedy_diffs]
        if diffs:
            lines += ["", "Greedy outputs that differ from the reference (first differing token, target's top-2):"]
            lines += diffs
    return "\n".join(lines) + "\n"


def lookup_line(rows: Sequence[Result]) -> str:
    """The context-lookup bound of a greedy table (:mod:`decodekit.bench.lookup_bound`) and each decodekit method's
    tokens a forward next to it."""
    bound = rows[0].lookup_bound or {}
    depths = " / ".join(str(d) for d in bound)
    measured = ", ".join(f"{r.method} {r.tokens_per_forward:.2f}" for r in rows[1:] if r.tokens_per_forward)
    return (
        f"Context-lookup bound, tokens a forward (the best draft copied from the prompt and output so far, depth "
        f"{depths}): {' / '.join(f'{v:.2f}' for v in bound.values())}" + (f"; measured: {measured}" if measured else "")
    )


def plot(results: Sequence[Result], path: Path) -> None:
    """Speedup over autoregressive decoding per (setting, batch), and acceptance rate per draft position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r.setting, r.batch_size) for r in results))
    methods = list(dict.fromkeys(r.method for r in results))
    fig, (ax_speed, ax_acc) = plt.subplots(1, 2, figsize=(14, 4.8))
    width = 0.8 / len(methods)
    colours = {m: f"C{i % 10}" for i, m in enumerate(methods)}  # one colour per method in every panel
    for i, method in enumerate(methods):
        values, low, high = [], [], []
        for group in groups:
            match = [r for r in results if (r.setting, r.batch_size) == group and r.method == method]
            r = match[0] if match and match[0].speedup else None
            values.append(r.speedup if r else 0.0)
            spread = (r.speedup_range or (r.speedup, r.speedup)) if r else (0.0, 0.0)
            low.append(values[-1] - spread[0])
            high.append(spread[1] - values[-1])
        xs = [g + (i - (len(methods) - 1) / 2) * width for g in range(len(groups))]
        ax_speed.bar(xs, values, width, label=method, color=colours[method], yerr=[low, high], capsize=2)
        for x, value in zip(xs, values):
            if not value:  # the method does not run at this setting / batch size (e.g. batch-1-only baselines)
                ax_speed.text(x, 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=7, color=colours[method])
    ax_speed.axhline(1.0, color="black", linewidth=0.8)
    ax_speed.set_xticks(range(len(groups)), [f"{s}\nbatch {b}" for s, b in groups])
    ax_speed.set_ylabel("decode speedup vs autoregressive")
    ax_speed.set_title("Speedup (median over passes, min-max bars)")
    ax_speed.legend(fontsize=8)
    styles = {}
    smallest = min(r.batch_size for r in results)
    for r in results:  # acceptance does not depend on the batch size: show the smallest
        if r.stats is None or not r.stats.drafted or r.batch_size != smallest:
            continue
        rates = r.stats.acceptance_rate_per_pos
        style = styles.setdefault(r.setting, ["-", "--", ":", "-."][len(styles) % 4])
        label = f"{r.method} ({r.setting})"
        ax_acc.plot(range(1, len(rates) + 1), rates, style, marker="o", color=colours[r.method], label=label)
    ax_acc.xaxis.get_major_locator().set_params(integer=True)
    ax_acc.set_xlabel("draft position")
    ax_acc.set_ylabel("acceptance rate")
    ax_acc.set_ylim(0, 1.05)
    ax_acc.set_title(f"Acceptance rate per draft position (batch {smallest})")
    if ax_acc.lines:
        ax_acc.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save(
    results: Sequence[Result],
    out_dir: Path,
    info: dict[str, Any],
    config: dict[str, Any] | None = None,
    tasks: Sequence[str] | None = None,
) -> str:
    """Write ``results.json``, ``results.md`` and ``speedup.png`` to ``out_dir``; return the markdown.

    Of several processes (``accelerate launch``, :mod:`decodekit.bench.distributed`) only rank 0 writes; every
    process returns the table (each holds the merged results)."""
    table = markdown(results, "decodekit benchmark", info, tasks)
    if not current_world().main:
        return table
    out_dir.mkdir(parents=True, exist_ok=True)
    warnings = list(dict.fromkeys(f"{r.setting} b={r.batch_size} {r.method}: {w}" for r in results for w in r.warnings))
    payload = {
        "machine": info,
        "config": config or {},
        "warnings": warnings,
        "results": [result_dict(r) for r in results],
    }
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2))
    (out_dir / "results.md").write_text(table)
    plot(results, out_dir / "speedup.png")
    return table
