"""Every bad input is refused early with an error whose message names the argument (or the component and field),
grouped by entry point: generate() arguments, prompts, components passed to generate(), constructors,
load_model, the transformers bridge, the command line, component outputs in the round loop, no-progress rounds.
Each case asserts the specific error class and the name in the message; the positive cases check the forms that
must just work."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BatchEncoding, GenerationConfig, LlamaForCausalLM

import decodekit as dk
import decodekit.hf as bridge
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.errors import (
    ComponentOutputError,
    ConfigError,
    ConfigTypeError,
    ContextLengthError,
    EmptyPromptError,
    ModelNotFoundError,
    NoProgressError,
    UnknownComponentError,
)
from decodekit.models import HFCausalLM, zoo
from decodekit.models.tiny import tiny_llama
from decodekit.policies import ConfidenceStop, FixedLength, HeuristicLength
from decodekit.sampling import check_seed
from decodekit.verifiers import GreedyVerifier

PROMPT = [[1, 2, 3, 4]]
VOCAB = 128


class NeverCalled:
    """A drafter that fails the test if generate() reaches it: every check must come first."""

    vocab_size = VOCAB

    def propose(self, state, budget):
        raise AssertionError("generate() ran although its input was invalid")


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (Unix)."""

    def fail(*_):
        raise AssertionError(f"did not finish within {seconds} s: the loop hangs")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def greedy(target, prompts, **kwargs):
    kwargs.setdefault("max_new_tokens", 6)
    kwargs.setdefault("eos_token_id", ())
    return dk.generate(target, prompts, **kwargs)


# =============================================================================== generate() arguments
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(max_new_tokens=2.5), ConfigTypeError, r"max_new_tokens must be None or an integer >= 1, got 2.5 \("),
        (dict(max_new_tokens=True), ConfigTypeError, r"max_new_tokens .* got True \(bool\)"),
        (dict(max_new_tokens="8"), ConfigTypeError, "max_new_tokens"),
        (dict(max_new_tokens=0), ConfigError, "max_new_tokens must be None or an integer >= 1, got 0"),
        (dict(max_new_tokens=float("inf")), ConfigTypeError, "max_new_tokens"),
        (dict(temperature=float("nan")), ConfigError, "temperature must be None or a finite number >= 0"),
        (dict(temperature=float("inf")), ConfigError, "temperature"),
        (dict(temperature=-0.5), ConfigError, "temperature"),
        (dict(temperature="hot"), ConfigTypeError, "temperature"),
        (dict(temperature=[1.0]), ConfigTypeError, "temperature"),
        (dict(temperature=1.0, top_k=2.5), ConfigTypeError, "top_k must be None or an integer >= 1"),
        (dict(temperature=1.0, top_k=-1), ConfigError, "top_k"),
        (dict(temperature=1.0, top_k=True), ConfigTypeError, "top_k"),
        (dict(temperature=1.0, top_p=0.0), ConfigError, r"top_p must be None or a finite number in \(0, 1\]"),
        (dict(temperature=1.0, top_p=1.5), ConfigError, "top_p"),
        (dict(temperature=1.0, top_p=float("nan")), ConfigError, "top_p"),
        (dict(temperature=1.0, top_p="0.9"), ConfigTypeError, "top_p"),
        (dict(seed=1.5), ConfigTypeError, r"seed must be None, an integer, or a list of 1 integers"),
        (dict(seed="0"), ConfigTypeError, "seed"),
        (dict(seed=True), ConfigTypeError, "seed"),
        (dict(seed=2**64), ConfigError, "seed must be in"),
        (dict(seed=[1, 2]), ConfigError, "seed has 2 values for 1 prompts"),
        (dict(seed=[1.0]), ConfigTypeError, "seed"),
        (dict(seed=np.array([1])), ConfigTypeError, r"seed .*tolist"),
        (dict(seed=torch.tensor([0.5])), ConfigTypeError, "seed"),
        (dict(eos_token_id=VOCAB), ConfigError, r"eos_token_id must be .* got 128 \(outside the model's vocab"),
        (dict(eos_token_id=-1), ConfigError, "eos_token_id"),
        (dict(eos_token_id=[5, 200]), ConfigError, "eos_token_id"),
        (dict(eos_token_id="</s>"), ConfigTypeError, "eos_token_id"),
        (dict(eos_token_id=[5, 2.0]), ConfigTypeError, "eos_token_id"),
        (dict(eos_token_id=torch.tensor([1.0])), ConfigTypeError, "eos_token_id"),
        (dict(streamer=3), ConfigTypeError, r"streamer must be a callable streamer\(row, tokens\) or a transformers"),
        (dict(streamer="print"), ConfigTypeError, "streamer"),
        (dict(debug="yes"), ConfigTypeError, "debug must be True or False"),
    ],
)
def test_generate_arguments(target, kwargs, error, match):
    with pytest.raises(error, match=match):
        dk.generate(target, PROMPT, NeverCalled(), **kwargs)


