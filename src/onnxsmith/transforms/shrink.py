"""``shrink``: make a graph smaller without changing what it computes.

fp64 constants read as fp32 stored as fp32, constant folding that never grows the file (``--max-fold-growth``),
int64 index regions that provably fit born int32, identical constants stored once. The engine is
:mod:`onnxsmith.shrink_engine` (shrink_engine/engine.py: the passes, their order and their bounds; report.py: the
report's words), this module its declaration. The gate demands integer outputs bit-identical and float outputs
within the one gate's fp32 bounds (verify/gate.py).
"""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.settings.shrink import SHRINK, ShrinkOptions
from onnxsmith.shrink_engine.engine import make_shrink

#: The options by their short name.
Options = ShrinkOptions


@register
class Shrink(Transform, settings=SHRINK):
    def apply(self, model: ir.Model, options: Options, context: TransformContext) -> StepReport:
        return make_shrink(model, options, context, self.name)
