"""SpecDec++'s threshold policy (ThresholdHeadStop), its acceptance head and its training recipe, on tiny models."""

from __future__ import annotations

import json
import math

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter
from decodekit.errors import ConfigError
from decodekit.models.tiny import perturbed
from decodekit.policies import threshold_head as th
from decodekit.policies.threshold_head import AcceptanceHead, ThresholdHeadStop
from decodekit.types import DraftStep
from tests.conftest import assert_greedy_twice
from tests.unit.test_host_syncs import OVERHEAD, PROMPTS, CountingModelDrafter, count_syncs
from tests.unit.test_policies import Recorder

H = 64  # the tiny models' hidden size


def probe_head(hidden_size: int = H) -> AcceptanceHead:
    """No blocks; logit = hidden[..., 0]: p̂ = sigmoid of the first feature."""
    head = AcceptanceHead(hidden_size, blocks=0)
    with torch.no_grad():
        head.out.weight.zero_()
        head.out.weight[0, 0] = 1
        head.out.bias.zero_()
    return head


def constant_head(p: float, hidden_size: int = H) -> AcceptanceHead:
    """p̂ = p at every position."""
    head = AcceptanceHead(hidden_size, blocks=1)
    with torch.no_grad():
        head.out.weight.zero_()
        head.out.bias.fill_(math.log(p / (1 - p)))
    return head


def steps(rule, logits: list[list[float]]) -> list[list[bool]]:
    """Call ``rule`` for steps j = 0, 1, ... with hidden states whose first feature is ``logits[j]`` (per row)."""
    out = []
    for j, row in enumerate(logits):
        hidden = torch.zeros(len(row), H)
        hidden[:, 0] = torch.tensor(row)
        tokens = torch.zeros(len(row), dtype=torch.long)
        out.append(rule(DraftStep(j, tokens, torch.ones(len(row)), None, hidden)).tolist())
    return out


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_stop_rule_product_and_index_convention():
    """p̂ = 1 at j = 0 whatever the head says; Π_j = ∏_{i<j} p̂_i; stop once 1 - Π_j > h."""
    policy = ThresholdHeadStop(probe_head(), threshold=0.3, min_len=1, max_len=20)
    rule = policy.plan(
        dk.DecodeState.from_prompts([[1], [1]], [50, 50], dk.SamplingParams(), None, torch.device("cpu"))
    ).stop
    assert rule.needs_hidden
    # row 0: 0.9 then 0.7 -> 1 - 0.63 = 0.37 > 0.3 at j = 2; row 1: 0.5 -> 0.5 > 0.3 at j = 1
    trace = steps(rule, [[logit(1e-4), logit(1e-4)], [logit(0.9), logit(0.5)], [logit(0.7), logit(0.99)]])
    assert trace == [[False, False], [False, True], [True, True]]
    # a new round starts from Π = 1 again
    assert steps(rule, [[logit(0.01), logit(0.01)]]) == [[False, False]]


def test_stop_rule_min_len():
    policy = ThresholdHeadStop(probe_head(), threshold=0.3, min_len=3, max_len=20)
    rule = policy.plan(dk.DecodeState.from_prompts([[1]], [50], dk.SamplingParams(), None, torch.device("cpu"))).stop
    assert steps(rule, [[0.0], [logit(0.1)], [logit(0.9)]]) == [[False], [False], [True]]


@pytest.mark.parametrize(
    ("p", "threshold", "min_len", "max_len", "length"),
    [
        (0.9, 0.3, 2, 20, 5),  # 1 - 0.9^4 = 0.34 > 0.3 at j = 4; x_4 is kept
        (0.9, 0.3, 7, 20, 7),  # never below min_len
        (0.9, 0.3, 2, 3, 3),  # always at max_len
        (0.9, 0.0, 1, 20, 2),  # j = 0 never stops (p̂ = 1 there): 1 - Π_0 = 0
        (0.999, 0.3, 2, 6, 6),
    ],
)
def test_draft_lengths_in_the_loop(target, ragged_prompts, p, threshold, min_len, max_len, length):
    drafter = Recorder(ModelDrafter(perturbed(target, 0.3, seed=1)))
    policy = ThresholdHeadStop(constant_head(p), threshold, min_len=min_len, max_len=max_len)
    dk.generate(target, ragged_prompts, drafter, policy=policy, max_new_tokens=24, eos_token_id=())
    for draft, budget in drafter.drafts:
        expected = torch.clamp(budget.lengths, max=length)
        assert draft.num_valid.tolist() == expected.tolist()


