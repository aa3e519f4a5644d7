"""Unmasking rules for :func:`decodekit.dlm.generate` (one file each, registered as ``dlm_rule``)."""

from decodekit.dlm.rules.dream import DreamRule
from decodekit.dlm.rules.eot_stop import EoTStop
from decodekit.dlm.rules.factor import FactorRule
from decodekit.dlm.rules.fast_dllm_v2 import FastDLLMv2Rule
from decodekit.dlm.rules.llada import LLaDARule
from decodekit.dlm.rules.local_leap import LocalLeapRule
from decodekit.dlm.rules.prophet import ProphetRule
from decodekit.dlm.rules.random_order import RandomOrderRule
from decodekit.dlm.rules.sdar import SDARRule
from decodekit.dlm.rules.threshold import ThresholdRule

__all__ = [
    "DreamRule",
    "EoTStop",
    "FactorRule",
    "FastDLLMv2Rule",
    "LLaDARule",
    "LocalLeapRule",
    "ProphetRule",
    "RandomOrderRule",
    "SDARRule",
    "ThresholdRule",
]
