"""Training recipes run by ``python -m decodekit train recipe=<name>`` (``decodekit/recipes/train/<name>.yaml``
names the training function in ``_target_``); see docs/training.md."""
