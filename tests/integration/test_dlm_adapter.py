"""The zoo diffusion LMs' training recipes on SmolLM2 cut to 8 layers (``smollm2_cut``): smoke runs (loss down, files,
resume, the self-distilled rows) and loading them through the zoo entries; the DLM benchmark on real prompts."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import decodekit as dk
from decodekit.dlm import zoo
from decodekit.errors import ConfigError, ModelNotFoundError
from decodekit.train.corpus import corpus_texts
from decodekit.train.dlm_adapter import masked_diffusion_loss, train

pytestmark = pytest.mark.slow
# the benchmark's runs on short prompts (a 48-token stdlib chunk, synthetic items after one solved example) with
# SmolLM2 cut to 8 layers as the model and as the autoregressive scorer (smollm2_cut): what the tests check is the
# report, and a SmolLM2 forward costs about its prompt's length and its depth
SHORT = dict(task="stdlib", max_prompt_tokens=48, synthetic_shots=1, progress=False, reruns=0)  # + scorer=the cut


def test_the_corpus_is_not_a_benchmark_source():
    from decodekit.bench.stdlib_prompts import _SKIP_DIRS

    assert {"test", "pydoc_data"} <= _SKIP_DIRS  # the stdlib task never mines these
    assert len(corpus_texts()) > 100


def on_the_cut(monkeypatch, tmp_path, name: str, cut: str) -> None:
    """The zoo DLM ``name`` read from ``tmp_path`` and built on ``cut`` (SmolLM2's first 8 layers, what the run
    trained) instead of the full SmolLM2: the same loading path, a quarter of the forwards' cost."""
    monkeypatch.setattr(zoo, "weights_path", lambda entry: tmp_path / entry.weights)
    monkeypatch.setitem(zoo.DLM_ZOO, name, dataclasses.replace(zoo.DLM_ZOO[name], base=cut))


def test_smoke_run_lowers_the_loss_resumes_and_loads(tmp_path, monkeypatch, smollm2_cut):
    small = dict(
        seq_len=16, train_chunks=64, val_chunks=4, batch_size=2, eval_every=4, save_every=2, lr=1e-3, progress=False
    )  # the smallest run whose loss falls with margin
    small["base"] = smollm2_cut
    summary = train(tmp_path, max_steps=4, **small)
    assert summary["steps"] == 4 and summary["train_tokens"] == 4 * 2 * 16
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    for name in ("smollm2-135m-dlm.safetensors", "loss.png", "summary.json", "history.json"):
        assert (tmp_path / name).is_file()
    resumed = train(tmp_path, max_steps=5, resume=True, **small)  # from the step-4 checkpoint
    assert resumed["steps"] == 5 and len(json.loads((tmp_path / "history.json").read_text())["train"]) == 5

    on_the_cut(monkeypatch, tmp_path, "smollm2-135m-dlm", smollm2_cut)
    m = dk.dlm.load_model("smollm2-135m-dlm")
    assert m.mask_token_id == 16 and m.shift_logits
    out = dk.dlm.generate(m, ["def add(a, b):"], gen_length=8, block_length=4, steps=4)
    assert len(out.sequences[0]) == 8 and 16 not in out.sequences[0]


