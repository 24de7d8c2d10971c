"""Which inputs and outputs of a node share a type, from the operator schemas.

Changing a model's float precision is only safe where an operator's type rules
allow it: ``Add(A: T, B: T) -> C: T`` takes fp16 if T may be fp16, ``Range``'s T
may not be fp16 at all, ``Resize``'s ``scales`` is always fp32, and
``SkipLayerNormalization``'s ``mean`` output is always fp32 whatever its input.
The rules come from onnx's schemas for the standard domains and from
onnxruntime's registry (io/op_schemas.py) for its contrib ops (com.microsoft: MultiHeadAttention,
SkipLayerNormalization, RotaryEmbedding, BiasGelu, ...). An op found in neither
has unknown type rules.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnxsmith.io.op_schemas import ONNX_DOMAINS, onnxruntime_schemas


@dataclass(frozen=True)
class Signature:
    """An operator's formal inputs and outputs as type strings (``T`` or ``tensor(int64)``)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    variadic_input: bool  # the last formal input repeats
    variadic_output: bool
    #: type parameter -> the types it may take, as type strings ("tensor(float16)")
    allowed: dict[str, frozenset[str]]

    def input_param(self, index: int) -> str | None:
        return _param_at(self.inputs, self.variadic_input, index)

    def output_param(self, index: int) -> str | None:
        return _param_at(self.outputs, self.variadic_output, index)

    def allows(self, param: str, dtype: ir.DataType) -> bool:
        """Whether type parameter ``param`` may be a tensor of ``dtype``."""
        return type_string(dtype) in self.allowed.get(param, frozenset())


def _param_at(params: tuple[str, ...], variadic: bool, index: int) -> str | None:
    if index < len(params):
        return params[index]
    return params[-1] if variadic and params else None


def type_string(dtype: ir.DataType) -> str:
    return f"tensor({onnx.helper.tensor_dtype_to_string(int(dtype)).removeprefix('TensorProto.').lower()})"


def signature(node: ir.Node, opset: int | None) -> Signature | None:
    """The type rules of ``node`` at ``opset`` (its domain's version), or None if unknown."""
    return _signature(node.domain or "", node.op_type, opset if opset is not None else 10**6)


@functools.cache
def _signature(domain: str, op_type: str, opset: int) -> Signature | None:
    if domain in ONNX_DOMAINS:
        try:
            schema = onnx.defs.get_schema(op_type, opset, "" if domain == "ai.onnx" else domain)
        except onnx.defs.SchemaError:
            schema = None
        if schema is not None:
            return _from_schema(schema.inputs, schema.outputs, schema.type_constraints, onnx_style=True)
    schema = onnxruntime_schemas().get((domain if domain != "ai.onnx" else "", op_type))
    if schema is None:
        return None
    versions = [s for s in schema if s.since_version <= opset] or schema[:1]
    chosen = max(versions, key=lambda s: s.since_version)
    return _from_schema(chosen.inputs, chosen.outputs, chosen.type_constraints, onnx_style=False)


def _from_schema(inputs, outputs, constraints, *, onnx_style: bool) -> Signature:
    def type_str(p):
        return p.type_str if onnx_style else p.typeStr

    def variadic(params):
        return bool(params) and params[-1].option.name == "Variadic"

    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in constraints}
    return Signature(
        inputs=tuple(type_str(p) for p in inputs),
        outputs=tuple(type_str(p) for p in outputs),
        variadic_input=variadic(inputs),
        variadic_output=variadic(outputs),
        allowed=allowed,
    )


def opset_of(model: ir.Model, node: ir.Node) -> int | None:
    return model.opset_imports.get(node.domain or "", model.opset_imports.get("ai.onnx"))
