"""EAGLE-3 (Li, Wei, Zhang, Zhang; arXiv 2503.01840): the EAGLE head on a fusion of the target's low, middle and
high layers' hidden states, trained by *training-time test*.

At a committed position ``t`` the head reads ``u_t = fuse([h^(a)_t ; h^(b)_t ; h^(c)_t])`` (``fuse [3H -> H]``, the
target's outputs of three layers, by default 2, ``L // 2`` and ``L - 3`` of ``L``) where EAGLE-1 reads the final
feature ``f_t``; at draft positions it reads its own output, as EAGLE-1 does. The verification forward keeps
those layers' outputs (``hidden_layers``, the head file says which), so drafting costs no extra target work.

Training (:mod:`decodekit.train.eagle3`) is EAGLE-3's: no feature regression, only the cross-entropy to the
target's distribution, and the head is unrolled over ``ttt_steps`` draft steps in training, each step fed the
previous step's outputs and attending to the true context plus its own earlier steps, exactly as it drafts.

Faithfulness: EAGLE-3's inputs (three fused layers), loss (token-level only) and training-time test; the draft
step's positions in training are the ones it drafts at (``t + j`` for step ``j``). Heads of the recipe's default
``architecture=eagle3`` are EAGLE-3's own module (:class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead`:
the attention input ``[norm(embed) ; norm(feature)]``, its own draft ``lm_head``), exportable to the authors' and
vLLM's layouts (:mod:`decodekit.train.export`). The head shipped for the zoo target is of the older ``fc``
architecture: EAGLE-1's input, ``fc([embed ; feature])`` into one decoder layer of the target's architecture, and
the target's output rows for the trimmed ids; its file is still read. Drafting, trees and losslessness are
:class:`~decodekit.drafters.eagle.EagleDrafter`'s: this class only points at the EAGLE-3 head shipped for the zoo
target. A head released by the EAGLE authors (``weights=`` its directory) runs in its own architecture
(:mod:`decodekit.drafters.eagle3_release`).
"""

from __future__ import annotations

from decodekit.drafters.eagle import EagleDrafter
from decodekit.registry import register

DEFAULT_WEIGHTS = "eagle3_smollm2-135m-instruct.safetensors"  # the zoo target's head (docs/training.md)


@register("drafter", "eagle3")
class Eagle3Drafter(EagleDrafter):
    """:class:`EagleDrafter` with the EAGLE-3 head shipped for the zoo's ``smollm2-135m-instruct`` by default
    (module docstring); ``weights=`` takes any head file :func:`decodekit.train.eagle3.train` wrote. Same arguments,
    shapes (chains, EAGLE-2 dynamic trees) and guarantees as :class:`EagleDrafter`."""

    default_file = DEFAULT_WEIGHTS
    retrain = "python -m decodekit train recipe=eagle3 (docs/training.md)"