def test_block_causal_recipe_builds_self_distilled_rows_trains_and_loads_block_causal(
    tmp_path, monkeypatch, smollm2_cut
):
    """``recipe=bdlm_adapter`` in small: the self-distilled sequences built (the target's own responses) and cached,
    a block-causal run whose validation loss falls, and the zoo entry loading it as a block-causal model that
    refuses another block length."""
    sequences = dict(chat_prompts=2, code_prompts=2, text_chunks=4, max_prompt_tokens=32, max_new_tokens=8, seq_len=64)
    small = dict(data="self", block_length=4, gen_len=8, context=16, val_fraction=0.25, batch_size=2, lr=3e-3)
    summary = train(
        tmp_path, data_dir=str(tmp_path / "data"), sequences={**sequences, "gen_batch_size": 4}, max_steps=6,
        eval_every=3, save_every=3, progress=False, name="smollm2-135m-bdlm", base=smollm2_cut, **small,
    )  # fmt: skip
    assert summary["block_length"] == 4 and summary["data"] == "self" and summary["steps"] == 6
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    seqs = json.loads((tmp_path / "data" / "sequences.json").read_text())
    assert len(seqs) >= 4 and all(len(s) > 0 for s in seqs)  # the responses, then the text chunks
    starts = json.loads((tmp_path / "data" / "starts.json").read_text())
    answered = len(seqs) - 4  # the prompts that fit max_prompt_tokens (chat prompts rarely do at 32), then 4 chunks
    assert len(starts) == len(seqs) and answered > 0 and all(starts[:answered]) and set(starts[answered:]) == {0}
    on_the_cut(monkeypatch, tmp_path, "smollm2-135m-bdlm", smollm2_cut)
    m = dk.dlm.load_model("smollm2-135m-bdlm")
    assert m.block_length == 4 and m.mask_token_id == 16 and m.shift_logits
    out = dk.dlm.generate(m, ["def add(a, b):"], gen_length=8, block_length=4, steps=8)
    assert len(out.sequences[0]) == 8 and 16 not in out.sequences[0]
    with pytest.raises(ConfigError, match="trained block-causally with blocks of 4"):
        dk.dlm.generate(m, ["def add(a, b):"], gen_length=8, block_length=8, steps=8)

    # recipe=draft_dlm in small, on the same cached rows: DEER-style alignment (a cut inside each response, 4 slots
    # all masked), its zoo entry read back and drafting for the cut target: plain decoding's tokens
    small |= dict(objective="draft", draft_length=4, draft_decay=0.9)
    draft = train(tmp_path / "draft", data_dir=str(tmp_path / "data"), sequences={**sequences, "gen_batch_size": 4},
                  max_steps=4, eval_every=2, save_every=4, progress=False, name="smollm2-135m-draft-dlm",
                  base=smollm2_cut, **small)  # fmt: skip
    assert (draft["objective"], draft["draft_length"], draft["steps"]) == ("draft", 4, 4)
    assert draft["train_tokens"] == 4 * 2 * 4  # steps x rows x drafted slots, not the region's gen_len
    assert draft["final_val_loss"] < draft["initial_val_loss"]
    on_the_cut(monkeypatch, tmp_path / "draft", "smollm2-135m-draft-dlm", smollm2_cut)
    target = dk.load_model(smollm2_cut)
    drafter = dk.build("drafter", "diffusion", model="smollm2-135m-draft-dlm")
    prompt = target.tokenizer("def add(a, b):")["input_ids"]
    out = dk.generate(target, [prompt], drafter, policy=dk.policies.FixedLength(4), max_new_tokens=12, debug=True)
    assert out.sequences == dk.generate(target, [prompt], max_new_tokens=12).sequences and out.stats.drafted > 0


def test_a_time_budget_fixes_the_step_count_after_the_probe_and_anneals_over_it(tmp_path, monkeypatch, smollm2_cut):
    """A budget no step fits in: the run stops one step after the timed probe (the fewest a budget allows; a probe
    of 3 steps here instead of 10), with the learning rate annealed to 0 at that step rather than cut off
    mid-schedule."""
    from decodekit.train import dlm_adapter

    monkeypatch.setattr(dlm_adapter, "BUDGET_PROBE", 3)

    # what is checked is the step count and the schedule: the smallest data and batches, SmolLM2 cut to 8 layers
    small = dict(seq_len=16, train_chunks=16, val_chunks=2, batch_size=2, eval_every=100, lr=3e-3, progress=False)
    small["base"] = smollm2_cut
    summary = train(tmp_path, max_steps=1000, time_budget_s=1e-3, **small)
    assert summary["steps"] == 2 + 3 + 1 and summary["time_budget_s"] == 1e-3
    state = torch.load(next((tmp_path / "checkpoints").glob("step_*")) / "scheduler.bin", weights_only=False)
    assert state["lr_lambdas"][0]["total"] == summary["steps"] and state["_last_lr"][0] == pytest.approx(0.0)


def test_missing_adapter_says_how_to_train_it(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "weights_path", lambda entry: tmp_path / "absent.safetensors")
    with pytest.raises(ModelNotFoundError, match="recipe=dlm_adapter"):
        dk.dlm.load_model("smollm2-135m-dlm")


def test_loss_masks_never_the_first_token():
    class Echo(torch.nn.Module):  # logits that put all mass on the true next token: zero loss wherever masked
        def __init__(self, tokens):
            super().__init__()
            self.tokens = tokens

        def forward(self, input_ids, attention_mask):
            nxt = torch.nn.functional.one_hot(torch.roll(self.tokens, -1, 1), 50).float() * 100
            return type("Out", (), {"logits": nxt})()

    tokens = torch.randint(0, 49, (4, 16))
    loss = masked_diffusion_loss(Echo(tokens), tokens, 49, torch.Generator().manual_seed(0))
    assert float(loss) == pytest.approx(0.0, abs=1e-6)