@pytest.mark.parametrize("model", [None, 3, LlamaForCausalLM, [1, 2]])
def test_generate_model_argument(model):
    with pytest.raises(ConfigTypeError, match="model must be"):
        dk.generate(model, PROMPT)


def test_errors_are_value_and_type_errors():
    assert issubclass(ConfigTypeError, ConfigError) and issubclass(ConfigTypeError, TypeError)
    assert issubclass(ConfigTypeError, ValueError) and issubclass(ComponentOutputError, ConfigError)
    assert issubclass(ModelNotFoundError, FileNotFoundError) and issubclass(NoProgressError, dk.DecodeKitError)


def test_numpy_scalars_are_accepted(target):
    reference = greedy(target, PROMPT, max_new_tokens=4, temperature=0.5, seed=0).sequences
    out = dk.generate(
        target,
        PROMPT,
        max_new_tokens=np.int64(4),
        temperature=np.float32(0.5),
        seed=np.int64(0),
        eos_token_id=np.array([], dtype=np.int64),
    )
    assert out.sequences == reference
    assert greedy(target, PROMPT, eos_token_id=(np.int64(5), 7)).finish_reasons


def test_seed_per_prompt_is_checked_and_passed_on():
    check_seed([1, 2], 2)
    check_seed(torch.tensor([1, 2]), 2)
    check_seed(torch.tensor(3), 5)
    with pytest.raises(ConfigError, match="seed has 3 values for 2 prompts"):
        check_seed(torch.tensor([1, 2, 3]), 2)


