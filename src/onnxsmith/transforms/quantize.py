"""``quantize``: a language model with 4-bit (or 8-bit) weights, small enough for a web page.

Gemm -> MatMul, the graph made cheaper than the source, the tied embedding/LM head stored once in int8,
every other MatMul weight in blocks of 4 (or 8) bits (blocked DequantizeLinear for onnxruntime-web, or
MatMulNBits for native CPU and WebGPU), the head as a GEMV, the last position's logits only. The engine is
:mod:`onnxsmith.quantize_engine` (quantize_engine/engine.py: the steps, and what each runtime does with the
variant; report.py: the report's words), this module its declaration. The variant is judged by the LM gate
(tasks/lm/gate.py: next-token KL and top-1 agreement), run as its target runs it.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.quantize_engine.engine import make_quantized
from onnxsmith.quantize_engine.report import WASM_CONFIG
from onnxsmith.settings.quantize import QUANTIZE, QuantizeOptions


@register
class Quantize(Transform, settings=QUANTIZE):
    gate_task = "lm"  # next-token KL and top-1 agreement (tasks/lm/gate.py), not output atol

    def apply(self, model: ir.Model, options: QuantizeOptions, context: TransformContext) -> StepReport:
        return make_quantized(model, options, context, self.name)

    def task_gate_settings(self, options: QuantizeOptions) -> dict:
        """The LM gate's bounds, and the variant run as its target runs it (session options)."""
        return {
            "max_kl": options.max_kl,
            "min_top1": options.min_top1,
            "min_generation": options.min_generation,
            "candidate_config": WASM_CONFIG if options.format == "qdq" else None,
        }
