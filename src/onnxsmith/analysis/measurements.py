"""Measurements as data: what probes/ measure by running a model and analysis/ decides from.

A :class:`TensorRange` is one float tensor's range over the calibration inputs
(:func:`onnxsmith.probes.ranges.measure_ranges` makes them); the precision policy,
the fp16 conversion and the release report read them without running anything.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TensorRange:
    name: str
    node: str  # the node that produces it ("" for a graph input)
    op_type: str
    order: int  # position of the producer in the graph's topological order
    absmax: float  # over all input sets; NaN/inf excluded
    nonfinite: int  # NaN/inf values seen
    tiny_fraction: float  # share of nonzero values below fp16's smallest normal
    dtype: str
    elements: int = 0  # largest element count seen (how big the tensor is at the calibration shapes)
