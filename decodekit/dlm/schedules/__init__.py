"""Region schedules for :func:`decodekit.dlm.generate` (one file each, registered as ``dlm_schedule``): which slots
a step may commit, and when a round (a block) ends."""

from decodekit.dlm.schedules.adablock import AdaBlock
from decodekit.dlm.schedules.dcd import DeferredWindow
from decodekit.dlm.schedules.fixed import FixedBlocks

__all__ = ["AdaBlock", "DeferredWindow", "FixedBlocks"]