# ============================================================================================ prompts
@pytest.mark.parametrize(
    ("prompts", "error", "match"),
    [
        (None, ConfigTypeError, r"prompts must be .*got None"),
        (5, ConfigTypeError, r"prompts must be .*got 5 \(int\)"),
        (b"abc", ConfigTypeError, "prompts must be"),
        ([[[1, 2]]], ConfigTypeError, r"prompts\[0\] must be a flat sequence of token ids"),
        ([[1, 2], 3], ConfigTypeError, r"prompts mixes token ids and prompts: prompts\[1\]"),
        (torch.tensor(3), ConfigError, r"prompts must be 1-D .* got a 0-D int64 tensor"),
        (torch.ones(1, 1, 3, dtype=torch.long), ConfigError, "prompts must be 1-D .* got a 3-D"),
        (np.ones((1, 1, 3), dtype=np.int64), ConfigError, "prompts must be 1-D .* numpy array"),
        ([[1.7, 2.2]], ConfigTypeError, r"prompts\[0\]: token ids must be integers, got 1.7 \(float\)"),
        ([1.0, 2.0], ConfigTypeError, r"prompts: token ids must be integers, got 1.0 \(float\)"),
        ([True, 2], ConfigTypeError, r"token ids must be integers, got True \(bool\)"),
        (torch.tensor([[1.0, 2.0]]), ConfigTypeError, "prompts: token ids must be integers, got a 2-D float32"),
        (np.array([[1.5, 2.0]]), ConfigTypeError, "prompts: token ids must be integers, got a 2-D float64 numpy"),
        ([torch.ones(1, 2, dtype=torch.long)], ConfigError, r"prompts\[0\] must be a 1-D sequence"),
        ([[1, VOCAB]], ConfigError, r"prompt 0 has token ids outside the vocabulary \[0, 128\)"),
        ([[-1, 2]], ConfigError, "prompt 0 has token ids outside the vocabulary"),
        (["hello"], ConfigError, r"prompts\[0\] is a string, and string prompts need a model with a tokenizer"),
        ([], EmptyPromptError, "no prompts given"),
        ([[1], []], EmptyPromptError, "prompt 1 is empty"),
        ([[1] * 256], ContextLengthError, "prompt 0 has 256 tokens"),
        ({"ids": [[1, 2]]}, ConfigError, "prompts is a mapping without 'input_ids'"),
        ({"input_ids": [[1.5, 2]]}, ConfigTypeError, r"prompts\['input_ids'\]\[0\]: token ids must be integers"),
        ({"input_ids": [[1, 2, 3]], "attention_mask": [[1, 0, 1]]}, ConfigError, r"attention_mask'\] row 0 has pad"),
        ({"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1]]}, ConfigError, r"attention_mask'\] must have the sha"),
        ({"input_ids": [[1, 2]], "attention_mask": [[1, 2]]}, ConfigError, r"attention_mask'\] must hold 0"),
        ({"input_ids": [[1, 2]], "attention_mask": [[0, 0]]}, EmptyPromptError, "prompt 0 is empty"),
    ],
)
def test_bad_prompts(target, prompts, error, match):
    bare = HFCausalLM(target)  # an adapter without a tokenizer (other tests attach one to the cached adapter)
    with pytest.raises(error, match=match):
        dk.generate(bare, prompts, NeverCalled())


def test_tokenizer_outputs_numpy_and_tensors_work(target, ragged_prompts):
    rows = ragged_prompts[:3]
    reference = greedy(target, rows).sequences
    width = max(len(r) for r in rows)
    for side in ("left", "right"):
        ids, mask = [], []
        for r in rows:
            pad = [0] * (width - len(r))
            ids.append(pad + r if side == "left" else r + pad)
            mask.append(pad + [1] * len(r) if side == "left" else [1] * len(r) + pad)
        encoded = BatchEncoding({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})
        assert greedy(target, encoded).sequences == reference, side
        assert greedy(target, {"input_ids": np.array(ids), "attention_mask": np.array(mask, bool)}).sequences == (
            reference
        )
    one = rows[0]
    expected = greedy(target, [one]).sequences
    for form in (one, tuple(one), np.array(one), torch.tensor(one), np.array([one]), [np.int64(t) for t in one]):
        assert greedy(target, form).sequences == expected
    assert greedy(target, {"input_ids": one, "attention_mask": [1] * len(one)}).sequences == expected
    assert greedy(target, {"input_ids": [one]}).sequences == expected


# =================================================================================== components passed
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(drafter=NGramDrafter), r"drafter must be an instance, got the class NGramDrafter; .* NGramDrafter\(\)"),
        (dict(drafter=NGramDrafter(), policy=FixedLength), r"policy must be an instance.*pass an instance: FixedL"),
        (dict(verifier=GreedyVerifier), r"verifier must be an instance.*GreedyVerifier\(\)"),
        (dict(policy=4), r"policy must implement the LengthPolicy protocol \(a plan\(state\) method\), got 4"),
        (dict(drafter=NGramDrafter(), policy=4), "policy must implement the LengthPolicy protocol"),
        (dict(verifier="greedy"), "verifier must implement the Verifier protocol"),
        (dict(drafter=object()), "drafter must implement the Drafter protocol"),
    ],
)
def test_components_passed_to_generate(target, kwargs, match):
    with pytest.raises(ConfigTypeError, match=match):
        dk.generate(target, PROMPT, **kwargs)


