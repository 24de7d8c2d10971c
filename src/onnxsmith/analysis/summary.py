"""What a model is made of: the data behind ``onnxsmith inspect``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.io.load import LEFT_TO_ONNXRUNTIME
from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.walk import all_nodes, constant_tensors

INT64_WARN_BYTES = 64 * 2**20
LARGE_CONSTANT_BYTES = 64 * 2**20
PROTOBUF_LIMIT = 2**31
_BLOAT_OPS = {"Tile", "Expand", "ConstantOfShape"}


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: list[int]
    bytes: int
    kind: str  # "initializer" or "Constant node"
    readers: list[str]  # the nodes that read it


@dataclass
class ModelSummary:
    ir_version: int
    opsets: dict[str, int]
    producer: str
    inputs: list[dict]
    outputs: list[dict]
    node_count: int
    ops: dict[str, int]  # "domain::Op" or "Op" -> count, subgraphs included
    subgraphs: int
    parameters: int
    bytes_by_dtype: dict[str, int]
    params_by_dtype: dict[str, int]
    largest: list[TensorInfo]
    warnings: list[str] = field(default_factory=list)
    file_bytes: int | None = None

    def to_json(self) -> dict:
        data = dict(self.__dict__)
        data["largest"] = [t.__dict__ for t in self.largest]
        return data


def _io(value: ir.Value) -> dict:
    dims: list = []
    if value.shape is not None:
        dims = [d if isinstance(d, int) else (d.value or "?") for d in value.shape]
    return {"name": value.name, "dtype": value.dtype.name if value.dtype else "?", "dims": dims}


def _op_key(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def summarize(model: ir.Model, *, top: int = 10, file_bytes: int | None = None) -> ModelSummary:
    ops: Counter[str] = Counter()
    nodes = list(all_nodes(model))
    for node in nodes:
        ops[_op_key(node)] += 1
    subgraph_count = sum(1 for _ in model.graphs()) - 1

    bytes_by_dtype: Counter[str] = Counter()
    params_by_dtype: Counter[str] = Counter()
    tensors: list[TensorInfo] = []
    for const in constant_tensors(model):
        tensor = const.tensor
        dtype = tensor.dtype.name
        bytes_by_dtype[dtype] += tensor.nbytes
        params_by_dtype[dtype] += tensor.size
        readers = sorted({node_label(user) for user, _ in const.value.uses()})
        tensors.append(
            TensorInfo(
                const.value.name or "?",
                dtype,
                [int(d) for d in tensor.shape.numpy()],
                tensor.nbytes,
                const.kind,
                readers,
            )
        )
    tensors.sort(key=lambda t: (-t.bytes, t.name))
    parameters = sum(params_by_dtype.values())

    summary = ModelSummary(
        ir_version=model.ir_version,
        opsets=dict(sorted(model.opset_imports.items())),
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p),
        inputs=[_io(v) for v in model.graph.inputs if v.name not in model.graph.initializers],
        outputs=[_io(v) for v in model.graph.outputs],
        node_count=len(nodes),
        ops=dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        subgraphs=subgraph_count,
        parameters=parameters,
        bytes_by_dtype=dict(sorted(bytes_by_dtype.items(), key=lambda kv: -kv[1])),
        params_by_dtype=dict(sorted(params_by_dtype.items(), key=lambda kv: -kv[1])),
        largest=tensors[:top],
        file_bytes=file_bytes,
    )
    summary.warnings = _warnings(model, tensors, sum(bytes_by_dtype.values()), file_bytes)
    return summary


def _warnings(model: ir.Model, tensors: list[TensorInfo], total_bytes: int, file_bytes: int | None) -> list[str]:
    warnings = []
    for domain, op_type, opset in model.meta.get(LEFT_TO_ONNXRUNTIME, []):
        warnings.append(
            f"onnx.checker has no {op_type} at opset {opset} of {domain or 'ai.onnx'}; onnxruntime registers "
            "one and runs it, so the model is accepted (tools that go by onnx.checker alone refuse it)"
        )
    for t in tensors:
        if t.dtype == "INT64" and t.bytes > INT64_WARN_BYTES:
            readers = ", ".join(t.readers) or "nothing"
            warnings.append(
                f"int64 tensor '{t.name}' takes {t.bytes / 2**20:.0f} MB (read by {readers}); "
                "if its values fit int32, `onnxsmith shrink` can halve it"
            )
    warnings.extend(_bloat_chains(model))
    size = max(total_bytes, file_bytes or 0)
    if size > 0.9 * PROTOBUF_LIMIT:
        warnings.append(
            f"the model takes {size / 2**30:.2f} GiB, within 10% of protobuf's 2 GiB limit for one "
            "file; save it with external data"
        )
    return warnings


def _bloat_chains(model: ir.Model) -> list[str]:
    """Tile/Expand/ConstantOfShape nodes whose output is a large tensor computable ahead of time."""
    warnings = []
    for node in all_nodes(model):
        if node.op_type not in _BLOAT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        out = node.outputs[0]
        if out.shape is None or out.dtype is None or not all(isinstance(d, int) for d in out.shape):
            continue
        nbytes = int(np.prod([int(d) for d in out.shape], dtype=np.int64)) * out.dtype.itemsize
        if nbytes >= LARGE_CONSTANT_BYTES and _inputs_constant(node):
            warnings.append(
                f"node '{node_label(node)}' ({node.op_type}) builds a {nbytes / 2**20:.0f} MB "
                f"{out.dtype.name} tensor from constants; constant folding would store it in the file"
            )
    return warnings


def _inputs_constant(node: ir.Node, depth: int = 0) -> bool:
    """Whether a node's inputs are computable from constants alone (a shallow look upstream)."""
    if depth > 16:
        return False
    for value in node.inputs:
        if value is None or value.const_value is not None:
            continue
        producer = value.producer()
        if producer is None:
            return False
        if producer.op_type != "Constant" and not _inputs_constant(producer, depth + 1):
            return False
    return True
