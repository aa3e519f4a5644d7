"""Where and with what a benchmark ran (recorded in ``results.json``)."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any

import torch

import decodekit as dk
from decodekit.bench.distributed import current_world
from decodekit.models import LanguageModel


def machine_info(model: LanguageModel) -> dict[str, Any]:
    """Where and with what a benchmark ran: CPU (model, count, the cores this process may use), torch threads,
    device and GPU, package versions, and the project's git commit (None outside a git checkout); the number of
    processes and each one's device (``rank_devices``, one entry alone; several with ``accelerate launch``), and
    the devices the target's weights sit on (``model_devices``: several with ``device_map="auto"``).

    With several processes every one must call it (it gathers their devices); the CPU facts are rank 0's."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    world = current_world()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "device": str(model.device),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else None,
        "processes": world.size,
        "rank_devices": world.gather(str(model.device)),
        "model_devices": _model_devices(model),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "decodekit": dk.__version__,
        "git_commit": _git_commit(),
    }
    return info


def _model_devices(model: LanguageModel) -> list[str]:
    """The devices holding the target's weights (transformers' ``hf_device_map`` when it has one)."""
    device_map = getattr(getattr(model, "hf", None), "hf_device_map", None)
    if not device_map:
        return [str(model.device)]
    return list(dict.fromkeys(str(torch.device(d) if isinstance(d, int) else d) for d in device_map.values()))


def _git_commit() -> str | None:
    """The commit of the decodekit checkout being run (with ``+dirty`` for local changes), or None."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(dk.__file__)))
    try:
        run = lambda *args: subprocess.run(  # noqa: E731
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        commit = run("rev-parse", "HEAD")
        return commit + ("+dirty" if run("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return None