def test_greedy_output_equals_plain_decoding(target, ragged_prompts):
    reference = dk.generate(target, ragged_prompts, max_new_tokens=30, eos_token_id=()).sequences
    torch.manual_seed(0)
    policy = ThresholdHeadStop(AcceptanceHead(H), threshold=0.5, min_len=2, max_len=6)
    drafter = ModelDrafter(perturbed(target, 0.3, seed=1))
    assert_greedy_twice(target, ragged_prompts, drafter, policy, reference, 30)


def test_sampled_run_is_reproducible(target, ragged_prompts):
    policy = ThresholdHeadStop(constant_head(0.8), threshold=0.5, max_len=6)
    drafter = ModelDrafter(perturbed(target, 0.3, seed=1))
    runs = [
        dk.generate(target, ragged_prompts, drafter, policy=policy, temperature=1.0, max_new_tokens=20, seed=3)
        for _ in range(2)
    ]
    assert runs[0].sequences == runs[1].sequences
    assert 0 < runs[0].stats.accepted < runs[0].stats.drafted


def test_one_host_sync_per_step_and_none_of_its_own(target):
    class Counting(ThresholdHeadStop):
        calls = 0

        def plan(self, state):
            budget = super().plan(state)
            rule = budget.stop

            def counted(step):
                Counting.calls += 1
                return rule(step)

            counted.needs_hidden = True
            return dk.DraftBudget(budget.nodes, stop=counted, node_bound=budget.node_bound)

    drafter = CountingModelDrafter(perturbed(target, 0.3, seed=1))
    policy = Counting(constant_head(0.8), threshold=0.5, max_len=4)
    dk.generate(target, PROMPTS, drafter=drafter, policy=policy, max_new_tokens=4)
    Counting.calls = 0
    with count_syncs() as counter:
        out = dk.generate(target, PROMPTS, drafter=drafter, policy=policy, max_new_tokens=40, eos_token_id=())
    assert Counting.calls > out.stats.rounds
    assert counter[0] <= 2 * out.stats.rounds + Counting.calls + OVERHEAD + drafter.leaves


def test_hidden_states_are_asked_for_only_by_rules_that_need_them(target, monkeypatch):
    drafter = ModelDrafter(perturbed(target, 0.3, seed=1))
    asked = []
    extend = drafter.model.extend

    def spy(*args, **kwargs):
        asked.append(kwargs.get("return_hidden", False))
        return extend(*args, **kwargs)

    monkeypatch.setattr(drafter.model, "extend", spy)
    dk.generate(target, PROMPTS, drafter, policy=dk.policies.ConfidenceStop(0.3, 4), max_new_tokens=12)
    assert asked and not any(asked)
    asked.clear()
    dk.generate(target, PROMPTS, drafter, policy=ThresholdHeadStop(constant_head(0.9), max_len=4), max_new_tokens=12)
    assert any(asked)


def test_missing_and_mismatched_weights(tmp_path, target, monkeypatch):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(ConfigError, match="no acceptance head at .*nope.safetensors.*decodekit train"):
        ThresholdHeadStop(weights=missing)
    monkeypatch.setattr(th, "default_weights", lambda: missing)
    with pytest.raises(ConfigError, match="reinstall"):
        ThresholdHeadStop()
    path = tmp_path / "head32.safetensors"
    AcceptanceHead(32, blocks=2).save(path, {"note": "test"})
    loaded = AcceptanceHead.load(path)
    assert (loaded.hidden_size, loaded.num_blocks, loaded.metadata["note"]) == (32, 2, "test")
    policy = ThresholdHeadStop(weights=path, max_len=4)
    drafter = ModelDrafter(perturbed(target, 0.3, seed=1))
    with pytest.raises(ConfigError, match=r"head32\.safetensors\) reads hidden size 32, but the draft model.s is 64"):
        dk.generate(target, PROMPTS, drafter, policy=policy, max_new_tokens=12)
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(Exception, match="junk"):
        ThresholdHeadStop(weights=tmp_path / "junk.safetensors")