def test_dlm_bench_reports_speed_next_to_quality(tmp_path, smollm2_cut, monkeypatch):
    """The benchmark on a real model (an untrained wrapping of SmolLM2 cut to 8 layers stands in for the adapter; the
    cut scores too): every method's row, the base sampler agreeing with itself, a threshold rule taking fewer
    forwards; the synthetic table has every method (and the autoregressive reference) on every task; a timed call
    other processes disturbed is named under the table, and results.json records the machine and the settings."""
    from decodekit.bench import dlm
    from decodekit.bench.dlm import run

    def disturbed(call, retries):  # as if other processes had used half the CPUs during every timed call
        return call(), 0.5, 1 + retries

    monkeypatch.setattr(dlm, "least_disturbed", disturbed)

    m = dk.dlm.load_model(dk.load_model(smollm2_cut), mask_token_id=16, shift_logits=True)
    rule = dk.dlm.ThresholdRule(0.0)
    methods = {
        "threshold": {"rule": rule},
        "dual": {"rule": rule, "cache": dk.dlm.DualCache(), "uncached": "threshold"},
        "disabled": None,  # methods.<name>=null in the recipe: no row
    }
    kwargs = dict(SHORT, scorer=smollm2_cut, num_prompts=1, gen_lengths=[8], block_length=4, synthetic=1)
    kwargs["synthetic_length"] = 4
    table = run(tmp_path, model=m, methods=methods, **kwargs)
    report = json.loads((tmp_path / "results.json").read_text())
    rows = {r["method"]: r for r in report["methods"]}
    assert rows["base"]["agreement"] == 1.0 and rows["base"]["nfe"] == 8 and rows["base"]["speedup"] == 1.0
    assert rows["base"]["similarity"] == 1.0 and 0.0 <= rows["threshold"]["similarity"] <= 1.0
    assert rows["threshold"]["nfe"] == 2 and rows["threshold"]["tokens_per_forward"] == 4.0
    assert rows["base"]["vs_uncached"] is None and 0.0 <= rows["dual"]["vs_uncached"] <= 1.0
    assert rows["base"]["ar_nll"] > 0 and rows["base"]["parses"] in (0.0, 1.0)
    assert "disabled" not in rows and "| threshold |" in table and (tmp_path / "results.md").read_text() == table
    synthetic = {(r["method"], r["task"]): r for r in report["synthetic"]}
    assert (
        len(synthetic) == 4 * 4 and synthetic["base", "sort"]["nfe"] == 4 and synthetic["threshold", "copy"]["nfe"] == 1
    )
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in synthetic.values()) and "**Synthetic tasks**" in table
    assert "- `threshold`: 1 of 1 timed calls ran while other processes used up to 50% of the CPUs" in table
    assert rows["threshold"]["warnings"] and report["machine"]["cpu_count"] and report["config"]["gen_lengths"] == [8]


def test_dlm_bench_on_a_block_causal_model_runs_its_base_with_the_exact_cache_and_lists_refusals(tmp_path, smollm2_cut):
    """On a block-causal model the base may use the exact block-causal cache (the G = 256 protocol): the uncached
    base, run as a method, agrees with it token for token, and so does the cache measured against it; a
    bidirectional cache is listed with the model's reason instead of run; a base with another rule, or one the model
    cannot run, is refused before any call."""
    from decodekit.bench.dlm import run

    m = dk.dlm.load_model(dk.load_model(smollm2_cut), mask_token_id=16, shift_logits=True, block_length=4)
    kwargs = dict(SHORT, scorer=smollm2_cut, num_prompts=1, gen_lengths=[8], block_length=4, synthetic=0)
    base = {"rule": None, "cache": dk.dlm.BlockCausalCache()}
    methods = {
        "recompute": {"rule": None, "cache": None},
        "block_causal": {"rule": None, "cache": dk.dlm.BlockCausalCache(), "uncached": "recompute"},
        "dual": {"rule": None, "cache": dk.dlm.DualCache()},
    }
    table = run(tmp_path, model=m, methods=methods, base=base, **kwargs)
    report = json.loads((tmp_path / "results.json").read_text())
    rows = {r["method"]: r for r in report["methods"]}
    assert set(rows) == {"base", "recompute", "block_causal"}
    assert rows["recompute"]["agreement"] == 1.0 and rows["base"]["nfe"] == rows["recompute"]["nfe"] == 8
    assert rows["block_causal"]["vs_uncached"] == 1.0 and rows["block_causal"]["agreement"] == 1.0
    assert "DualCache attends bidirectionally" in report["refused"]["dual"] and "`dual` not run" in table
    with pytest.raises(ConfigError, match="base must be LLaDA's rule"):
        run(tmp_path, model=m, methods={}, base={"rule": dk.dlm.ThresholdRule(0.9)}, **kwargs)
    with pytest.raises(ConfigError, match="base sampler cannot run on this model"):
        run(tmp_path, model=m, methods={}, base={"rule": None, "cache": dk.dlm.DualCache()}, **kwargs)