def test_draft_model_with_a_shorter_context(target):
    short = ModelDrafter(tiny_llama(1, max_position_embeddings=16))
    with pytest.raises(ContextLengthError, match="draft model of ModelDrafter has a context of 16 tokens"):
        dk.generate(target, PROMPT, short, max_new_tokens=32)
    assert len(greedy(target, PROMPT, drafter=short, max_new_tokens=8).sequences[0]) == 8  # fits: fine


# ======================================================================================== constructors
@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda t: FixedLength(2.5), ConfigTypeError, r"k must be an integer >= 0 .*got 2.5 \(float\)"),
        (lambda t: FixedLength(-1), ConfigError, "k must be an integer >= 0"),
        (lambda t: FixedLength("4"), ConfigTypeError, "k must be"),
        (lambda t: NGramDrafter(max_ngram="3"), ConfigTypeError, r"max_ngram must be an integer >= 1, got '3' \(str\)"),
        (lambda t: NGramDrafter(min_ngram=0), ConfigError, "min_ngram must be an integer >= 1"),
        (lambda t: NGramDrafter(max_ngram=1, min_ngram=2), ConfigError, "min_ngram <= max_ngram"),
        (lambda t: NGramDrafter(match="last"), ConfigError, "match must be 'recent' or 'first'"),
        (lambda t: ConfidenceStop(threshold=1.5), ConfigError, r"threshold must be a finite number in \[0, 1\]"),
        (lambda t: ConfidenceStop(threshold=float("nan")), ConfigError, "threshold"),
        (lambda t: ConfidenceStop(max_len=0), ConfigError, "max_len must be an integer >= 1"),
        (lambda t: HeuristicLength(initial=2.5), ConfigTypeError, "initial must be an integer"),
        (lambda t: HeuristicLength(increase=-1), ConfigError, "increase must be an integer >= 0"),
        (lambda t: HeuristicLength(min_len=0, initial=0), ConfigError, "min_len must be an integer >= 1"),
        (lambda t: HeuristicLength(initial=100), ConfigError, "min_len <= initial <= max_len"),
        (lambda t: ModelDrafter(None), ConfigTypeError, "model must be a decodekit LanguageModel"),
        (lambda t: ModelDrafter(LlamaForCausalLM), ConfigTypeError, "model must be a model instance, got the class"),
        (lambda t: ModelDrafter(t, temperature=-1), ConfigError, "temperature must be None or a finite number"),
        (lambda t: ModelDrafter(t, temperature="0"), ConfigTypeError, "temperature"),
        (lambda t: dk.SamplingParams(temperature=float("nan")), ConfigError, "temperature"),
        (lambda t: dk.dlm.LLaDARule("lowest"), ConfigError, "remasking must be one of 'low_confidence', 'random'"),
        (lambda t: dk.dlm.ProphetRule(region="all"), ConfigError, "region must be one of 'masked', 'block', got 'all'"),
        (lambda t: dk.dlm.ProphetRule(reduce="max"), ConfigError, "reduce must be one of 'mean', 'min', got 'max'"),
        (lambda t: dk.dlm.SpiffyDrafts(width=2, depth=3), ConfigError, r"depth must be an integer in \[1, 2\]"),
    ],
)
def test_constructors(target, build, error, match):
    with pytest.raises(error, match=match):
        build(target)


# ========================================================================================== load_model
@pytest.fixture
def no_loading(monkeypatch):
    """Any conversion, hub access or from_pretrained fails the test: the checks must come first."""

    def fail(*args, **kwargs):
        raise AssertionError("load_model loaded or converted something although its input was invalid")

    import transformers

    monkeypatch.setattr(zoo, "cached_model_dir", fail)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)


