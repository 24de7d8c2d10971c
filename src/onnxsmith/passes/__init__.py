"""IR passes: small, single-purpose rewrites of an onnx-ir model, composed by the transforms.

Each pass is an ``onnx_ir.passes.InPlacePass`` in its own module, with a test
that runs the model in onnxruntime before and after it on the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir


@dataclass
class Rewritten(ir.passes.PassResult):
    """What a pass that rewrites places one by one did: how many places it rewrote."""

    rewritten: int = 0
