"""Shared model state and trained parts: clear early errors, never silent wrongness.

1. A call never changes the shared target: a plain call that runs while an early-exit, layer-skipping, capturing or
   attention-recording forward of the same model is in flight (on another thread, or started from inside one of its
   layers) gets the whole model's tokens, and the model is left as it was.
2. Head files (EAGLE, exit head) with a tensor of the wrong shape, or made for another target, are refused naming
   the file, the tensor and both shapes, or the target the head was trained for.
3. The train command checks every override before building any data, and refuses training data cached for
   another base model.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import decodekit as dk
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.errors import ConfigError
from decodekit.masks import chain_mask
from decodekit.models.tiny import tiny_llama

PROMPT = [[5, 9, 2, 7, 1, 3, 8]]
NEW = 6


@pytest.fixture(scope="module")
def lm():
    return dk.load_model(tiny_llama(3, layers=4))


def plain(lm):
    return dk.generate(lm, PROMPT, max_new_tokens=NEW, eos_token_id=()).sequences


def forward(lm, tokens, **kwargs):
    cache = lm.new_cache(tokens.shape[0], 16)
    view = cache.stage(tokens.shape[1])
    mask, positions = chain_mask(cache.lengths, tokens.shape[1], view.kv_len)
    return lm.forward(tokens, positions, mask, view, **kwargs)


def model_state(lm):
    """What a call could leave changed: the decoder's blocks and every module's hooks, transformers' sdpa entry."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.hf.modules())
    return [id(layer) for layer in lm.decoder.layers], hooks, ALL_ATTENTION_FUNCTIONS["sdpa"]


class InFlight:
    """A hook in ``layer`` that runs ``inner()`` once, while the forward ``outer()`` starts is in flight."""

    def __init__(self, layer, inner):
        self.layer, self.inner, self.armed, self.result = layer, inner, False, None

    def run(self, outer):
        handle = self.layer.register_forward_hook(self._hook)
        try:
            return outer()
        finally:
            handle.remove()

    def _hook(self, *_):
        if self.armed:
            self.armed = False
            self.result = self.inner()


class DraftsArmed(EarlyExitDrafter):
    """Early exit whose first draft step arms ``flight`` (its hook then fires inside that early-exit forward)."""

    def __init__(self, flight, **kwargs):
        super().__init__(**kwargs)
        self.flight, self.fired = flight, False

    def _step(self, x, offset, hidden):
        if not self.fired:
            self.fired, self.flight.armed = True, True
        return super()._step(x, offset, hidden)


@pytest.mark.parametrize("args", [{"exit_layer": 1}, {"skip": (2, 3)}], ids=["exit", "skip"])
def test_a_plain_call_during_an_early_exit_forward_runs_the_whole_model(lm, args):
    reference, before = plain(lm), model_state(lm)
    flight = InFlight(lm.decoder.layers[0], lambda: plain(lm))
    drafter = DraftsArmed(flight, exit_layer=args.get("exit_layer"))
    if "skip" in args:  # SWIFT's layer_args: the same drafter with layers skipped instead of an exit
        drafter.layer_args = lambda: {"skip_layers": args["skip"]}
    out = flight.run(lambda: dk.generate(lm, PROMPT, drafter, max_new_tokens=NEW, eos_token_id=()).sequences)
    assert drafter.fired and flight.result is not None
    assert flight.result == reference  # the old code ran the inner call with the early-exit call's 1 (or 2) layers
    assert out == reference  # the drafting call itself stays lossless
    assert model_state(lm) == before


