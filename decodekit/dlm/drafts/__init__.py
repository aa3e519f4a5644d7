"""Self-speculative drafts for :func:`decodekit.dlm.generate` (one file each, registered as ``dlm_draft``): guesses
of the canvases the next steps will reach, verified in the next forward so that one forward may take several
steps of the sampler, with its output unchanged."""

from decodekit.dlm.drafts.calibrate import Calibration, calibrate_graph, canvas_cost
from decodekit.dlm.drafts.spiffy import SpiffyDrafts

__all__ = ["Calibration", "SpiffyDrafts", "calibrate_graph", "canvas_cost"]