@pytest.mark.parametrize(
    ("spec", "kwargs", "error", "match"),
    [
        ("smollm2-135m-instuct", {}, ModelNotFoundError, r"did you mean 'smollm2-135m-instruct'.*available: smol"),
        ("/no/such/model", {}, ModelNotFoundError, r"model '/no/such/model' is neither a zoo model .*not download"),
        (None, {}, ConfigTypeError, "spec must be a decodekit LanguageModel"),
        (LlamaForCausalLM, {}, ConfigTypeError, "spec must be a model instance, got the class LlamaForCausalLM"),
        ("tiny", dict(dtype="flaot32"), ConfigError, "unknown dtype 'flaot32'"),
        ("tiny", dict(dtype=torch.int64), ConfigError, "dtype must be a floating-point dtype"),
        ("tiny", dict(dtype=3), ConfigTypeError, "dtype must be a torch.dtype or its name"),
        ("tiny", dict(device="gpu"), ConfigError, "device must be a device such as 'cpu'"),
        ("tiny", dict(device="cuda:99"), ConfigError, "device='cuda:99'"),
        ("tiny", dict(device=1.5), ConfigTypeError, "device must be a torch.device"),
        ("tiny", dict(kernels="fp4"), ConfigError, "unknown kernels 'fp4'"),
        ("tiny", dict(kernels=8), ConfigError, "unknown kernels 8"),
        ("tiny", dict(tokenizer="gpt2"), ConfigTypeError, "tokenizer must be a tokenizer object, got the string"),
        ("tiny", dict(tokenizer=BatchEncoding), ConfigTypeError, "tokenizer must be an instance"),
        ("tiny", dict(tokenizer=3), ConfigTypeError, "tokenizer must be callable"),
        ("tiny", dict(in_place="yes"), ConfigTypeError, "in_place must be True or False"),
        ("smollm2-135m-instruct", dict(dtype="int8"), ConfigError, "dtype must be a floating-point"),
        ("smollm2-135m-instruct", dict(device="gpu"), ConfigError, "device must be"),
        ("smollm2-135m-instruct", dict(kernels="fp4"), ConfigError, "unknown kernels"),
    ],
)
def test_load_model(no_loading, spec, kwargs, error, match):
    with pytest.raises(error, match=match):
        dk.load_model(tiny_llama(0) if spec == "tiny" else spec, **kwargs)


def test_zoo_names_are_checked(no_loading):
    with pytest.raises(UnknownComponentError, match=r"unknown zoo model 'smollm2'.*available: smollm2-135m-instruct"):
        zoo.load_zoo_model("smollm2")
    with pytest.raises(ConfigTypeError, match="name must be a zoo name"):
        zoo.load_zoo_model(3)


def test_load_model_leaves_the_callers_model_alone():
    hf = tiny_llama(0)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    plain = dk.load_model(hf)
    wide = dk.load_model(hf, dtype=torch.float64)
    fast = dk.load_model(hf, kernels="onednn")
    assert wide.dtype == torch.float64 and wide.hf is not hf and fast.hf is not hf
    assert all(p.dtype == torch.float32 for p in hf.parameters())
    assert type(hf.model.layers[0].mlp.up_proj) is torch.nn.Linear
    assert all(torch.equal(before[k], v) for k, v in hf.state_dict().items())
    assert dk.load_model(hf) is plain and dk.load_model(hf, dtype="float32") is plain  # no change asked: no copy
    assert dk.load_model(plain, dtype=torch.float64).hf is not hf  # an adapter's model is left alone too
    assert len(greedy(wide, PROMPT).sequences[0]) == 6


def test_load_model_from_a_directory_without_tokenizer(tmp_path, capsys):
    """A saved model without a tokenizer loads (token-id prompts) with a warning, and prints no loading bar."""
    model = tiny_llama(0)
    model.save_pretrained(tmp_path)
    capsys.readouterr()
    with pytest.warns(UserWarning, match="no tokenizer could be loaded"):
        adapter = dk.load_model(str(tmp_path))
    assert "Loading weights" not in "".join(capsys.readouterr())
    assert adapter.tokenizer is None
    assert (
        dk.generate(adapter, [[1, 2, 3]], max_new_tokens=4).sequences
        == dk.generate(model, [[1, 2, 3]], max_new_tokens=4).sequences
    )


def test_load_model_in_place_is_opt_in():
    hf = tiny_llama(0)
    adapter = dk.load_model(hf, dtype=torch.float64, in_place=True)
    assert adapter.hf is hf and all(p.dtype == torch.float64 for p in hf.parameters())


