"""A benchmark over several processes (decodekit.bench.distributed): ``accelerate launch`` with 2 CPU processes
(gloo) merges one report, shaped like a single process's, with the same outputs; a world of one changes nothing;
a model spread over devices (device_map) runs, and is refused for data parallelism.

The launched run, and the same config run in the test's own process, use a tiny random Llama and a word-level
tokenizer saved to a folder, and the stdlib task, so nothing is downloaded and no real model is loaded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import decodekit as dk
from decodekit.bench.distributed import World, _warn_single_cpu_launch, current_world, launched_processes, place
from decodekit.bench.methods import Method
from decodekit.errors import ConfigError
from decodekit.models.tiny import perturbed, tiny_llama
from tests.word_tokenizer import save_word_tokenizer

ROOT = Path(__file__).resolve().parents[2]

# cli.main with the bench changed as tests/unit/bench_patch.py says (the test's own run makes the same changes)
MAIN = """\
import sys
from tests.unit.bench_patch import apply
apply()
from decodekit.cli import main
main(sys.argv[1:])
"""


def save_tiny(path: Path, model: torch.nn.Module) -> Path:
    """``model`` and a word-level tokenizer (ids below the tiny vocabulary), ready for ``load_model(path)``."""
    words = ["[UNK]", "<s>", "def", "return", "self", "if", "else", "for", "in", "import", "not", "None"]
    save_word_tokenizer(path, words + list("()[]:,.=+-*'\""), bos_token="<s>")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    target = tiny_llama(0)
    return save_tiny(root / "target", target), save_tiny(root / "draft", perturbed(target, 0.3, seed=1))


def bench_overrides(target: Path, draft: Path, out: Path) -> list[str]:
    """5 stdlib prompts at batch 1 and 8 (5 batches: uneven shares; 1 padded batch: a process with none), greedy
    and sampled, the n-gram drafter, a draft model and two transformers baselines, 2 passes."""
    model = f"{{_target_:decodekit.load_model,spec:'{draft}'}}"
    return [
        f"model.spec='{target}'",
        "model.kernels=null",
        "task=stdlib",
        "task.num_prompts=5",
        "task.max_prompt_tokens=40",
        "max_new_tokens=8",
        "passes=2",
        "reruns=0",  # the two runs load each other's CPUs: no re-runs of calls they disturb
        "batch_sizes=[1,8]",
        "settings=[{name:greedy,temperature:0.0},{name:t0.8,temperature:0.8}]",
        f"+methods.draft_model={{drafter:{{_target_:decodekit.drafters.ModelDrafter,model:{model}}},"
        "policy:{_target_:decodekit.policies.FixedLength,k:3}}",
        "+baselines.hf_greedy={kind:greedy}",
        "+baselines.hf_lookup={kind:prompt_lookup,k:3}",
        "progress=false",
        f"hydra.run.dir='{out}'",
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_run(overrides: list[str], out: Path) -> dict:
    """The bench config run by this process, as ``MAIN`` runs it (the same patches), on one thread like each
    launched process (``OMP_NUM_THREADS=1``): its ``results.json``."""
    from hydra import compose, initialize_config_dir

    from decodekit.cli import RECIPES, run_bench
    from tests.unit.bench_patch import apply

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        apply(patch.setattr)
        with initialize_config_dir(config_dir=str(RECIPES), version_base="1.3"):
            cfg = compose("bench", overrides=[o for o in overrides if not o.startswith("hydra.")])
        torch.set_num_threads(1)
        try:
            run_bench(cfg, out)
        finally:
            torch.set_num_threads(threads)
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def two_runs(tiny_dirs, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess | None, dict]]:
    """The same bench config run by this process and by ``accelerate launch`` with 2 CPU processes (meanwhile)."""
    root = tmp_path_factory.mktemp("runs")
    script = root / "main.py"
    script.write_text(MAIN)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "CUDA_VISIBLE_DEVICES": "",  # CPU processes even on a GPU machine
        "OMP_NUM_THREADS": "1",  # the same kernels in both runs (torchrun's default for its processes)
        "HF_HUB_OFFLINE": "1",
    }
    # accelerate's --cpu starts several processes only through MPI; --multi_gpu is its torchrun launcher, which
    # decodekit runs on CPU (gloo) when there is no GPU
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(free_port())]
    process = subprocess.Popen(
        [*launch, str(script), "bench", *bench_overrides(*tiny_dirs, root / "accelerate")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        (root / "single").mkdir()
        single = single_run(bench_overrides(*tiny_dirs, root / "single"), root / "single")
    finally:
        out, err = process.communicate(timeout=240)
    run = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert run.returncode == 0, f"accelerate:\n{err[-3000:]}"
    return {
        "single": (None, single),
        "accelerate": (run, json.loads((root / "accelerate" / "results.json").read_text())),
    }


def test_accelerate_run_merges_one_report_shaped_like_a_single_process(two_runs):
    (_, single), (run, merged) = two_runs["single"], two_runs["accelerate"]
    assert merged.keys() == single.keys() and merged["machine"].keys() == single["machine"].keys()
    assert (single["machine"]["processes"], merged["machine"]["processes"]) == (1, 2)
    assert (single["machine"]["rank_devices"], merged["machine"]["rank_devices"]) == (["cpu"], ["cpu", "cpu"])
    assert merged["config"] == single["config"]
    assert run.stdout.count("**greedy, batch 1**") == 1  # rank 0 prints; the other process prints nothing
    rows = [(r["method"], r["setting"], r["batch_size"], r["prompts"]) for r in single["results"]]
    assert [(r["method"], r["setting"], r["batch_size"], r["prompts"]) for r in merged["results"]] == rows
    assert len(rows) == 2 * (5 + 4)  # prompt lookup runs at batch 1 only
    for mine, theirs in zip(merged["results"], single["results"]):
        assert mine.keys() == theirs.keys()
        batches = -(-5 // mine["batch_size"])
        assert len(mine["pass_decode_s"]) == 2 and len(mine["sequences"]) == 5
        # every batch once per pass, in the same place of the rotated order as in one process
        same = ("pass_index", "batch", "order", "rows", "tokens")
        assert [[c[k] for k in same] for c in mine["calls"]] == [[c[k] for k in same] for c in theirs["calls"]]
        assert [(c["pass_index"], c["batch"]) for c in mine["calls"]] == [
            (p, b) for p in range(2) for b in range(batches)
        ]
        # contiguous shares: the first process gets the first (and any odd) batch
        assert [c["rank"] for c in mine["calls"][:batches]] == [int(b >= -(-batches // 2)) for b in range(batches)]
        assert {c["rank"] for c in theirs["calls"]} == {0}


def test_accelerate_run_gives_the_single_process_outputs(two_runs):
    """Same prompts in the same batches with the same seeds: every output (greedy and sampled) is the same, in
    prompt order, and so are the greedy match and its explanations."""
    single, merged = two_runs["single"][1], two_runs["accelerate"][1]
    for mine, theirs in zip(merged["results"], single["results"]):
        assert mine["sequences"] == theirs["sequences"], (mine["method"], mine["setting"], mine["batch_size"])
        assert mine["greedy_match"] == theirs["greedy_match"] and mine["greedy_diffs"] == theirs["greedy_diffs"]
        assert mine["tokens"] == theirs["tokens"]
    greedy = [r for r in merged["results"] if r["setting"] == "greedy"]
    assert any(r.get("mean_acceptance_length", 1) > 1 for r in greedy)  # the drafters did draft
    edited = next(r for r in greedy if r["method"] == "hf_lookup")
    assert edited["greedy_match"] == 3 / 5 and [d["position"] for d in edited["greedy_diffs"]] == [2, 2]
    assert all(r["greedy_match"] == 1.0 for r in greedy if r is not edited)


def test_a_single_process_is_a_world_of_one():
    assert current_world() == World() and current_world().device is None
    assert not torch.distributed.is_initialized()
    model = dk.load_model(tiny_llama(0))
    place(current_world(), model, [Method("autoregressive")])  # moves nothing
    assert model.device == torch.device("cpu")


@pytest.mark.parametrize(("n", "size"), [(5, 2), (3, 2), (1, 2), (0, 3), (7, 3), (8, 4)])
def test_shares_are_contiguous_and_cover_everything_once(n, size):
    shares = [World(rank, size).share(n) for rank in range(size)]
    assert [i for share in shares for i in share] == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    items = [f"p{i}" for i in range(n)]
    assert [x for rank in range(size) for x in World(rank, size).mine(items)[0]] == items


def test_launched_processes_and_accelerate_cpu_single_launch_warning():
    assert launched_processes({}) == 1 and launched_processes({"WORLD_SIZE": "4"}) == 4
    assert launched_processes({"OMPI_COMM_WORLD_SIZE": "2"}) == 2
    with pytest.warns(UserWarning, match="started a single process"):
        _warn_single_cpu_launch({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"})


@pytest.fixture(scope="module")
def spread_model(tiny_dirs, tmp_path_factory):
    """The tiny target with its second layer offloaded to disk (accelerate's hooks move it in for each call)."""
    from transformers import AutoModelForCausalLM

    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    device_map |= {"model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"}
    offload = tmp_path_factory.mktemp("offload")
    hf = AutoModelForCausalLM.from_pretrained(
        tiny_dirs[0], device_map=device_map, offload_folder=offload, local_files_only=True
    )
    return dk.load_model(hf)


def test_a_model_spread_by_device_map_decodes_like_the_whole_model(tiny_dirs, spread_model):
    plain = dk.load_model(tiny_dirs[0])
    prompts = [[5, 6, 7, 8, 5, 6], [1, 2, 3], [9, 9, 9, 9, 9, 4, 2]]
    for drafter in (None, dk.drafters.NGramDrafter()):
        want = dk.generate(plain, prompts, drafter=drafter, max_new_tokens=12).sequences
        assert dk.generate(spread_model, prompts, drafter=drafter, max_new_tokens=12).sequences == want


def test_data_parallel_refuses_a_model_spread_over_devices(spread_model):
    with pytest.raises(ConfigError, match="spread over devices cpu, disk"):
        place(World(rank=1, size=2, device=torch.device("cpu")), spread_model, [])


@pytest.mark.parametrize("kernels", ["onednn", "int8"])
def test_data_parallel_refuses_cpu_kernels_for_another_device(kernels):
    model = dk.load_model(tiny_llama(0), kernels=kernels)
    elsewhere = World(rank=1, size=2, device=torch.device("meta"))  # stands in for a GPU: nothing is moved
    with pytest.raises(ConfigError, match="CPU kernels"):
        place(elsewhere, model, [])
    place(World(rank=1, size=2, device=torch.device("cpu")), model, [])  # on the CPU they run
