"""A benchmark over several processes (data parallel): ``accelerate launch``, ``torchrun`` or ``mpirun`` start
one process per device, each runs the runner's protocol on its share of the prompt batches, and the measurements
are merged into the results one process would have produced (``docs/distributed.md``).

:func:`current_world` says which process this is (:class:`World`); alone (``python -m decodekit bench``) it is a
world of one, no process group is created and accelerate is not imported. With several processes, accelerate's
``PartialState`` joins the process group (NCCL on GPUs, gloo on CPU) and picks this process's device
(``cuda:LOCAL_RANK``, or ``cpu``). :func:`place` puts the target and every draft model there, :func:`merge`
gathers each process's runs and calls (all-gather, every process gets the merged lists), and :func:`init_process`
is the command line's hook: it joins before any model loads and keeps the other processes' stdout quiet.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.utils.mkldnn import MkldnnLinear

from decodekit.errors import ConfigError
from decodekit.kernels.cpu import PackedLinear
from decodekit.models import HFCausalLM, LanguageModel

if TYPE_CHECKING:
    from decodekit.bench.methods import Method, Run, TransformersBaseline
    from decodekit.bench.results import Call

__all__ = ["World", "current_world", "init_process", "launched_processes", "merge", "place"]

T = TypeVar("T")

# where launchers put the number of processes: torchrun / accelerate (WORLD_SIZE), MPI implementations
_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


@dataclass(frozen=True)
class World:
    """The processes a benchmark runs on: ``size`` of them, this one ``rank``, on ``device``.

    ``device`` is None in a world of one: the models stay where the model config put them.
    """

    rank: int = 0
    size: int = 1
    device: torch.device | None = None

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the process that writes the reports and prints."""
        return self.rank == 0

    def share(self, n: int) -> range:
        """This process's contiguous share of ``n`` items (batches, prompts); the first ``n % size`` processes get
        one more. The shares in rank order are ``range(n)`` in order, so gathered lists come back in item order."""
        quotient, remainder = divmod(n, self.size)
        start = self.rank * quotient + min(self.rank, remainder)
        return range(start, start + quotient + (self.rank < remainder))

    def mine(self, *lists: Sequence[T]) -> list[list[T]]:
        """This process's share of each of ``lists`` (equally long, e.g. prompts and their outputs)."""
        share = self.share(len(lists[0]))
        return [list(items[share.start : share.stop]) for items in lists]

    def gather(self, obj: T) -> list[T]:
        """``obj`` of every process, in rank order, on every process (``all_gather_object``)."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, obj)
        return out

    def concat(self, items: Sequence[T]) -> list[T]:
        """Every process's ``items``, concatenated in rank order."""
        return [item for part in self.gather(list(items)) for item in part]

    def barrier(self) -> None:
        """Wait for every process (nothing in a world of one)."""
        if self.size > 1:
            torch.distributed.barrier()


@functools.cache
def current_world() -> World:
    """This process's :class:`World`, set up once: several processes when a launcher started several (the
    process group is joined through accelerate's ``PartialState``), else a world of one.

    Raises:
        ConfigError: accelerate could not set up the processes the launcher started (e.g. no backend for this
            machine's accelerator; ``ACCELERATE_USE_CPU=1`` runs them on CPU).
    """
    size = launched_processes(os.environ)
    joined = torch.distributed.is_available() and torch.distributed.is_initialized()
    if size <= 1 and not joined:
        _warn_single_cpu_launch(os.environ)
        return World()
    from accelerate import PartialState

    state = PartialState(cpu=_cpu_only())
    expected = torch.distributed.get_world_size() if joined else size
    if state.num_processes != expected:
        raise ConfigError(
            f"the launcher started {expected} processes but accelerate set up {state.num_processes} "
            f"({state.distributed_type}) on this machine; set ACCELERATE_USE_CPU=1 to run them on CPU"
        )
    if not joined:
        atexit.register(_leave)
    return World(rank=state.process_index, size=state.num_processes, device=torch.device(state.device))


def init_process() -> World:
    """The command line's hook, called before anything is loaded: join the process group when launched as one of
    several processes, so that this process's GPU is the current one (a model config with ``device=cuda`` lands
    on it), and send the stdout of every rank but 0 to ``os.devnull`` (the table is printed once; errors and
    warnings still reach stderr). Alone: nothing happens."""
    world = current_world()
    if not world.main:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    return world


def launched_processes(environ: Mapping[str, str]) -> int:
    """How many processes the launcher started, from its environment variables (1 when none is set)."""
    for name in _SIZE_VARIABLES:
        if environ.get(name, "").strip().isdigit():
            return int(environ[name])
    return 1