# ================================================================================== transformers bridge
def bridged(target, ids, **kwargs):
    config = GenerationConfig(max_length=ids.shape[1] + 4, do_sample=False)
    return bridge.custom_generate(target, ids, generation_config=config, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(drafter=NGramDrafter), ConfigTypeError, r"drafter must be an instance.*NGramDrafter\(\)"),
        (dict(policy=4), ConfigTypeError, "policy must implement the LengthPolicy protocol"),
        (dict(seed=[1, 2]), ConfigError, "seed has 2 values for 1 prompts"),
        (dict(seed=0.5), ConfigTypeError, "seed must be"),
        (dict(streamer=3), ConfigTypeError, r"streamer must be a transformers streamer \(put"),
        (dict(streamer=NeverCalled), ConfigTypeError, "streamer must be an instance"),
    ],
)
def test_bridge_arguments(target, kwargs, error, match):
    with pytest.raises(error, match=match):
        bridged(target, torch.tensor([[5, 17, 3]]), **kwargs)


def test_bridge_refuses_float_input_ids(target):
    with pytest.raises(ConfigError, match=r"input_ids must be an integer tensor \[batch, length\]"):
        bridged(target, torch.tensor([[5.0, 17.0]]))


# ======================================================================================= command line
@pytest.fixture
def compose_bench(monkeypatch):
    from hydra import compose, initialize_config_dir

    from decodekit.cli import RECIPES

    def fail(*args, **kwargs):
        raise AssertionError("a model was loaded although the config was invalid")

    monkeypatch.setattr(dk.models, "load_zoo_model", fail)

    def compose_with(overrides):
        with initialize_config_dir(config_dir=str(Path(RECIPES)), version_base="1.3"):
            return compose("bench", overrides=overrides)

    return compose_with


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        (["max_new_tokens=abc"], ConfigTypeError, r"max_new_tokens must be an integer >= 1, got 'abc' \(str\)"),
        (["seed=1.5"], ConfigTypeError, "seed must be an integer"),
        (["progress=maybe"], ConfigTypeError, "progress must be True or False"),
        (["batch_sizes=4"], ConfigTypeError, "batch_sizes must be a non-empty list"),
        (["batch_sizes=[1,x]"], ConfigTypeError, r"batch_sizes\[1\] must be an integer >= 1"),
        (["task.num_prompts=many"], ConfigTypeError, "task.num_prompts must be None or an integer"),
        (["task.max_prompt_tokens=0"], ConfigError, "task.max_prompt_tokens must be an integer >= 1"),
        (["settings=[{name:a,temperature:hot}]"], ConfigTypeError, r"settings\[0\].temperature must be a finite"),
        (["+settings.0.foo=1"], ConfigError, r"settings\[0\] has unknown keys \['foo'\]"),
        (["+methods.autoregressive.fresh=sometimes"], ConfigTypeError, "methods.autoregressive.fresh must be True"),
        (["+task.num_promts=2"], ConfigError, r"task has unknown keys \['num_promts'\] \(did you mean 'num_prompts'"),
        (["+max_new_token=4"], ConfigError, r"unknown keys \['max_new_token'\] \(did you mean 'max_new_tokens'"),
    ],
)
def test_cli_plain_values(compose_bench, overrides, error, match):
    from decodekit.bench.config import check_bench_config

    with pytest.raises(error, match=match):
        check_bench_config(compose_bench(overrides))


def test_a_verifier_that_refuses_a_setting_is_refused_before_the_model_loads(compose_bench):
    from decodekit.bench.sweep import build_methods

    cfg = compose_bench(["verifier=greedy", "settings=[{name:t08,temperature:0.8}]"])
    with pytest.raises(ConfigError, match="methods.speculative.verifier cannot run settings t08: GreedyVerifier"):
        build_methods(cfg)  # compose_bench fails the test if a model loads


def test_every_packaged_experiment_passes_the_config_check(compose_bench):
    """Their own top-level keys (``candidate``, ``dflash_weights``, ...) are not taken for a user's typo."""
    from decodekit.bench.config import check_bench_config
    from decodekit.cli import RECIPES

    for path in sorted((Path(RECIPES) / "experiment").glob("*.yaml")):
        check_bench_config(compose_bench([f"experiment={path.stem}"]))


