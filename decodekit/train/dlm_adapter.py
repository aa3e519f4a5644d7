"""Adapt SmolLM2 into a masked diffusion LM with a LoRA adapter (``python -m decodekit train recipe=dlm_adapter``,
docs/training.md): the zoo's ``smollm2-135m-dlm`` (:func:`decodekit.dlm.load_model`).

AR initialisation with shifted logits (Dream, Fast-dLLM v2): the causal model's output at position ``j - 1``
predicts slot ``j``, now under bidirectional attention over a partly masked sequence. The loss is the masked
diffusion ELBO (LLaDA's ``GUIDELINES.md``): per sequence ``t ~ U(0, 1)``, ``p = (1 - eps) t + eps``, each token but
the first masked with probability ``p``, cross-entropy on the masked tokens weighted by ``1 / p``, summed and divided
by the number of tokens. Only the adapter trains (peft LoRA on every attention and MLP projection); the mask token is
a special token SmolLM2 never emits in chat (``<empty_output>``, id 16).

Data: source files of the Python standard library's own test suite (``Lib/test``) and the ``pydoc_data`` topics,
tokenized, cut into ``seq_len`` chunks; neither is a benchmark prompt source (the ``stdlib`` task mines ``Lib``
outside ``test`` and ``pydoc_data``; HumanEval and MT-Bench are not read). A few files are held out for validation.

With ``data="self"`` (``recipe=bdlm_adapter``, the zoo's ``smollm2-135m-bdlm``) the rows are self-distilled instead
(:mod:`decodekit.train.dlm_data`: SmolLM2's own responses after their prompts, and text windows), the loss denoises
each row's region after a clean context, and ``block_length`` makes it block-causal (BD3-LM's vectorised loss,
:func:`~decodekit.train.dlm_losses.region_diffusion_loss`).

Writes to ``out_dir``: ``checkpoints/step_*`` (accelerate state; ``resume=true`` continues; the text windows of
``data="self"`` are drawn afresh, so a resumed run is not bit-identical to an uninterrupted one), ``history.json``,
``summary.json``, ``loss.png`` and ``<name>.safetensors`` (the adapter, with its recipe and numbers in the safetensors
metadata); copy that file to ``decodekit/weights/`` to ship it.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_int
from decodekit.dlm.zoo import with_lora
from decodekit.errors import ConfigError
from decodekit.train.common import BUDGET_PROBE, Checkpoints, budgeted_steps, plot_losses, take_step, warmup_cosine
from decodekit.train.corpus import corpus_texts, token_chunks
from decodekit.train.dlm_data import region_rows
from decodekit.train.dlm_losses import Regions, draft_alignment_loss, masked_diffusion_loss, region_diffusion_loss
from decodekit.train.recipe import RunConfig, shares
from decodekit.train.sequences import DATA_SOURCE as SELF_SOURCE
from decodekit.train.sequences import SEQUENCES

DATA_SOURCE = "Python standard library test-suite source (Lib/test/**/*.py) and pydoc_data topics"
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def passes(accelerator: Any, loader: Any, step: int) -> Any:
    """The loader's batches pass after pass, from batch ``step`` on (a resumed run skips the ones it took)."""
    skip = step % len(loader)
    while True:
        yield from accelerator.skip_first_batches(loader, skip) if skip else loader
        skip = 0


