"""The command line: its help (printed before Hydra or a model loads; the real entry point run once), and a
sweep on the real model (slow)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from decodekit.cli import USAGE, main

ROOT = Path(__file__).resolve().parents[2]


def decodekit_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "decodekit", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_lists_the_commands():
    run = decodekit_cli("--help")  # the real entry point once; the other spellings in-process below
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage: python -m decodekit" in run.stdout
    assert re.search(r"^\s+bench\s", run.stdout, flags=re.M), run.stdout


@pytest.mark.parametrize("args", [["-h"], ["help"], []])
def test_every_help_spelling_prints_the_usage(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == USAGE


def test_unknown_command_is_an_error_with_the_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bnech"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "unknown command 'bnech'" in err and "bench" in err


def test_hydra_help_names_the_app_decodekit(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["decodekit"])  # in process, as the entry point calls it
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("decodekit is powered by Hydra.")
    assert re.search(r"^drafter: .*\bmodel\b.*\bngram\b", out, flags=re.M), out[:2000]


@pytest.mark.slow
def test_bench_sweep_over_k(tmp_path, monkeypatch, capfd, smollm2_cut):
    """``bench -m``, run by this process (the entry point's subprocess is ``test_help_lists_the_commands``), on
    SmolLM2 cut to 8 layers: what is checked is the sweep's report."""
    monkeypatch.setattr(sys, "argv", ["decodekit"])
    main(
        [
            "bench",
            "-m",
            "policy.k=1,2",
            f"model.spec='{smollm2_cut}'",
            "task=stdlib",  # what is checked is the sweep's report: one short prompt
            "task.num_prompts=1",
            "task.max_prompt_tokens=48",
            "max_new_tokens=8",
            "passes=1",
            "reruns=0",  # what is checked is the sweep's report, not its times: no re-runs under the other xdist worker
            "progress=false",
            f"hydra.sweep.dir={tmp_path}",
            "hydra/job_logging=disabled",  # leave this process's logging as pytest set it
            "hydra/hydra_logging=disabled",
        ]
    )
    out, err = capfd.readouterr()
    assert "Loading weights" not in out + err  # no progress bar per model load
    data = json.loads((tmp_path / "results.json").read_text())  # one combined report for the sweep
    methods = [r["method"] for r in data["results"]]
    assert methods == ["autoregressive", "ngram k=1", "ngram k=2"]  # the reference once; rows named by what ran
    assert all(r["greedy_match"] == 1.0 for r in data["results"])
    assert (tmp_path / "speedup.png").exists()
    jobs = data["config"]["sweep"]["jobs"]
    assert [[o for o in job["overrides"] if o.startswith("policy.k=")] for job in jobs] == [
        ["policy.k=1"],
        ["policy.k=2"],
    ]
    assert not (tmp_path / "0" / "results.json").exists()
