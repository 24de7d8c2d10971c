"""Which operators exist: onnx's schemas, and onnxruntime's registry beside them.

onnx.checker knows onnx's schemas only. onnxruntime registers more: its contrib ops
(com.microsoft: MultiHeadAttention, SkipLayerNormalization, ...) and some in the standard
domain at opsets where onnx has none (``LayerNormalization`` from opset 1, which onnx adds
at 17; onnxruntime's transformer optimizer writes it at opset 12). The loader accepts such a
node because onnxruntime runs it (io/check.py); the contrib ops' type rules come from here
too (analysis/type_rules.py). The registry is data: reading it opens no session.
"""

from __future__ import annotations

import functools
from typing import Any

import onnx

#: The domains whose schemas onnx itself defines ("ai.onnx" is "").
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def onnx_has(domain: str, op_type: str, opset: int) -> bool:
    """Whether onnx has a schema for ``op_type`` in ``domain`` at ``opset`` (the domain's version)."""
    return onnx.defs.has(op_type, opset, "" if domain == "ai.onnx" else domain)


def onnxruntime_has(domain: str, op_type: str, opset: int) -> bool:
    """Whether onnxruntime registers ``op_type`` in ``domain`` at ``opset`` (introduced at or before it)."""
    versions = onnxruntime_schemas().get(("" if domain == "ai.onnx" else domain, op_type), [])
    return any(schema.since_version <= opset for schema in versions)


@functools.cache
def onnxruntime_schemas() -> dict[tuple[str, str], list[Any]]:
    """onnxruntime's operator registry (contrib ops included), by (domain, op), oldest version first."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

        schemas = ort_state.get_all_operator_schema()
    except (ImportError, AttributeError):  # a minimal onnxruntime build without the registry
        return {}
    table: dict[tuple[str, str], list[Any]] = {}
    for schema in schemas:
        table.setdefault((schema.domain, schema.name), []).append(schema)
    for versions in table.values():
        versions.sort(key=lambda s: s.since_version)
    return table
