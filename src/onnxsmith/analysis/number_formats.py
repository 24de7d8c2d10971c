"""The number formats a model stores and computes in, and the one two models are compared at.

A variant's outputs differ from its source's by about the rounding of the coarsest format
in which they differ: an fp16 variant of an fp32 model by fp16 rounding, an int8 variant
by a quantisation step, a fused fp32 graph by reordered fp32 arithmetic. The gate
(:mod:`onnxsmith.verify.gate`) scales its bounds with that format's unit roundoff
(:func:`compared_format`).

Float formats (the element types of weights, values and casts) and quantised formats
(ops that quantise weights or activations) are two separate axes: a model that quantises
its activations to int8 and gets an fp16 variant is compared at fp16, since both sides
quantise the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from onnxsmith.irutil.walk import all_nodes, constant_tensors


@dataclass(frozen=True, order=True)
class NumberFormat:
    """A number format by its precision: ``bits`` significant bits, unit roundoff 2^-bits.

    ``smallest_normal``: below it a float format holds values with less than ``bits`` bits
    (subnormals), so an error there is absolute, not relative (fp16: 2^-14).
    """

    bits: int
    name: str
    quantized: bool = False
    smallest_normal: float = 0.0

    @property
    def unit_roundoff(self) -> float:
        """Relative rounding error of one value: 2^-bits (for a quantised format, half a step of the range)."""
        return 2.0**-self.bits


FP64 = NumberFormat(53, "fp64", smallest_normal=2.0**-1022)
FP32 = NumberFormat(24, "fp32", smallest_normal=2.0**-126)
FP16 = NumberFormat(11, "fp16", smallest_normal=2.0**-14)
BF16 = NumberFormat(8, "bf16", smallest_normal=2.0**-126)
FP8 = NumberFormat(4, "fp8", smallest_normal=2.0**-6)
INT16 = NumberFormat(16, "int16", quantized=True)
INT8 = NumberFormat(8, "int8", quantized=True)
INT4 = NumberFormat(4, "int4", quantized=True)
#: Each format by its name.
FORMATS = {f.name: f for f in (FP64, FP32, FP16, BF16, FP8, INT16, INT8, INT4)}

_FLOATS = {
    ir.DataType.DOUBLE: FP64,
    ir.DataType.FLOAT: FP32,
    ir.DataType.FLOAT16: FP16,
    ir.DataType.BFLOAT16: BF16,
    ir.DataType.FLOAT8E4M3FN: FP8,
    ir.DataType.FLOAT8E4M3FNUZ: FP8,
    ir.DataType.FLOAT8E5M2: FP8,
    ir.DataType.FLOAT8E5M2FNUZ: FP8,
}
_QUANTIZED = {
    ir.DataType.INT16: INT16,
    ir.DataType.UINT16: INT16,
    ir.DataType.INT8: INT8,
    ir.DataType.UINT8: INT8,
    ir.DataType.INT4: INT4,
    ir.DataType.UINT4: INT4,
}
#: Ops that quantise a weight or an activation; their quantised type says how coarsely.
_QUANTIZING_OPS = {
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "DynamicQuantizeLSTM",
    "MatMulInteger",
    "ConvInteger",
    "MatMulIntegerToFloat",
    "QAttention",
    "QGemm",
    "QEmbedLayerNormalization",
}
#: Blocked weight-only quantisation: the width is the ``bits`` attribute (4 by default).
_BLOCK_QUANTIZED_OPS = {"MatMulNBits", "GatherBlockQuantized"}


def formats_of(model: ir.Model) -> frozenset[NumberFormat]:
    """Every float format the model holds or computes in, and every quantised format it rounds to."""
    found: set[NumberFormat] = set()
    for graph in model.graphs():
        for value in [*graph.inputs, *graph.outputs, *graph.initializers.values()]:
            found.add(_FLOATS.get(value.dtype))
    for const in constant_tensors(model):
        found.add(_FLOATS.get(const.tensor.dtype))
    for node in all_nodes(model):
        for value in node.outputs:
            found.add(_FLOATS.get(value.dtype))
        if node.op_type in ("Cast", "CastLike") and "to" in node.attributes:
            found.add(_FLOATS.get(ir.DataType(node.attributes.get_int("to"))))
        if node.op_type in _BLOCK_QUANTIZED_OPS:
            bits = node.attributes.get_int("bits", 4)
            found.add(INT4 if bits <= 4 else INT8)
        elif node.op_type in _QUANTIZING_OPS or node.op_type.startswith("QLinear"):
            kinds = [_QUANTIZED.get(v.dtype) for v in [*node.inputs, *node.outputs] if v is not None]
            found.add(min((k for k in kinds if k is not None), default=INT8))
    found.discard(None)
    return frozenset(found)


def compared_format(reference: frozenset[NumberFormat], candidate: frozenset[NumberFormat]) -> NumberFormat:
    """The format whose rounding the two models' outputs can differ by.

    Float formats: the coarsest one that only one side has, together with what replaced it
    on the other side (fp64 narrowed to fp32 differs by fp32 rounding); where both hold the
    same formats, the coarsest of them (an fp16 model reordered differs by fp16 rounding).
    Quantised formats count only where one side quantises and the other does not.
    """
    floats_a = {f for f in reference if not f.quantized}
    floats_b = {f for f in candidate if not f.quantized}
    differ = floats_a ^ floats_b
    pool = set(differ)
    for fmt in differ:
        other = floats_b if fmt in floats_a else floats_a
        coarser = [f for f in other if f < fmt]
        if coarser:  # what the other side holds where this one was: its next coarser format
            pool.add(max(coarser))
    if not pool:
        pool = floats_a | floats_b or {FP32}
    pool.update({f for f in reference if f.quantized} ^ {f for f in candidate if f.quantized})
    return min(pool)
