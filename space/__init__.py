"""The design space of the FlashAttention forward kernel, as data. Imports nothing from autotune."""
from .arch import ARCHES, Arch, get_arch
from .config import (
    FAMILIES, Axis, Config, Family, Layout, Rule, Violation, default_config, default_config_for_shape, defines,
    enumerate_configs,
    get_family, is_valid, layout, valid_configs, violations,
)
from .problem import CAUSAL_ALIGNS, DECODE_MAX_QUERIES, DTYPES, HEAD_DIMS, Problem, Shape, canonical_align, causal_mask, causal_value
from .split_kv import judged_configs
from . import mma_sync, wgmma  # noqa: F401  (registers the families)

__all__ = [
    "ARCHES", "Arch", "get_arch", "FAMILIES", "Axis", "Config", "Family", "Layout", "Rule", "Violation",
    "default_config", "default_config_for_shape", "defines", "enumerate_configs", "get_family", "is_valid", "judged_configs",
    "layout", "valid_configs",
    "violations", "CAUSAL_ALIGNS", "DECODE_MAX_QUERIES", "DTYPES", "HEAD_DIMS", "Problem", "Shape",
    "canonical_align", "causal_mask", "causal_value",
]
