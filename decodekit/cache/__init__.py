"""KVCache: the one key/value store of decodekit (target, draft models, and DLM samplers).

**Slot model.** Per layer the cache owns key and value buffers ``[B, H, S_cap, D]`` and one committed length
``L_b`` per row, so rows are ragged without padding. Row ``b``'s committed tokens sit in slots ``0 .. L_b - 1`` and
slot index == position: the token at position ``p`` has its K/V in slot ``p``. Positions are always explicit and
decodekit always passes its own boolean 4-D mask ``[B, 1, N, S]`` over slots ``0 .. S - 1``
(see :mod:`decodekit.masks`), so the model never asks the cache for lengths.

**A forward** runs against a :class:`~decodekit.cache.view.CacheView` that one call of the cache returns and the
caller passes to the model (the cache keeps no plan for its next forward; transformers models write through the
view's ``Cache.update``, and ``view.slots()`` gives the written slots as a ``[B, N]`` tensor, gpt-fast's
``input_pos``):

- :meth:`KVCache.stage` ``(N, offset=0)``: the ``N`` new tokens are written to slots ``L_b + offset + j`` (their
  positions); nothing is committed until :meth:`KVCache.keep` says which staged tokens to keep (a gather that
  compacts an accepted tree path into contiguous slots). :meth:`KVCache.staged_extent` tells how far staged data
  reaches in each layer (early-exit drafters fill only their layers).
- :meth:`KVCache.write_at` ``(slots)``: the new tokens overwrite the given slots (refresh committed K/V, or write a
  cached block past ``L_b``); lengths do not change.
- :meth:`KVCache.attend` ``(N)``: the new tokens attend the cache but their K/V are not stored; they appear at key
  index ``S_c + j`` after the cached slots ``0 .. S_c - 1``.

**Validity.** A slot may be attended when it is valid: implicitly ``slot < L_b`` (free), or explicitly per slot once
:meth:`KVCache.invalidate`, :meth:`KVCache.mark_valid` or :meth:`KVCache.write_at` is used (a cached suffix with
uncached slots before it). :meth:`KVCache.key_mask` gives ``[B, S]`` for the mask builders.

**Host mirror.** ``stage`` needs ``min/max(L)`` as Python ints. The cache keeps a host copy of the lengths, kept valid
when callers pass what they know on the host (``keep(..., host_counts=)``, ``crop(..., host_lengths=)``,
``select_rows(..., host_rows=)``, :meth:`KVCache.set_host_lengths`); otherwise it reads the lengths once (one device
sync) at the next ``stage``.

Buffers are allocated lazily at a view's first ``update`` (shapes, dtype and device come from the model) and grow when a
forward needs more slots than allocated; each has one extra scratch slot past ``S_cap`` for padding writes.
"""

from decodekit.cache.kv import KVCache
from decodekit.cache.view import CacheView

__all__ = ["CacheView", "KVCache"]