def test_plain_and_early_exit_calls_on_two_threads(lm):
    reference, before = plain(lm), model_state(lm)
    results: dict[str, list] = {"plain": [], "early": []}
    errors: list[BaseException] = []

    def loop(name, call):
        try:
            for _ in range(3):
                results[name].append(call())
        except BaseException as e:  # reported below
            errors.append(e)

    early = lambda: dk.generate(lm, PROMPT, EarlyExitDrafter(1), max_new_tokens=NEW, eos_token_id=()).sequences  # noqa: E731
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the two threads finely
    try:
        threads = [threading.Thread(target=loop, args=a) for a in (("plain", lambda: plain(lm)), ("early", early))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors
    assert results["plain"] == [reference] * 3 and results["early"] == [reference] * 3
    assert model_state(lm) == before and lm.num_layers == 4


def test_captured_hidden_states_are_the_calls_own(lm):
    tokens, other = torch.tensor([[5, 9, 2, 7]]), torch.tensor([[1, 1, 4, 4, 2, 2]])
    alone = forward(lm, tokens, hidden_layers=(0, 1)).hidden
    flight = InFlight(lm.decoder.layers[2], lambda: forward(lm, other, hidden_layers=(1,)))
    flight.armed = True  # the inner forward runs after the outer one captured layers 0 and 1
    out = flight.run(lambda: forward(lm, tokens, hidden_layers=(0, 1)))
    assert flight.result is not None and flight.result.hidden[1].shape[1] == 6
    for i in (0, 1):  # the old code's hooks let the inner forward overwrite them
        torch.testing.assert_close(out.hidden[i], alone[i], rtol=0, atol=0)


def test_recorded_attention_is_the_calls_own(lm):
    tokens, other = torch.tensor([[5, 9, 2, 7]]), torch.tensor([[1]])  # one query: transformers' own sdpa path
    alone: dict[int, torch.Tensor] = {}
    lm.record_attention(alone)
    forward(lm, tokens)
    before = model_state(lm)
    sink: dict[int, torch.Tensor] = {}
    flight = InFlight(lm.decoder.layers[2], lambda: forward(lm, other))
    flight.armed = True
    lm.record_attention(sink)
    flight.run(lambda: forward(lm, tokens))
    assert sorted(sink) == sorted(alone) == [0, 1, 2, 3]
    for i in alone:  # the old code recorded the inner forward's attention into the outer call's sink
        torch.testing.assert_close(sink[i], alone[i], rtol=0, atol=0)
    assert model_state(lm) == before  # transformers' sdpa entry is its own again


def test_a_recording_left_for_one_thread_is_not_taken_by_another(lm):
    sink: dict[int, torch.Tensor] = {}
    lm.record_attention(sink)
    other = threading.Thread(target=lambda: forward(lm, torch.tensor([[1, 2, 3]])))
    other.start()
    other.join()
    assert sink == {}  # the old code's adapter handed this thread's sink to the other thread's forward
    forward(lm, torch.tensor([[5, 9, 2, 7]]))
    assert sorted(sink) == [0, 1, 2, 3]


def test_hidden_layers_a_forward_does_not_run_are_refused(lm):
    with pytest.raises(ConfigError, match=r"hidden_layers \[3\] are not run by this forward"):
        forward(lm, torch.tensor([[1, 2]]), exit_layer=2, hidden_layers=(1, 3))
    with pytest.raises(ConfigError, match=r"hidden_layers \[2\] are not run"):
        forward(lm, torch.tensor([[1, 2]]), skip_layers=(2,), hidden_layers=(2,))


# ---------------------------------------------------------------------------------------- 2. head files


def rewrite(path, drop=(), drop_metadata=(), **tensors):
    """Rewrite the safetensors file ``path``: tensors replaced or added (``tensors``), tensors and metadata keys
    dropped; the rest kept."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), "pt") as f:
        meta = {k: v for k, v in f.metadata().items() if k not in drop_metadata}
        kept = {k: f.get_tensor(k) for k in f.keys() if k not in drop}  # noqa: SIM118
    save_file({**kept, **tensors}, str(path), metadata=meta)


@pytest.fixture(scope="module")
def head_target():
    return dk.load_model(tiny_llama(5, layers=4))


def eagle_file(tmp_path, lm, **metadata):
    from decodekit.drafters.eagle_head import EagleHead
    from decodekit.drafters.head_files import head_metadata

    path = tmp_path / "eagle.safetensors"
    EagleHead(lm.hf.config, taps=len(metadata.get("layers", ()))).save(path, head_metadata(lm, base="tiny", **metadata))
    return path


def exit_file(tmp_path, lm):
    from decodekit.drafters.exit_head import ExitHead
    from decodekit.drafters.head_files import head_metadata

    path = tmp_path / "exit.safetensors"
    ExitHead(lm.hf.config.hidden_size, 16, 2, torch.arange(lm.vocab_size)).save(path, head_metadata(lm, base="tiny"))
    return path


def medusa_file(tmp_path, lm):
    from decodekit.drafters.head_files import head_metadata
    from decodekit.drafters.medusa import MedusaHeads

    path = tmp_path / "medusa.safetensors"
    MedusaHeads(lm.hf.config.hidden_size, 2, torch.arange(lm.vocab_size)).save(path, head_metadata(lm, base="tiny"))
    return path


@pytest.mark.parametrize(
    ("kind", "tensor", "found", "expected"),
    [
        ("eagle", "fc.weight", [64, 64], [64, 128]),
        ("eagle", "decoder.layers.0.mlp.up_proj.weight", [96, 64], [128, 64]),
        ("exit", "up.weight", [8, 64], [16, 64]),
        ("medusa", "blocks.1.weight", [64, 32], [64, 64]),
    ],
)
def test_a_head_file_with_a_wrong_shape_tensor_names_it(head_target, tmp_path, kind, tensor, found, expected):
    from decodekit.drafters.eagle import EagleDrafter
    from decodekit.drafters.medusa import MedusaDrafter

    path = {"eagle": eagle_file, "exit": exit_file, "medusa": medusa_file}[kind](tmp_path, head_target)
    rewrite(path, **{tensor: torch.zeros(found, dtype=torch.float16)})
    make = {
        "eagle": lambda: EagleDrafter(weights=path, target=head_target),
        "exit": lambda: EarlyExitDrafter(exit_head=path, target=head_target),
        "medusa": lambda: MedusaDrafter(weights=path, target=head_target),
    }[kind]
    with pytest.raises(ConfigError) as error:  # the old code: torch's "Error(s) in loading state_dict ..."
        make()
    message = str(error.value)
    assert str(path) in message and f"{tensor!r} has shape {found} in the file, expected {expected}" in message
    assert "train one for this target with python -m decodekit train recipe=" in message


def test_a_head_file_missing_a_tensor_names_it(head_target, tmp_path):
    path = exit_file(tmp_path, head_target)
    rewrite(path, drop=("down.bias",))
    with pytest.raises(ConfigError, match=r"tensor 'down\.bias' is missing"):
        EarlyExitDrafter(exit_head=path, target=head_target)


@pytest.mark.parametrize("drafter", ["eagle3", "lookup_eagle3"])
def test_the_shipped_eagle3_head_on_another_target_says_what_it_was_trained_for(head_target, drafter):
    forwards = []
    handle = head_target.hf.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:  # the old code: "Eagle3Drafter.hidden_layers must be ... in [0, 4] ..., got (2, 15, 27)"
        with pytest.raises(ConfigError, match=r"trained for 'smollm2-135m-instruct'.*recipe=eagle3"):
            dk.generate(head_target, PROMPT, dk.build("drafter", drafter), max_new_tokens=2)
    finally:
        handle.remove()
    assert forwards == []  # refused when the call starts, before the prefill


def test_an_eagle3_head_reading_layers_the_target_lacks_says_so(head_target, tmp_path):
    """The same embeddings (a truncated copy of the target it was trained for), fewer layers."""
    from decodekit.drafters.eagle import EagleDrafter
    from decodekit.models.truncate import truncate_layers

    short = dk.load_model(truncate_layers(head_target.hf, 2))
    path = eagle_file(tmp_path, head_target, layers=[1, 2, 4])
    with pytest.raises(ConfigError, match=r"'tiny' with 4 layers; this target has 2"):
        dk.generate(short, PROMPT, EagleDrafter(weights=path), max_new_tokens=2)
    rewrite(path, drop_metadata=("num_layers",))  # a file from before heads recorded their target's layer count
    with pytest.raises(ConfigError, match=r"trained for 'tiny': it reads that model's layers \[1, 2, 4\], and this"):
        dk.generate(short, PROMPT, EagleDrafter(weights=path), max_new_tokens=2)


# ---------------------------------------------------------------------------------------- 3. the train command

RECIPES = ("eagle", "eagle3", "medusa", "exit_head", "threshold_head", "dlm_adapter", "dflash", "flexdraft")
BAD = [  # (argument, bad value, what the refusal says); each recipe gets those among its arguments
    ("epochs", "abc", r"epochs must be an integer >= 1, got 'abc'"),
    ("lr", -1e-3, r"lr must be a finite number > 0"),
    ("warmup", 1.5, r"warmup must be a finite number in \[0, 1\)"),
    ("weight_decay", -0.1, r"weight_decay must be a finite number >= 0"),
    ("val_fraction", 0, r"val_fraction must be a finite number in \(0, 1\)"),
    ("batch_size", 0, r"batch_size must be an integer >= 1"),
    ("seed", -1, r"seed must be an integer >= 0"),
    ("progress", "yes", r"progress must be"),
    ("decay", -0.5, r"decay must be a finite number in \(0, 1\].*maximise"),
    ("noise", -0.1, r"noise must be a finite number >= 0"),
    ("ce_weight", -1, r"ce_weight must be a finite number >= 0.*maximise"),
    ("reject_weight", -6, r"reject_weight must be a finite number > 0.*maximise"),
    ("mixing", 1.0, r"mixing must be a finite number in \[0, 1\)"),
    ("labels", "all", r"labels must be one of 'greedy', 'sampled', 'both'"),
    ("vocab_sizes", [], r"vocab_sizes must be a non-empty list"),
    ("layers", [2, 0], r"layers\[1\] must be an integer >= 1"),
    ("ttt_steps", 0, r"ttt_steps must be an integer >= 1"),
    ("tuned_layers", 0, r"tuned_layers must be an integer >= 1"),
    ("mask_token_id", -1, r"mask_token_id must be an integer >= 0"),
    ("num_heads", 0, r"num_heads must be an integer >= 1"),
    ("width", -16, r"width must be an integer >= 1"),
    ("seq_len", 1, r"seq_len must be an integer >= 2"),
    ("max_new_tokens", 0, r"max_new_tokens must be an integer >= 1"),
    ("chat_prompts", -1, r"chat_prompts must be an integer >= 0"),
    ("init", "no-such-head.safetensors", r"init='no-such-head.safetensors': no such file"),
    ("alpha", 0, r"alpha must be a finite number > 0"),
    ("mixed_precision", "fp8", r"mixed_precision must be one of 'no', 'bf16', 'fp16'"),
    ("name", "a/b", r"name names the file the run writes"),
    ("sequences", {"seq_len": 0}, r"sequences\.seq_len must be an integer >= 2"),
    ("time_budget_s", -5, r"time_budget_s must be None or a finite number > 0"),
]


def _recipe_cases():
    import importlib

    from decodekit.train.recipe import recipe_arguments

    for recipe in RECIPES:
        parameters = recipe_arguments(importlib.import_module(f"decodekit.train.{recipe}").train)
        for name, value, match in BAD:
            if name in parameters:
                yield pytest.param(recipe, name, value, match, id=f"{recipe}-{name}")


@pytest.mark.parametrize(("recipe", "name", "value", "match"), list(_recipe_cases()))
def test_every_recipe_refuses_a_bad_argument_before_any_model_or_data_work(tmp_path, recipe, name, value, match):
    import importlib

    train = importlib.import_module(f"decodekit.train.{recipe}").train
    models = {"target": "no-such-model", "draft": "no-such-model"} if recipe == "threshold_head" else {}
    models = models or {"base": "no-such-model"}
    with pytest.raises(ConfigError, match=match):  # the old code: a missing model (or, with one, after the data)
        train(tmp_path / "run", **models, **{name: value})
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("recipe", "known"),
    [("eagle", "epochs"), ("eagle3", "epochs"), ("exit_head", "epochs"), ("medusa", "epochs"),
     ("threshold_head", "epochs"), ("dlm_adapter", "max_steps")],
)  # fmt: skip
def test_a_head_recipe_refuses_an_argument_it_does_not_have(tmp_path, recipe, known):
    """Every recipe takes the shared knobs as ``**shared`` (:class:`decodekit.train.recipe.RunConfig`, for the heads
    on features :class:`~decodekit.train.recipe.HeadConfig`): a typo fails first, naming it, the recipe and its
    arguments (its own and the shared ones), not as a silently ignored key."""
    import importlib

    train = importlib.import_module(f"decodekit.train.{recipe}").train
    models = {"target": "no-such-model", "draft": "no-such-model"} if recipe == "threshold_head" else {}
    models = models or {"base": "no-such-model"}
    match = f"the {recipe} recipe has no argument epoch; its arguments: .*batch_size.*{known}.*warmup"
    with pytest.raises(ConfigError, match=match):
        train(tmp_path / "run", **models, epoch=2)
    assert not (tmp_path / "run").exists()


def test_the_train_command_refuses_a_negative_medusa_decay_first(tmp_path, capsys):
    from decodekit.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "recipe=medusa", "decay=-1", "base=no-such-model", f"hydra.run.dir={tmp_path}"])
    assert exit_.value.code == 2
    assert "decay must be a finite number in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_a_local_base_directory_names_the_head_file():
    from decodekit.train.arguments import file_stem

    assert file_stem("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert file_stem("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB--SmolLM2-135M-Instruct"
    assert file_stem("/no/such/dir/my model/") == "no--such--dir--my-model"


SEQS = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 9, 1], [9, 8, 7, 6, 2], [1, 2, 3], [4, 7, 7, 5, 6], [8, 1, 8, 1, 8]]
DATA = {"chat_prompts": 1, "code_prompts": 5, "text_chunks": 0, "max_prompt_tokens": 4, "max_new_tokens": 4,
        "seq_len": 6, "gen_batch_size": 3}  # fmt: skip


def sequences_in(data_dir):
    """A data directory holding self-distilled sequences already (no tokenizer needed to build features on them)."""
    import json

    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "sequences.json").write_text(json.dumps(SEQS))
    (data_dir / "starts.json").write_text(json.dumps([2, 1, 2, 1, 1, 2]))
    return data_dir


def test_a_local_base_directory_trains_a_head_named_after_it(tmp_path):
    from decodekit.drafters.medusa import load_heads
    from decodekit.train.medusa import train

    base = tmp_path / "my model"
    tiny_llama(7, layers=2).save_pretrained(base)
    data = sequences_in(tmp_path / "data")
    with pytest.warns(UserWarning, match="no tokenizer"):
        train(tmp_path / "run", base=str(base), data_dir=str(data), **DATA, train_vocab=16, vocab_sizes=[16],
              val_fraction=0.34, epochs=1, batch_size=2, num_heads=1, progress=False, device="cpu")  # fmt: skip
    written = tmp_path / "run" / "medusa_my-model.safetensors"  # the old code: a path inside the file name
    assert written.is_file()
    heads = load_heads(written, dk.load_model(tiny_llama(7, layers=2)))
    assert len(heads.blocks) == 1


def test_a_loaded_base_model_trains_a_head_named_after_its_class(tmp_path):
    """``base`` may be a model loaded in Python (the recipes' argument check says so): the run names it by its class
    (the old code failed at the end, on a recipe record without ``base``)."""
    from decodekit.drafters.medusa import load_heads
    from decodekit.train.medusa import train

    lm = dk.load_model(tiny_llama(7, layers=2))
    data = sequences_in(tmp_path / "data")
    summary = train(tmp_path / "run", base=lm, data_dir=str(data), **DATA, train_vocab=16, vocab_sizes=[16],
                    val_fraction=0.34, epochs=1, batch_size=2, num_heads=1, progress=False, device="cpu")  # fmt: skip
    assert summary["base"] == "LlamaForCausalLM"
    assert len(load_heads(tmp_path / "run" / "medusa_LlamaForCausalLM.safetensors", lm).blocks) == 1


def test_data_made_with_another_model_is_refused(tmp_path):
    from decodekit.train.feature_data import prepare
    from decodekit.train.sequences import MODELS_FILE

    def run(lm, base):
        return prepare(lm, {**DATA, "base": base}, tmp_path, train_vocab=16, val_fraction=0.34, seed=0, progress=False)

    first = dk.load_model(tiny_llama(0))
    sequences_in(tmp_path)
    assert run(first, "first").feats.shape[-1] == 64 and (tmp_path / MODELS_FILE).is_file()
    assert run(first, "first again").feats.shape[-1] == 64  # the same weights under another name: reused
    same_shape = dk.load_model(tiny_llama(1))  # the old code trained on the first model's features silently
    with pytest.raises(ConfigError, match=r"made with 'first' \(hidden size 64, vocabulary 128\) as its base.*"):
        run(same_shape, "second")
    narrow = dk.load_model(tiny_llama(0, hidden=32))
    with pytest.raises(ConfigError, match=r"this run's base is 'narrow' \(hidden size 32"):
        run(narrow, "narrow")
    (tmp_path / MODELS_FILE).unlink()  # a cache from before the data recorded its model: its shapes are checked
    with pytest.raises(ConfigError, match=r"have size 64, and this model's hidden size is 32"):
        run(narrow, "narrow")
    (tmp_path / "features.pt").unlink()
    with pytest.raises(ConfigError, match=r"sequences .* hold token id 11, beyond this model's vocabulary of 8"):
        run(dk.load_model(tiny_llama(0, vocab=8)), "tiny vocabulary")
