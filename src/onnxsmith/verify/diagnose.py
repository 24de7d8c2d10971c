"""Finding where a variant went wrong: the first tensor that became NaN/inf."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from onnxsmith.probes.ranges import measure_ranges


@dataclass
class Culprit:
    tensor: str
    node: str
    op_type: str


def first_nonfinite(model_path: str | os.PathLike, feeds: dict[str, np.ndarray]) -> Culprit | None:
    """The first tensor, in graph order, holding NaN/inf (storage-faithful for fp16 models)."""
    for r in sorted(measure_ranges(model_path, [feeds]), key=lambda r: r.order):
        if r.nonfinite:
            return Culprit(r.name, r.node or "graph input", r.op_type)
    return None