def test_bad_arguments():
    with pytest.raises(ConfigError, match="threshold"):
        ThresholdHeadStop(constant_head(0.5), threshold=1.0)
    with pytest.raises(ConfigError, match="min_len=5 exceeds max_len=3"):
        ThresholdHeadStop(constant_head(0.5), min_len=5, max_len=3)


def test_a_drafter_without_hidden_states_is_refused():
    policy = ThresholdHeadStop(constant_head(0.5))
    rule = policy.plan(dk.DecodeState.from_prompts([[1]], [50], dk.SamplingParams(), None, torch.device("cpu"))).stop
    with pytest.raises(ConfigError, match="drafter=model"):
        rule(DraftStep(0, torch.zeros(1, dtype=torch.long), torch.ones(1)))


def test_training_loss_goes_down_checkpoints_and_resumes(tmp_path, target):
    from decodekit.train.threshold_head import train

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (int(n),), generator=gen).tolist() for n in torch.randint(2, 9, (16,))]
    args = dict(target=target, draft=perturbed(target, 0.3, seed=1), draft_kernels=None, prompts=prompts)
    args |= dict(max_new_tokens=16, shard_size=8, batch_size=32, save_every=4, progress=False, val_fraction=0.25)
    first = train(tmp_path, epochs=3, labels="both", **args)
    history = json.loads((tmp_path / "history.json").read_text())
    losses = [loss for _, loss in history["train"]]
    assert sum(losses[-3:]) < sum(losses[:3])
    assert all(math.isfinite(loss) for _, loss in history["val"])
    assert (tmp_path / "loss.png").stat().st_size > 0
    checkpoints = sorted((tmp_path / "checkpoints").glob("step_*"))
    assert checkpoints and (checkpoints[-1] / "model.safetensors").is_file()
    head = AcceptanceHead.load(tmp_path / "threshold_head.safetensors")
    assert head.metadata["labels"] == "both" and int(head.metadata["hidden_size"]) == H
    resumed = train(tmp_path, epochs=5, labels="both", resume=True, **args)
    assert resumed["steps"] == first["steps"] * 5 // 3
    again = json.loads((tmp_path / "history.json").read_text())
    assert again["train"][: len(history["train"])] == history["train"]  # continued, not restarted


def test_train_command_recipe_matches_the_training_function():
    from hydra import compose, initialize_config_dir
    from hydra.utils import get_method

    from decodekit.cli import TRAIN_RECIPES, train_recipe
    from decodekit.train.recipe import recipe_arguments

    assert train_recipe(["recipe=threshold_head", "epochs=2"]) == ("threshold_head", ["epochs=2"])
    names = "bdlm_adapter, dflash, dlm_adapter, draft_dlm, eagle, eagle3, exit_head, flexdraft, medusa, threshold_head"
    with pytest.raises(ConfigError, match=f"one of {names}"):
        train_recipe(["recipe=nope"])
    for recipe in sorted(p.stem for p in TRAIN_RECIPES.glob("*.yaml")):  # every recipe's keys are its function's
        with initialize_config_dir(config_dir=str(TRAIN_RECIPES), version_base="1.3"):
            cfg = compose(recipe, overrides=["seed=1"])
        parameters = recipe_arguments(get_method(cfg._target_))
        assert set(cfg) - {"_target_"} <= set(parameters) and "out_dir" in parameters and cfg.seed == 1


@pytest.mark.slow
def test_shipped_head_with_the_zoo_draft(smollm2):
    """The shipped head loads, matches the zoo's draft model and keeps greedy output exact."""
    target = smollm2
    draft = dk.load_model("smollm2-135m-instruct", kernels="int8")
    policy = ThresholdHeadStop()
    assert policy.head.hidden_size == 576 and "pydoc" in policy.head.metadata["data_source"]
    prompt = target.tokenizer("def fibonacci(n):")["input_ids"]
    reference = dk.generate(target, prompt, max_new_tokens=24).sequences
    out = dk.generate(target, prompt, ModelDrafter(draft), policy=policy, max_new_tokens=24)
    assert out.sequences == reference and out.stats.accepted > 0
