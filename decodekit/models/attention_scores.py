"""Where a transformers model's attention went, and attention restricted to chosen cache slots per layer and head:
the two things a drafter that picks its context from the target's own attention needs (PillarAttn,
:class:`~decodekit.drafters.PillarDrafter`).

Shapes: ``B`` rows, ``Hq`` query heads, ``Hkv`` key/value heads (``Hq = g * Hkv``: query head ``h`` reads key/value
head ``h // g``, as transformers' ``repeat_kv`` pairs them), ``Q`` queries, ``S`` cache slots, ``L`` layers.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch

from decodekit.errors import ConfigError
from decodekit.models.call_scope import call_scope, current_call

# record_attention's sink, for this thread's next forward of that adapter: (adapter, sink)
_PENDING_SINK: ContextVar[tuple[weakref.ref, dict[int, torch.Tensor]] | None] = ContextVar(
    "decodekit_attention_sink", default=None
)


class RecordsAttention:
    """An adapter's :meth:`record_attention` (:class:`~decodekit.models.hf.HFCausalLM`'s): the sink is handed to
    this thread's next forward of that adapter, which takes it with :meth:`_take_sink`. The adapter sets
    ``_additive_mask`` (eager attention, which cannot be recorded)."""

    _additive_mask: bool

    def record_attention(self, sink: dict[int, torch.Tensor]) -> None:
        """The next ``forward`` (only that one) also stores, per layer index, where its queries attended:
        ``sink[i] [B, Hkv, S]``, probabilities summed over the queries and each key/value head's query heads
        (:func:`attention_mass`). Needs :attr:`records_attention`."""
        if not self.records_attention:
            raise ConfigError(f"{self!r} runs eager attention; recording attention needs attn_implementation='sdpa'")
        _PENDING_SINK.set((weakref.ref(self), sink))  # this thread's: another thread's forward does not take it

    def _take_sink(self) -> dict[int, torch.Tensor] | None:
        """The sink :meth:`record_attention` left for this thread's next forward of this adapter (taken once)."""
        pending = _PENDING_SINK.get()
        if pending is None or pending[0]() is not self:
            return None
        _PENDING_SINK.set(None)
        return pending[1]

    @property
    def records_attention(self) -> bool:
        """Whether :meth:`record_attention` works: the model runs ``sdpa`` attention."""
        return not self._additive_mask


def attention_mass(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float | None
) -> torch.Tensor:
    """``[B, Hkv, S]`` float32: attention probabilities summed over the queries ``query [B, Hq, Q, D]`` and over
    each key/value head's group of query heads, against ``key [B, Hkv, S, D]`` under ``mask`` (``[B, 1 | Hq, Q,
    S]``, boolean: True attends, or additive). A query that may attend nowhere adds nothing."""
    b, hq, q, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    scale = d**-0.5 if scaling is None else scaling
    grouped = query.float().reshape(b, hkv, (hq // hkv) * q, d)
    scores = grouped @ key.float().transpose(-1, -2) * scale  # [B, Hkv, gQ, S]
    if mask is not None:
        mask = mask[..., :s].expand(b, hq, q, s).reshape(b, hkv, (hq // hkv) * q, s)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    return scores.softmax(-1).nan_to_num(0.0).sum(2)


_SDPA_LOCK = threading.Lock()
_SDPA_USERS = 0  # forwards inside wrapped_sdpa now, over all threads
_SDPA_ORIGINAL: Callable[..., Any] | None = None  # transformers' entry when the dispatcher went in


def _dispatch(*args: Any, **kwargs: Any) -> Any:
    """The process-wide ``sdpa`` entry while some forward wraps it: the running call's function, else the original."""
    call = current_call()
    fn = call.sdpa if call is not None else None
    return (fn if fn is not None else _SDPA_ORIGINAL)(*args, **kwargs)  # type: ignore[misc]


@contextlib.contextmanager
def _dispatching() -> Iterator[Callable[..., Any]]:
    """Keep :func:`_dispatch` in transformers' ``sdpa`` entry during the block (counted over threads: the last
    one out puts the original back); yields the original."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    global _SDPA_USERS, _SDPA_ORIGINAL
    with _SDPA_LOCK:
        if ALL_ATTENTION_FUNCTIONS["sdpa"] is not _dispatch:  # first in, or someone replaced the entry since
            _SDPA_ORIGINAL = ALL_ATTENTION_FUNCTIONS["sdpa"]
            ALL_ATTENTION_FUNCTIONS["sdpa"] = _dispatch
        _SDPA_USERS += 1
        original = _SDPA_ORIGINAL
    try:
        yield original  # type: ignore[misc]
    finally:
        with _SDPA_LOCK:
            _SDPA_USERS -= 1
            if _SDPA_USERS == 0 and ALL_ATTENTION_FUNCTIONS["sdpa"] is _dispatch:
                ALL_ATTENTION_FUNCTIONS["sdpa"] = _SDPA_ORIGINAL


@contextlib.contextmanager
def wrapped_sdpa(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """During the block, transformers' ``sdpa`` attention calls made by the running forward (the current
    :func:`~decodekit.models.call_scope.call_scope`) go to ``wrap(the function they went to before)``. Another
    thread's forward, or a forward started inside this one, is not wrapped: transformers' process-wide entry is a
    dispatcher to each call's own function while any forward wraps it, and its original once none does."""
    call = current_call()
    with contextlib.nullcontext(call) if call is not None else call_scope() as scope, _dispatching() as original:
        previous = scope.sdpa
        scope.sdpa = wrap(previous if previous is not None else original)
        try:
            yield
        finally:
            scope.sdpa = previous


def recorded_attention(sink: dict[int, torch.Tensor]) -> contextlib.AbstractContextManager[None]:
    """During the block, every transformers SDPA attention call of the running forward also stores
    :func:`attention_mass` of its queries in ``sink[layer index]`` (one extra ``Q x S`` product per head; the
    attention output is unchanged). Models that do not run ``sdpa`` record nothing. Other forwards in the meantime
    (another thread's, or one started inside this one) record nothing (:func:`wrapped_sdpa`)."""

    def scoring(original: Callable[..., Any]) -> Callable[..., Any]:
        def scored(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, *a, **kw):
            sink[module.layer_idx] = attention_mass(query, key, mask, kw.get("scaling"))
            return original(module, query, key, value, mask, *a, **kw)

        return scored

    return wrapped_sdpa(scoring)


def restricted_masks(mask: torch.Tensor, attend: torch.Tensor, query_heads: int) -> list[torch.Tensor]:
    """One boolean mask ``[B, Hq, Q, S]`` per layer: ``mask [B, 1, Q, S]`` and, per layer and key/value head, only
    the slots ``attend [L, B, Hkv, S0]`` allows (slots ``>= S0``: all, the tokens written since the choice)."""
    s = mask.shape[-1]
    width = min(attend.shape[-1], s)
    allowed = torch.ones(*attend.shape[:3], s, dtype=torch.bool, device=mask.device)
    allowed[..., :width] = attend[..., :width]
    per_head = allowed.repeat_interleave(query_heads // attend.shape[2], dim=2)  # [L, B, Hq, S]
    return [mask & layer[:, :, None, :] for layer in per_head]
