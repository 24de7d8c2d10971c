"""Load an .onnx file into onnx-ir, or say in one line why it can't be loaded.

Weights are never copied into Python bytes: external data is memory-mapped by
onnx-ir, and a large single-file model has its ``raw_data`` fields located in a
memory map of the file (see :mod:`onnxsmith.io.wire`) and exposed to onnx-ir as
external tensors pointing into the .onnx file itself.
"""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from onnxsmith.core.errors import InputError
from onnxsmith.io import wire

#: Files at least this big are read through a memory map (weights stay on disk).
LAZY_FILE_BYTES = 32 * 1024 * 1024
#: In a lazily read file, tensors at least this big stay on disk.
LAZY_TENSOR_BYTES = 64 * 1024

MIN_IR_VERSION = 3


def load_model(path: str | os.PathLike, *, lazy_file_bytes: int = LAZY_FILE_BYTES) -> ir.Model:
    """Load and validate ``path``; raise :class:`InputError` naming the problem."""
    path = Path(path)
    if not path.exists():
        raise InputError("no such file", path)
    if path.is_dir():
        raise InputError("is a folder, expected an .onnx file", path)
    size = path.stat().st_size
    if size == 0:
        raise InputError("file is empty", path)
    try:
        if size >= lazy_file_bytes and path.stat().st_nlink == 1:
            proto = _read_lazily(path)
        else:
            proto = onnx.load(os.fspath(path), load_external_data=False)
    except (DecodeError, wire.WireError, RuntimeError) as err:
        raise InputError(f"not a valid ONNX file (protobuf parse failed: {err})", path) from None
    except OSError as err:
        raise InputError(f"cannot read ({err.strerror})", path) from None
    _check_header(proto, path)
    # onnx-ir logs what it tolerates (dangling outputs, unknown inputs); check_graph reports it properly.
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as err:  # onnx-ir rejects malformed protos with assorted errors
        raise InputError(f"not a valid ONNX model ({err})", path) from None
    ir.external_data.set_base_dir(model.graph, path.parent)
    check_external_data(model, path)
    check_graph(model, path)
    return model


def release_weights(model: ir.Model) -> None:
    """Unmap every weight of ``model`` read from its files (onnx-ir maps one on first read).

    A model's graph holds reference cycles, so its maps would otherwise stay until the
    garbage collector runs: with a big model, another model's worth of resident memory.
    The model stays usable (a released weight is mapped again when next read).
    """
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                value.const_value.release()


def _check_header(proto: onnx.ModelProto, path: Path) -> None:
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise InputError("not an ONNX model (no graph or IR version in the file)", path)
    if proto.ir_version > onnx.IR_VERSION:
        raise InputError(
            f"IR version {proto.ir_version} is newer than the onnx package here supports "
            f"(at most {onnx.IR_VERSION}); upgrade onnx",
            path,
        )
    if proto.ir_version < MIN_IR_VERSION:
        raise InputError(
            f"IR version {proto.ir_version} is older than supported (at least {MIN_IR_VERSION})",
            path,
        )


