"""Cache strategies for :func:`decodekit.dlm.generate` (one file each, registered as ``dlm_cache``): what each step
recomputes, and what it reads from K/V kept from an earlier forward."""

from decodekit.dlm.caches.base import Recompute
from decodekit.dlm.caches.block_causal import BlockCausalCache
from decodekit.dlm.caches.dkv import DKVCache
from decodekit.dlm.caches.dkv_greedy import DKVGreedyCache
from decodekit.dlm.caches.dual import DualCache
from decodekit.dlm.caches.prefix import PrefixCache

__all__ = ["BlockCausalCache", "DKVCache", "DKVGreedyCache", "DualCache", "PrefixCache", "Recompute"]
