"""``shrink``'s settings (the engine: :mod:`onnxsmith.shrink_engine`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from onnxsmith.core.options import option
from onnxsmith.settings import TransformSettings

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "gib": 2**30,
}


def parse_bytes(text: str) -> int:
    """``1MB`` -> 1048576 (binary units, as ``inspect`` prints sizes); a plain number is bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"'{text}' is not a size (examples: 0, 4096, 512KB, 1MB, 2GB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass
class ShrinkOptions:
    max_fold_growth: str = option(
        "4KB",
        "a folded constant may add at most this much to the file, less the constants that die "
        "with it (e.g. 0, 64KB, 1MB); what would add more (a dequantised int8 weight, a copy of a "
        "shared weight, a broadcast table) stays computed at run time",
    )
    fold: bool = option(True, "fold constant subexpressions (with the growth guard)")
    narrow_int64: bool = option(True, "store/compute int64 indices that fit as int32")
    narrow_fp64: bool = option(True, "store fp64 constants read as fp32 as fp32")
    dedup: bool = option(True, "store identical constants once")

    def validate(self) -> None:
        parse_bytes(self.max_fold_growth)


SHRINK = TransformSettings(
    "shrink",
    "fold small constants (never huge ones), int64 indices to int32, fp64 constants to fp32, dedup constants",
    ShrinkOptions,
)