def _read_lazily(path: Path) -> onnx.ModelProto:
    """Parse ``path`` leaving large initializers' bytes in the file, as external data."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        model_rest = bytearray()
        graphs: list[wire.Field] = []
        for field in wire.iter_fields(buf, 0, len(buf)):
            if field.number == wire.MODEL_GRAPH and field.wire_type == wire.LEN:
                graphs.append(field)
            else:
                model_rest += buf[field.start : field.end]
        proto = onnx.ModelProto.FromString(bytes(model_rest))
        for graph_field in graphs:  # a message field repeated on the wire is merged
            graph_rest = bytearray()
            initializers: list[wire.Field] = []
            for field in wire.iter_fields(buf, graph_field.value_start, graph_field.end):
                if field.number == wire.GRAPH_INITIALIZER and field.wire_type == wire.LEN:
                    initializers.append(field)
                else:
                    graph_rest += buf[field.start : field.end]
            proto.graph.MergeFromString(bytes(graph_rest))
            for init in initializers:
                _add_initializer(proto.graph, buf, init, path.name)
    return proto


def _add_initializer(graph: onnx.GraphProto, buf, init: wire.Field, file_name: str) -> None:
    header = bytearray()
    raw: wire.Field | None = None
    for field in wire.iter_fields(buf, init.value_start, init.end):
        if field.number == wire.TENSOR_RAW_DATA and field.wire_type == wire.LEN:
            raw = field
        else:
            header += buf[field.start : field.end]
    tensor = graph.initializer.add()
    tensor.ParseFromString(bytes(header))
    if raw is None:
        return
    length = raw.end - raw.value_start
    if length < LAZY_TENSOR_BYTES:
        tensor.raw_data = buf[raw.value_start : raw.end]
        return
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", file_name), ("offset", raw.value_start), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)


def check_external_data(model: ir.Model, path: Path) -> None:
    """Every external tensor's file exists beside the model and is long enough."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if not isinstance(tensor, ir.ExternalTensor):
                continue
            data_path = Path(tensor.path)
            if not data_path.is_file():
                raise InputError(
                    f"external data file '{tensor.location}' of tensor '{value.name}' is missing "
                    f"(looked for {data_path})",
                    path,
                )
            needed = (tensor.offset or 0) + (tensor.length if tensor.length is not None else tensor.nbytes)
            if data_path.stat().st_size < needed:
                raise InputError(
                    f"external data file '{tensor.location}' is too short for tensor '{value.name}' "
                    f"(needs {needed} bytes, has {data_path.stat().st_size}); is it truncated?",
                    path,
                )


def check_graph(model: ir.Model, path: Path) -> None:
    """The graph (and every subgraph) is a DAG whose every read value is defined."""
    _check_one_graph(model.graph, path, outer=set())


def _check_one_graph(graph: ir.Graph, path: Path, outer: set[ir.Value]) -> None:
    defined = set(outer) | set(graph.inputs) | set(graph.initializers.values())
    nodes = list(graph)
    in_graph = set(nodes)
    # Kahn's algorithm over the dependencies inside this graph.
    pending: dict[ir.Node, int] = {}
    users: dict[ir.Node, list[ir.Node]] = {node: [] for node in nodes}
    for node in nodes:
        deps = set()
        for value in _reads(node):
            producer = value.producer()
            if producer is not None and producer in in_graph:
                deps.add(producer)
            elif value not in defined and value.name:
                raise InputError(
                    f"node '{_node_label(node)}' reads '{value.name}', which no node, input or initializer defines",
                    path,
                )
        pending[node] = len(deps)
        for dep in deps:
            users[dep].append(node)
    ready = [node for node in nodes if pending[node] == 0]
    done = 0
    while ready:
        node = ready.pop()
        done += 1
        for user in users[node]:
            pending[user] -= 1
            if pending[user] == 0:
                ready.append(user)
    if done != len(nodes):
        stuck = next(node for node in nodes if pending[node] > 0)
        raise InputError(f"the graph is not a DAG: node '{_node_label(stuck)}' is on a cycle", path)
    for output in graph.outputs:
        if output.producer() is None and output not in defined:
            raise InputError(f"graph output '{output.name}' is not produced by any node", path)
    produced = defined | {out for n in nodes for out in n.outputs}
    for node in nodes:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                _check_one_graph(attr.value, path, produced)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    _check_one_graph(sub, path, produced)


def _reads(node: ir.Node) -> list[ir.Value]:
    """Values a node reads: its inputs and what its subgraphs capture from outside."""
    values = [v for v in node.inputs if v is not None]
    for attr in node.attributes.values():
        subgraphs = (
            [attr.value]
            if attr.type == ir.AttributeType.GRAPH
            else list(attr.value)
            if attr.type == ir.AttributeType.GRAPHS
            else []
        )
        for sub in subgraphs:
            values.extend(_captured(sub))
    return values


def _captured(graph: ir.Graph) -> list[ir.Value]:
    own = set(graph.inputs) | set(graph.initializers.values())
    for node in graph:
        own.update(node.outputs)
    captured = []
    for node in graph:
        for value in _reads(node):
            if value not in own:
                captured.append(value)
    return captured


def _node_label(node: ir.Node) -> str:
    return node.name or f"{node.op_type} -> {', '.join(v.name or '?' for v in node.outputs)}"