@pytest.mark.parametrize(
    ("overrides", "key", "error", "match"),
    [
        (["policy.k=abc"], "policy", ConfigTypeError, r"policy.k must be an integer >= 0 .*got 'abc' \(str\)"),
        (["policy.k=2.5"], "policy", ConfigTypeError, "policy.k must be an integer"),
        (["policy=heuristic", "policy.min_len=x"], "policy", ConfigTypeError, "policy.min_len must be an integer"),
        (["drafter.max_ngram=x"], "drafter", ConfigTypeError, "drafter.max_ngram must be an integer >= 1"),
        (["+drafter.foo=1"], "drafter", ConfigTypeError, "drafter: TypeError: .*unexpected keyword argument 'foo'"),
        (["drafter=model", "drafter.model.kernels=fp4"], "drafter", ConfigError, "drafter.model: unknown kern"),
        (["drafter=model", "+drafter.model.dtype=int64"], "drafter", ConfigError, "drafter.model.dtype must be"),
    ],
)
def test_cli_component_overrides(compose_bench, overrides, key, error, match):
    from decodekit.instantiate import build_component

    cfg = compose_bench(overrides)
    with pytest.raises(error, match=match):
        build_component(cfg[key], key)


def test_cli_reports_a_bad_override_without_a_traceback(monkeypatch, capsys, tmp_path):
    from decodekit.cli import main

    monkeypatch.setattr(sys, "argv", ["decodekit"])
    with pytest.raises(SystemExit) as info:
        main(
            [
                "bench",
                "policy.k=abc",
                f"hydra.run.dir={tmp_path}",
                "hydra.output_subdir=null",
                "hydra/job_logging=disabled",
                "hydra/hydra_logging=disabled",
            ]
        )
    assert info.value.code == 2
    assert "error: policy.k must be an integer >= 0" in capsys.readouterr().err


# ==================================================================================== component outputs
class Returns:
    """A drafter / policy / verifier whose output is replaced by ``make(state_or_draft, default)``."""

    def __init__(self, make, base=None):
        self.make, self.base = make, base

    def propose(self, state, budget):
        return self.make(state, NGramDrafter(max_ngram=2).propose(state, budget))

    def plan(self, state):
        return self.make(state, FixedLength(3).plan(state))


class VerifierReturns(GreedyVerifier):
    def __init__(self, make):
        self.make = make

    def verify(self, draft, logits, sampling, generator):
        return self.make(draft, super().verify(draft, logits, sampling, generator))


def _verdict(v, **fields):
    return dk.Verdict(**({"accepted": v.accepted, "num_accepted": v.num_accepted, "next_token": v.next_token} | fields))


REPEAT = [[5, 6, 7, 5, 6, 7, 5, 6]]  # the n-gram drafter drafts every round