def _cpu_only() -> bool:
    """Run the processes on CPU (gloo): asked for with ``ACCELERATE_USE_CPU``, or no accelerator here."""
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    accelerator = getattr(torch, "accelerator", None)
    return not (accelerator.is_available() if accelerator is not None else torch.cuda.is_available())


def _warn_single_cpu_launch(environ: Mapping[str, str]) -> None:
    """``accelerate launch --cpu --num_processes N`` starts one process unless it goes through MPI: say so."""
    if environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and "MASTER_ADDR" in environ:
        warnings.warn(
            "accelerate launch --cpu started a single process (several CPU processes need --mpirun_hostfile); "
            "this benchmark runs every prompt here. For several CPU processes use accelerate launch --multi_gpu "
            "--num_processes N (torchrun's launcher: without a GPU, decodekit runs the processes on CPU) or "
            "torchrun --nproc_per_node N",
            stacklevel=3,
        )


def _leave() -> None:
    """At exit, leave the process group, on CPU (gloo) after waiting up to a minute for the other processes, so
    none tears its connections down while another still uses them (rank 0 writing the report). A two-process CPU
    run of the test suite was once aborted by gloo in a process leaving early ("terminate called without an active
    exception"). A process that failed is not waited for beyond the minute: the launcher stops the others."""
    if not torch.distributed.is_initialized():
        return
    if torch.distributed.get_backend() == "gloo":
        with contextlib.suppress(RuntimeError):  # a process that failed never arrives
            torch.distributed.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    torch.distributed.destroy_process_group()


def place(world: World, model: LanguageModel, methods: Sequence[Method | TransformersBaseline]) -> None:
    """Put the target and every draft model (a drafter's ``model``, a baseline's ``assistant``) on this process's
    device; in a world of one nothing moves. transformers models are moved in place, so every adapter and method
    that holds them follows.

    Raises:
        ConfigError: a model spread over several devices (``device_map="auto"``): each data-parallel process needs
            a whole copy of the model on its own device; a model with CPU kernels (``kernels="onednn"`` or
            ``"int8"``) for a GPU; or a model decodekit cannot move.
    """
    if world.device is None:
        return
    models: list[Any] = [model]
    for method in methods:
        for other in (getattr(getattr(method, "drafter", None), "model", None), getattr(method, "assistant", None)):
            if other is not None and all(other is not m for m in models):
                models.append(other)
    for m in models:
        _move(m, world)


def _move(model: Any, world: World) -> None:
    module = model.hf if isinstance(model, HFCausalLM) else model
    if isinstance(module, torch.nn.Module):
        devices = sorted({str(d) for d in (getattr(module, "hf_device_map", None) or {}).values()})
        if len(devices) > 1:
            raise ConfigError(
                f"the model is spread over devices {', '.join(devices)} (device_map): with {world.size} processes, "
                "each needs a whole copy of the model on its own device. Run one process with device_map='auto' "
                "for a model that needs several devices, or several processes without device_map"
            )
        if world.device.type != "cpu" and any(_cpu_kernel(m) for m in module.modules()):
            raise ConfigError(
                f"{type(module).__name__} runs CPU kernels (kernels='onednn' or 'int8'), which cannot run on "
                f"{world.device}: load it with kernels=null (model.kernels=null, and the draft model's)"
            )
        module.to(world.device)
    elif getattr(model, "device", world.device) != world.device:
        raise ConfigError(
            f"{type(model).__name__} is on {model.device} and decodekit cannot move it to this process's device "
            f"{world.device}: build it on that device (rank {world.rank})"
        )


def _cpu_kernel(module: torch.nn.Module) -> bool:
    """Whether ``module`` is one of decodekit's CPU linear kernels (:mod:`decodekit.kernels.cpu`)."""
    quantized = type(module).__module__.startswith("torch.ao.nn.quantized")
    return isinstance(module, (PackedLinear, MkldnnLinear)) or quantized


def merge(
    world: World, runs: list[list[list[Run]]], calls: list[list[Call]]
) -> tuple[list[list[list[Run]]], list[list[Call]]]:
    """Every process's runs ``[method][pass][batch]`` and calls ``[method][call]`` of one (setting, batch size),
    as a single process would have them: each pass's runs in batch order (the shares are contiguous, so rank order
    is batch order), the calls by (pass, batch). A pass thus covers every prompt once, its times summed over
    processes (which run at the same time, each on its own device)."""
    if world.size == 1:
        return runs, calls
    everyone = world.gather((runs, calls))
    merged_runs = [
        [[run for theirs, _ in everyone for run in theirs[m][p]] for p in range(len(passes))]
        for m, passes in enumerate(runs)
    ]
    merged_calls = [
        sorted((c for _, theirs in everyone for c in theirs[m]), key=lambda c: (c.pass_index, c.batch))
        for m in range(len(calls))
    ]
    return merged_runs, merged_calls
