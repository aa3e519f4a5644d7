"""The queue of target features a feature-fed drafter (EAGLE, DFlash) has not fed yet.

Such a drafter reads the target's features of each committed position once. A round's verification forward gives
the features of the tokens it committed; when the loop asks for no draft that round, those join the features still
queued from before it (:func:`requeue`), so the next draft feeds them in order.
"""

from __future__ import annotations

import torch

__all__ = ["requeue"]


def requeue(queued: torch.Tensor, unseen: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The feature queue after a round without a draft: ``queued [B, Q, H]`` (row ``b``'s first ``unseen[b]`` still
    to be fed), then ``new [B, M, H]`` placed after each row's unseen ones -> ``[B, Q + M, H]``."""
    width = queued.shape[1] + new.shape[1]
    out = torch.cat([queued, new.new_zeros(new.shape[0], width - queued.shape[1], new.shape[2])], 1)
    at = (unseen[:, None] + torch.arange(new.shape[1], device=new.device))[..., None].expand_as(new)
    return out.scatter(1, at, new)