@pytest.mark.parametrize(
    ("role", "make", "match"),
    [
        ("drafter", lambda s, d: (d.tokens, d.valid), r"Returns.propose must return a Draft, got \("),
        ("drafter", lambda s, d: dk.Draft.chain(d.tokens.repeat(2, 1)), "Returns.propose returned a draft of 2 rows"),
        ("drafter", lambda s, d: dk.Draft.chain(d.tokens.int()), r"Draft.tokens must be a torch.int64 tensor.*long"),
        ("drafter", lambda s, d: dk.Draft(d.tokens, d.parents, d.valid.long()), "Draft.valid must be a torch.bool"),
        ("drafter", lambda s, d: dk.Draft.chain(d.tokens, kind="guessed"), "Draft.kind must be a DraftKind"),
        ("policy", lambda s, b: b.nodes, "Returns.plan must return a DraftBudget, got a 1-D"),
        (
            "policy",
            lambda s, b: dk.DraftBudget(b.nodes.repeat(2)),
            "Returns.plan returned a malformed DraftBudget: nod",
        ),
        ("policy", lambda s, b: dk.DraftBudget(b.nodes.float()), "DraftBudget.nodes must be an integer tensor"),
        ("policy", lambda s, b: dk.DraftBudget(b.nodes, node_bound=-1), "DraftBudget.node_bound must be"),
        ("policy", lambda s, b: dk.DraftBudget(b.nodes, width=2.0), "DraftBudget.width must be"),
        ("policy", lambda s, b: dk.DraftBudget(b.nodes - 5), "Returns.plan returned a malformed DraftBudget: nodes mu"),
        ("verifier", lambda d, v: (v.num_accepted, v.next_token), r"VerifierReturns.verify must return a Verdict"),
        ("verifier", lambda d, v: _verdict(v, num_accepted=v.num_accepted.int()), "Verdict.num_accepted must be a"),
        ("verifier", lambda d, v: _verdict(v, next_token=v.next_token[:, None]), r"Verdict.next_token must be .*\[B\]"),
        ("verifier", lambda d, v: _verdict(v, num_accepted=v.num_accepted.repeat(2)), "must have the same B"),
    ],
)
@pytest.mark.parametrize("debug", [False, True])
def test_malformed_component_outputs(target, role, make, match, debug):
    parts = {"drafter": NGramDrafter(max_ngram=2), "policy": FixedLength(3), "verifier": GreedyVerifier()}
    parts[role] = VerifierReturns(make) if role == "verifier" else Returns(make)
    with pytest.raises(ComponentOutputError, match=match):
        dk.generate(target, REPEAT, **parts, max_new_tokens=8, debug=debug)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d, v: _verdict(v, num_accepted=v.num_accepted + 5), r"num_accepted must be in \[0, the row's valid"),
        (lambda d, v: _verdict(v, next_token=v.next_token + VOCAB), r"next_token must be in \[0, 128\)"),
        (lambda d, v: _verdict(v, accepted=v.accepted.flip(1)), "accepted must"),
    ],
)
def test_verdict_values_are_checked_in_debug_mode(target, make, match):
    self_draft = ModelDrafter(target)  # the target accepts all of it: paths of 3
    with pytest.raises(ComponentOutputError, match=rf"VerifierReturns.verify returned a malformed Verdict: {match}"):
        dk.generate(target, PROMPT, self_draft, VerifierReturns(make), FixedLength(3), max_new_tokens=8, debug=True)


def test_debug_mode_passes_the_stock_components(target, ragged_prompts):
    for drafter, temperature in ((NGramDrafter(), 1.0), (ModelDrafter(target), 0.0), (None, 0.7)):
        out = dk.generate(
            target, ragged_prompts, drafter, temperature=temperature, seed=0, max_new_tokens=10, debug=True
        )
        assert all(len(s) <= 10 for s in out.sequences)


# ========================================================================================== no progress
@pytest.mark.parametrize("drafter", [None, NGramDrafter(max_ngram=2)])
def test_a_round_without_progress_raises(target, drafter):
    """A verifier that rejects past the pending token (num_accepted = -1) commits nothing: the loop used to spin
    forever; the host lengths it reads anyway show it, without a sync. (From its second round on: the first round's
    verdict values are checked, which refuses -1 as a ComponentOutputError.)"""
    calls = iter(range(10**6))

    def stuck(d, v):  # num_accepted = -1 for rows without a draft, from the second call on
        return v if next(calls) == 0 else _verdict(v, num_accepted=torch.where(d.num_valid > 0, 0, -1))

    broken = VerifierReturns(stuck)
    with deadline(30), pytest.raises(NoProgressError, match=r"VerifierReturns.verify returned num_accepted=\[-1\]"):
        dk.generate(target, PROMPT, drafter, broken, max_new_tokens=8)


def test_huge_ngram_and_zero_budgets_finish(target):
    with deadline(30):
        out = greedy(target, REPEAT, drafter=NGramDrafter(max_ngram=10**9))
        assert len(out.sequences[0]) == 6
        assert greedy(target, REPEAT, drafter=NGramDrafter(), policy=FixedLength(0)).sequences == out.sequences
