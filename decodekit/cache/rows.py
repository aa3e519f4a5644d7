"""The committed side of a :class:`~decodekit.cache.KVCache`: each row's committed length with its host mirror, and
what changes only the committed slots or the set of rows (:meth:`~CommittedRows.crop`,
:meth:`~CommittedRows.select_rows`, which compacts the buffers in place where it can), the explicit per-slot validity
(:meth:`~CommittedRows.invalidate`, :meth:`~CommittedRows.mark_valid`, :meth:`~CommittedRows.key_mask`) and
:meth:`~CommittedRows.snapshot` / :meth:`~CommittedRows.restore`. A mixin of ``KVCache``
(:mod:`decodekit.cache.kv`), which owns the attributes below and makes the forwards' views."""

from __future__ import annotations

import torch

from decodekit.cache.validity import SlotValidity

__all__ = ["CommittedRows"]


class CommittedRows:
    """Committed lengths, their host mirror, row selection, slot validity and snapshots of a KV cache (module
    docstring); :class:`~decodekit.cache.KVCache` sets the attributes in its ``__init__``."""

    capacity: int  # these as KVCache.__init__ describes them
    _lengths: torch.Tensor
    _host: list[int] | None
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    validity: SlotValidity
    _extent: list[int]
    version: int

    def _clear(self) -> None:
        """Forget the staged extents; views made before no longer run (:class:`~decodekit.cache.KVCache` does)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------- properties
    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` committed length per row (long, on the cache's device)."""
        return self._lengths

    @lengths.setter
    def lengths(self, value: torch.Tensor) -> None:
        self._lengths, self._host = value, None
        self.version += 1  # views made before read the old lengths

    @property
    def batch_size(self) -> int:
        return self._lengths.shape[0]

    # ------------------------------------------------------------------------------------------- host mirror
    def _read_lengths(self) -> list[int]:
        """The one place the cache reads lengths to the host (a device sync on GPU)."""
        self._host = self._lengths.tolist()
        return self._host

    def host_lengths(self) -> list[int]:
        """Committed lengths as Python ints: the host mirror, read from the device (one sync) when unknown."""
        return list(self._host if self._host is not None else self._read_lengths())

    def set_host_lengths(self, lengths: list[int]) -> None:
        """Hand over lengths the caller just read (must equal :attr:`lengths`); spares the next sync."""
        if len(lengths) != self.batch_size:
            raise ValueError(f"set_host_lengths: got {len(lengths)} lengths for {self.batch_size} rows")
        self._host = [int(n) for n in lengths]

    def check_host_mirror(self) -> None:
        """Debug check (syncs): raise ``AssertionError`` if the host mirror differs from :attr:`lengths`."""
        if self._host is not None and self._host != self._lengths.tolist():
            raise AssertionError(f"KVCache host mirror {self._host} != lengths {self._lengths.tolist()}")

    def _min_max(self) -> tuple[int, int]:
        host = self._host if self._host is not None else self._read_lengths()
        return (min(host), max(host)) if host else (0, 0)

    # -------------------------------------------------------------------------------------------------- rows
    def crop(self, lengths: torch.Tensor, *, host_lengths: list[int] | None = None) -> None:
        """Truncate row ``b`` to ``min(L_b, lengths[b])`` committed tokens (``lengths [B]``).

        ``host_lengths``: the same on the host, which keeps the host mirror valid.
        """
        new = torch.minimum(self._lengths, lengths.to(self._lengths.device))
        self.validity.cropped(self._lengths, new)
        host = None
        if self._host is not None and host_lengths is not None:
            host = [min(n, int(c)) for n, c in zip(self._host, host_lengths)]
        self._lengths, self._host = new, host
        self._clear()

    def select_rows(self, rows: torch.Tensor, *, host_rows: list[int] | None = None) -> None:
        """Keep only ``rows [B']`` (indices into the current batch), in that order.

        ``host_rows``: the same indices on the host, which keeps the host mirror valid and, when every row that
        changes place comes from past the first ``B'`` (the engine's order, :func:`decodekit.spec.outputs.fill_holes`),
        lets the buffers move only those rows in place and keep a view of the first ``B'``, instead of copying
        every kept row of every layer (the buffers hold the whole context: at batch 8 a finishing row otherwise
        costs a copy of the full cache, tens of milliseconds on a CPU).
        """
        self._host = [self._host[r] for r in host_rows] if self._host is not None and host_rows is not None else None
        self._lengths = self._lengths[rows.to(self._lengths.device)]
        if host_rows is not None and all(r == i or r >= len(host_rows) for i, r in enumerate(host_rows)):
            self.keys, self.values = _keep_prefix(self.keys, host_rows), _keep_prefix(self.values, host_rows)
        else:
            self.keys = [k[rows.to(k.device)] for k in self.keys]
            self.values = [v[rows.to(v.device)] for v in self.values]
        self.validity.select_rows(rows)
        self._clear()

    # --------------------------------------------------------------------------------------------- validity
    def invalidate(self, slots: torch.Tensor) -> None:
        """Mark ``slots [B, M]`` (``-1`` = padding) invalid: masks built on :meth:`key_mask` stop attending them."""
        self.validity.set(self._lengths, self.capacity, slots, False)

    def mark_valid(self, slots: torch.Tensor) -> None:
        """Mark ``slots [B, M]`` (``-1`` = padding, all ``< capacity``) as holding usable K/V, committed or not."""
        self.validity.set(self._lengths, self.capacity, slots, True)

    def key_mask(self, kv_len: int) -> torch.Tensor:
        """``[B, kv_len]`` bool, True where a slot holds valid K/V (``slot < L_b`` unless validity is explicit)."""
        return self.validity.key_mask(self._lengths, kv_len)

    def reset_validity(self) -> None:
        """Forget explicit validity: back to the implicit ``slot < L_b`` (free again for plain decoding)."""
        self.validity.mask = None

    # ------------------------------------------------------------------------------------------- snapshots
    def snapshot(self) -> dict[str, object]:
        """A copy of the whole state (for exploring alternatives and rolling back with :meth:`restore`)."""
        return {
            "lengths": self._lengths.clone(),
            "host": None if self._host is None else list(self._host),
            "keys": [k.clone() for k in self.keys],
            "values": [v.clone() for v in self.values],
            "capacity": self.capacity,
            "validity": self.validity.copy(),
            "extent": list(self._extent),
        }

    def restore(self, snapshot: dict[str, object]) -> None:
        """Return to a state taken by :meth:`snapshot`."""
        self._lengths = snapshot["lengths"].clone()  # type: ignore[union-attr]
        self._host = None if snapshot["host"] is None else list(snapshot["host"])  # type: ignore[arg-type]
        self.keys = [k.clone() for k in snapshot["keys"]]  # type: ignore[union-attr]
        self.values = [v.clone() for v in snapshot["values"]]  # type: ignore[union-attr]
        self.capacity = snapshot["capacity"]  # type: ignore[assignment]
        valid = snapshot["validity"]
        self.validity.mask = None if valid is None else valid.clone()  # type: ignore[union-attr]
        self._clear()
        self._extent = list(snapshot["extent"])  # type: ignore[arg-type]


def _keep_prefix(buffers: list[torch.Tensor], host_rows: list[int]) -> list[torch.Tensor]:
    """Each buffer ``[B, ...]`` with row ``i`` overwritten in place by row ``host_rows[i]`` where they differ (those
    sources all lie past the kept prefix), then a view of the first ``len(host_rows)`` rows: the rows that stay are
    not copied."""
    moved = [i for i, r in enumerate(host_rows) if r != i]
    if buffers and moved:
        device = buffers[0].device
        dst = torch.tensor(moved, device=device)
        src = torch.tensor([host_rows[i] for i in moved], device=device)
        for buf in buffers:
            buf.index_copy_(0, dst, buf.index_select(0, src))
    return [buf[: len(host_rows)] for buf in buffers]