@shares(RunConfig)
def train(
    out_dir: str | Path,
    *,
    base: str = "smollm2-135m-instruct",
    name: str = "smollm2-135m-dlm",
    mask_token_id: int = 16,
    data: Literal["corpus", "self"] = "corpus",
    seq_len: int = 128,
    train_chunks: int = 8192,
    val_chunks: int = 32,
    sequences: dict[str, int] | None = None,
    gen_len: int = 128,
    context: int = 192,
    objective: Literal["diffusion", "draft"] = "diffusion",
    draft_length: int = 32,
    draft_decay: float = 1.0,
    block_length: int | None = None,
    rank: int = 16,
    alpha: float = 32.0,
    max_steps: int | None = None,
    eval_every: int = 200,
    time_budget_s: float | None = None,
    mixed_precision: Literal["no", "bf16", "fp16"] = "no",
    **shared: Any,
) -> dict[str, Any]:
    """Train the adapter; returns the summary numbers (also in ``summary.json``).

    Args:
        out_dir: where everything is written.
        base: the zoo model to adapt.
        name: the adapter file's stem (``<name>.safetensors``) and the zoo name it is for.
        mask_token_id: the token used as the mask (must be one the model does not otherwise need).
        data: ``"corpus"``: plain ``seq_len`` chunks of the corpus, every token but the first a slot
            (:func:`~decodekit.train.dlm_losses.masked_diffusion_loss`); ``"self"``: the self-distilled rows of
            :mod:`decodekit.train.dlm_data`, a clean context of at most ``context`` tokens and a region of at most
            ``gen_len`` slots (:func:`~decodekit.train.dlm_losses.region_diffusion_loss`); ``val_fraction`` of them
            held out; ``data_dir`` where their sequences are cached (shared with the EAGLE recipe), ``sequences``
            how they are built (over :data:`~decodekit.train.sequences.SEQUENCES`).
        seq_len, train_chunks, val_chunks: chunk length and how many training / validation chunks to cut.
        sequences, gen_len, context: ``data="self"``'s rows, above.
        objective: ``"diffusion"``: the masked-diffusion loss above; ``"draft"`` (``data="self"`` only): align the
            DLM to draft for its target (:func:`~decodekit.train.dlm_losses.draft_alignment_loss`, DEER's alignment
            reconstructed): a cut inside each response, the next ``draft_length`` slots all masked and predicted in
            one forward, slot ``j`` weighted by ``draft_decay ** j``; for ``dk.build("drafter", "diffusion")``.
        draft_length, draft_decay: ``objective="draft"``'s, above.
        block_length: None = bidirectional attention; a block length = block-causal training (``data="self"``
            only), for the block-causal sampler at the same block length.
        rank, alpha: LoRA rank and scale.
        max_steps: stop after this many steps (None: one pass over the chunks).
        eval_every: steps between validation losses.
        time_budget_s: train for about this many seconds (the loop and its validations, not the loading): after a
            few steps the measured step time fixes the step count (at most ``max_steps``, or one pass), and the
            learning-rate schedule anneals over it. None: ``max_steps``.
        mixed_precision: accelerate's ``"no"`` | ``"bf16"`` | ``"fp16"`` (autocast around the loss; bf16 halves a
            step on CPUs with AVX512-BF16 or AMX).
        shared: :class:`~decodekit.train.recipe.RunConfig`'s knobs (optimisation, the split, ``data_dir``,
            threads, seed; ``batch_size``: rows a step), here by default ``val_fraction=0.03`` and
            ``data_dir="results/train/eagle/data"`` (the EAGLE recipe's sequences, for ``data="self"``).
    """
    # every override, before the model or the data
    cfg = RunConfig.of("dlm_adapter", locals(), val_fraction=0.03, data_dir="results/train/eagle/data")
    from accelerate import Accelerator
    from peft import get_peft_model_state_dict

    import decodekit as dk

    if block_length is not None and data != "self":
        raise ConfigError(
            "block_length (block-causal training) needs data=self: its loss denoises a region after a clean context"
        )
    if objective == "draft" and data != "self":
        raise ConfigError("objective=draft needs data=self: it drafts continuations of the target's own responses")
    recipe = cfg.start()
    batch_size, seed = cfg.batch_size, cfg.seed
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator(mixed_precision=mixed_precision)
    lm = dk.load_model(base, device=accelerator.device)  # on a GPU, the self-distilled responses are written there
    tokenizer, hf = lm.tokenizer, lm.hf
    check_int("mask_token_id", mask_token_id, low=0, high=lm.vocab_size - 1)
    if data == "corpus":
        texts = corpus_texts(seed)
        held = max(1, len(texts) // 50)  # whole files held out for validation
        val = token_chunks(tokenizer, texts[:held], seq_len, val_chunks, lm.eos_token_ids[0])
        rows = token_chunks(tokenizer, texts[held:], seq_len, train_chunks, lm.eos_token_ids[0])
        val_batches = list(val.split(batch_size))

        def loss_of(batch: torch.Tensor, noise: torch.Generator) -> torch.Tensor:
            return masked_diffusion_loss(model, batch.to(accelerator.device), mask_token_id, noise)

    else:
        source = region_rows(lm, {**SEQUENCES, **(sequences or {})}, cfg.data_path, seed, cfg.progress)
        order = torch.randperm(len(source), generator=torch.Generator().manual_seed(seed)).tolist()
        held = max(1, round(cfg.val_fraction * len(source)))
        rows = torch.tensor(order[held:])
        draw = random.Random(1234)  # the validation windows: fixed once
        val_batches = [
            source.batch(order[i : min(i + batch_size, held)], gen_len, context, draw)
            for i in range(0, held, batch_size)
        ]
        window = random.Random(seed)

        def loss_of(batch: Any, noise: torch.Generator) -> torch.Tensor:
            parts = batch if isinstance(batch, tuple) else source.batch(batch.tolist(), gen_len, context, window)
            regions = Regions(*parts).to(accelerator.device)
            if objective == "draft":
                return draft_alignment_loss(
                    model, regions, mask_token_id, noise, draft_length, draft_decay, block_length
                )
            return region_diffusion_loss(model, regions, mask_token_id, noise, block_length)

    if len(rows) < batch_size or not val_batches:
        raise ConfigError(f"too little data: {len(rows)} training rows and {len(val_batches)} validation batches")

    model = with_lora(hf.train(), rank, alpha, list(TARGET_MODULES))
    loader = torch.utils.data.DataLoader(
        rows, batch_size=batch_size, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(seed)
    )
    total = max_steps or len(loader)  # past one pass, the rows are reshuffled and used again
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = warmup_cosine(optimizer, total, cfg.warmup)
    shape = schedule.lr_lambdas[0]
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    checkpoints = Checkpoints(accelerator, out)
    step, history = checkpoints.start(cfg.resume) or (0, {"train": [], "val": []})
    shape.total = total  # a checkpoint restores its own; this run's max_steps decides
    noise = torch.Generator(accelerator.device).manual_seed(seed + step)

    eval_s = 0.0  # the last validation's time (a time budget counts it)

    def validate() -> float:
        nonlocal eval_s
        began = time.perf_counter()
        model.eval()
        fixed = torch.Generator(accelerator.device).manual_seed(1234)  # the same masks at every evaluation
        with torch.no_grad(), accelerator.autocast():
            losses = [float(loss_of(batch, fixed)) for batch in val_batches]
        model.train()
        eval_s = time.perf_counter() - began
        return sum(losses) / len(losses)

    start = time.perf_counter()
    if not history["val"]:
        history["val"].append([0, validate()])
    probe = (step + 2, step + 2 + BUDGET_PROBE)  # the steps timed for a time budget (the first ones warm up)
    bar = tqdm(total=total, initial=step, desc="training DLM adapter", unit="step", disable=not cfg.progress)
    for batch in passes(accelerator, loader, step):
        if step >= total:
            break
        if step == probe[0]:
            probe_began = time.perf_counter()
        with accelerator.autocast():
            loss = loss_of(batch, noise)
        step = take_step(accelerator, optimizer, schedule, loss, history, bar, step)
        if time_budget_s is not None and step == probe[1]:
            step_s = (time.perf_counter() - probe_began) / BUDGET_PROBE
            spent = time.perf_counter() - start
            total = shape.total = min(total, budgeted_steps(time_budget_s, spent, step, step_s, eval_s, eval_every))
            bar.total = total
            bar.refresh()
        if step % eval_every == 0 or step == total:
            history["val"].append([step, validate()])
        if step % cfg.save_every == 0:
            checkpoints.save(step, history)
    bar.close()
    checkpoints.save(step, history)
    recent = [loss for _, loss in history["train"][-50:]]
    # the slots a row scores at most: a chunk, a region, or (objective=draft) the slots drafted after a cut
    row_slots = seq_len if data == "corpus" else draft_length if objective == "draft" else gen_len
    summary = {
        "data_source": DATA_SOURCE if data == "corpus" else SELF_SOURCE,
        "train_tokens": step * batch_size * row_slots,
        "objective": objective,
        **({"draft_length": draft_length, "draft_decay": draft_decay} if objective == "draft" else {}),
        "val_tokens": sum(int(b.numel()) if data == "corpus" else int((b[1] - b[2]).sum()) for b in val_batches),
        "data": data,
        "block_length": block_length,
        "steps": step,
        "final_train_loss": sum(recent) / max(len(recent), 1),
        "initial_val_loss": history["val"][0][1],
        "final_val_loss": history["val"][-1][1],
        "training_time_s": round(time.perf_counter() - start, 1),
        "base": base,
        "mask_token_id": mask_token_id,
        "shift_logits": True,
        "lora_rank": rank,
        "lora_alpha": alpha,
        "mixed_precision": mixed_precision,
        "time_budget_s": time_budget_s,
    }
    if accelerator.is_main_process:
        (out / "history.json").write_text(json.dumps(history))
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        plot_losses(history, out / "loss.png", "SmolLM2 masked-diffusion adapter", "1/t-weighted masked CE")
        from safetensors.torch import save_file

        weights = {
            k: v.detach().to(torch.float16).contiguous()
            for k, v in get_peft_model_state_dict(accelerator.unwrap_model(model)).items()
        }
        meta = {"summary": json.dumps(summary), "recipe": json.dumps(recipe)}
        save_file(weights, str(out / f"{name}.safetensors"), metadata=meta)
    return summary
