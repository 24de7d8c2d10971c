"""Is a parsed model well-formed? Checked before anything reads its weights or runs it.

Our checks come first where they can say more than onnx's checker: opsets in range,
graph order (a cycle, a value nothing defines; a graph that is merely out of order is
sorted), graph inputs and outputs without an element type, tensors whose data
disagrees with their declared shape (a 200-byte file declaring 4 TiB), external data
outside the model's folder, missing, or shorter than its tensor. Then onnx.checker's
full check: schemas, single assignment, unique names, type and shape inference.

Where onnx.checker and onnxruntime disagree, onnxruntime decides: a standard-domain node
that onnx has no schema for at the model's opset but onnxruntime registers
(``LayerNormalization`` at opset 12, as onnxruntime's own optimizer writes it) is accepted,
everything around it still checked, and the loader says so (:func:`ops_left_to_onnxruntime`;
``inspect`` shows it). A node neither knows is refused, with the checker's message.

Everything here reads the protobuf as parsed; a large model's weights are external
references by then (see :mod:`onnxsmith.io.load`), so the checks never copy them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

from onnxsmith.core.errors import InputError
from onnxsmith.io import op_schemas, paths
from onnxsmith.io.files import human_bytes

#: The domain a node onnx.checker cannot judge is moved to in the copy it checks (see the module doc).
_LEFT_DOMAIN = "onnxsmith.left-to-onnxruntime"

#: The newest opset of each standard domain the onnx package here knows.
MAX_OPSET = {"": onnx.defs.onnx_opset_version(), "ai.onnx": onnx.defs.onnx_opset_version()}
MAX_OPSET["ai.onnx.ml"] = max(row[3] for row in onnx.helper.VERSION_TABLE)


def check_model_proto(proto: onnx.ModelProto, path: Path, *, with_onnx: bool = True) -> None:
    """Raise :class:`InputError` naming ``path`` and the first problem found.

    Ops that onnx.checker lacks and onnxruntime runs are accepted (:func:`ops_left_to_onnxruntime`).

    Mutates ``proto`` only to sort a graph whose nodes are out of topological order.
    ``with_onnx``: False skips onnx.checker (the file passed it before).
    """
    _check_opsets(proto, path)
    _check_unique_initializers(proto.graph, path)
    _order_graph(proto.graph, set(), path)
    _check_io_types(proto.graph, path)
    data_files: dict[str, tuple[Path, int]] = {}
    for tensor in tensors(proto):
        _check_tensor_data(tensor, path, data_files)
    if with_onnx:
        check_with_onnx(proto, path)


def check_with_onnx(proto: onnx.ModelProto, path: Path) -> None:
    """onnx.checker's full check (with type and shape inference), as an :class:`InputError`.

    ``path``: where ``proto`` is (or will be) stored; its external data is beside it.
    The full check is the checker's two halves, the structural check and strict type
    and shape inference, run apart for one reason: the structural half demands a shape
    on every graph input and output, where ONNX (and onnxruntime) allow an unknown rank.
    """
    model = _without_file_data(proto, path)
    left = ops_left_to_onnxruntime(proto)
    if left:
        model = _set_aside(model if model is not proto else _copy(proto), left)
    try:
        onnx.checker.check_model(_io_shapes_declared(model))
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError) as err:
        raise InputError(f"not a valid ONNX model (onnx.checker: {_checker_message(err)})", path) from None


def ops_left_to_onnxruntime(proto: onnx.ModelProto) -> list[tuple[str, str, int]]:
    """Standard-domain ops of ``proto`` that onnx has no schema for at its opset but onnxruntime registers:
    (domain, op type, opset), sorted. onnx.checker would refuse them; onnxruntime runs them."""
    found: set[tuple[str, str, int]] = set()
    for nodes, opsets in _scopes(proto):
        for node in nodes:
            domain = "" if node.domain == "ai.onnx" else node.domain
            version = opsets.get(domain)
            if domain not in op_schemas.ONNX_DOMAINS or version is None:
                continue
            if not op_schemas.onnx_has(domain, node.op_type, version) and op_schemas.onnxruntime_has(
                domain, node.op_type, version
            ):
                found.add((domain, node.op_type, version))
    return sorted(found)


def _scopes(proto: onnx.ModelProto) -> Iterator[tuple[list[onnx.NodeProto], dict[str, int]]]:
    """Every node list (graph, subgraphs, functions) with the opsets its nodes are read at."""

    def opsets(imports: Iterable[onnx.OperatorSetIdProto]) -> dict[str, int]:
        return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in imports}

    def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
        yield graph
        for node in graph.node:
            for sub in _subgraphs(node):
                yield from graphs(sub)

    model_opsets = opsets(proto.opset_import)
    for graph in graphs(proto.graph):
        yield list(graph.node), model_opsets
    local = {(f.domain, f.name) for f in proto.functions}
    for function in proto.functions:
        yield [n for n in function.node if (n.domain, n.op_type) not in local], opsets(function.opset_import)


def _set_aside(proto: onnx.ModelProto, left: list[tuple[str, str, int]]) -> onnx.ModelProto:
    """``proto`` (a copy, changed in place) with the nodes of ``left`` in a domain onnx.checker does not judge."""
    wanted = set(left)
    for nodes, opsets in _scopes(proto):
        for node in nodes:
            domain = "" if node.domain == "ai.onnx" else node.domain
            if (domain, node.op_type, opsets.get(domain)) in wanted:
                node.domain = _LEFT_DOMAIN
    proto.opset_import.append(onnx.helper.make_opsetid(_LEFT_DOMAIN, 1))
    for function in proto.functions:
        function.opset_import.append(onnx.helper.make_opsetid(_LEFT_DOMAIN, 1))
    return proto


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy


def _io_shapes_declared(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto``, or a copy in which graph inputs and outputs of unknown rank declare an (empty) shape."""

    def graph_io(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
        return [*graph.input, *graph.output]

    if all(v.type.tensor_type.HasField("shape") for v in graph_io(proto.graph) if v.type.HasField("tensor_type")):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for value in graph_io(copy.graph):
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.shape.SetInParent()
    return copy


def _without_file_data(proto: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """``proto`` as onnx.checker may see it: no tensor data in files.

    The checker looks for a data file relative to the working directory unless it loads
    the model from its path itself, which would parse a large single-file model whole.
    So in a copy, the main graph's tensors held in files become graph inputs of the same
    type and shape (what shape inference sees of a weight), and the rare ones elsewhere
    (a subgraph, an attribute) are read in. The data files were checked by then.
    """
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors(proto)):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    graph = copy.graph
    inputs = {v.name for v in graph.input}
    kept = []
    for tensor in graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            kept.append(tensor)
        elif tensor.name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    if len(kept) != len(graph.initializer):
        remaining = onnx.GraphProto()
        remaining.initializer.extend(kept)
        del graph.initializer[:]
        graph.initializer.extend(remaining.initializer)
    for tensor in tensors(copy):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _read_in(tensor, path)
    return copy


def _read_in(tensor: onnx.TensorProto, path: Path) -> None:
    entries = {entry.key: entry.value for entry in tensor.external_data}
    data_path = paths.data_file(entries.get("location", ""), path, tensor.name)
    with open(data_path, "rb") as f:
        f.seek(int(entries.get("offset", 0)))
        data = f.read(int(entries["length"])) if "length" in entries else f.read()
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = data


def _checker_message(err: Exception) -> str:
    text, _, context = str(err).partition("==> Context:")
    text = " ".join(text.split()).rstrip(" |")
    node = context.split("Name:", 1)[-1].split("OpType:") if "Name:" in context else None
    if node and len(node) == 2:
        name, op = (part.strip() for part in node)
        text += f" (node '{name}', {op})" if name else f" (a {op} node)"
    return text


def _check_opsets(proto: onnx.ModelProto, path: Path) -> None:
    for opset in proto.opset_import:
        domain = opset.domain or "ai.onnx"
        if opset.version < 1:
            raise InputError(f"opset {opset.version} of {domain} is not a valid opset version", path)
        newest = MAX_OPSET.get(opset.domain)
        if newest is not None and opset.version > newest:
            raise InputError(
                f"opset {opset.version} of {domain} is newer than the onnx package here knows "
                f"(at most {newest}); upgrade onnx",
                path,
            )


def _order_graph(graph: onnx.GraphProto, outer: set[str], path: Path) -> None:
    """Check that every value a node reads is defined and the nodes form a DAG; sort them if needed."""
    defined = set(outer)
    defined.update(v.name for v in graph.input)
    defined.update(t.name for t in graph.initializer)
    defined.update(s.values.name for s in graph.sparse_initializer)
    nodes = list(graph.node)
    reads = [_reads(node) for node in nodes]
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            if name in producer or (name and name in defined):
                first = (
                    f"node '{_label(nodes[producer[name]])}'" if name in producer else "a graph input or initializer"
                )
                raise InputError(f"'{name}' is written twice: by {first} and by node '{_label(node)}'", path)
            if name:
                producer[name] = index
    seen = set(defined)
    in_order = True
    for index, node in enumerate(nodes):
        for name in reads[index]:
            if name in seen:
                continue
            if name not in producer:
                raise InputError(
                    f"node '{_label(node)}' reads '{name}', which no node, input or initializer defines", path
                )
            in_order = False
        seen.update(node.output)
    if not in_order:
        _sort_nodes(graph, nodes, reads, producer, defined, path)
    visible = defined | set(producer)
    for output in graph.output:
        if output.name not in visible:
            raise InputError(f"graph output '{output.name}' is not produced by any node", path)
    for node in nodes:
        for sub in _subgraphs(node):
            _order_graph(sub, visible, path)


def _sort_nodes(
    graph: onnx.GraphProto,
    nodes: list[onnx.NodeProto],
    reads: list[list[str]],
    producer: dict[str, int],
    defined: set[str],
    path: Path,
) -> None:
    """Reorder ``graph.node`` topologically, keeping the file's order where it is free (Kahn)."""
    users: list[list[int]] = [[] for _ in nodes]
    pending = [0] * len(nodes)
    for index in range(len(nodes)):
        deps = {producer[name] for name in reads[index] if name not in defined}
        pending[index] = len(deps)
        for dep in deps:
            users[dep].append(index)
    ready = [i for i in range(len(nodes)) if pending[i] == 0]
    order: list[int] = []
    while ready:
        ready.sort(reverse=True)
        index = ready.pop()
        order.append(index)
        for user in users[index]:
            pending[user] -= 1
            if pending[user] == 0:
                ready.append(user)
    if len(order) != len(nodes):
        stuck = next(i for i in range(len(nodes)) if pending[i] > 0)
        raise InputError(f"the graph is not a DAG: node '{_label(nodes[stuck])}' is on a cycle", path)
    reordered = onnx.GraphProto()
    reordered.node.extend(nodes[i] for i in order)
    del graph.node[:]
    graph.node.extend(reordered.node)


def _reads(node: onnx.NodeProto) -> list[str]:
    """Names a node reads: its inputs and what its subgraphs capture from outside."""
    names = [name for name in node.input if name]
    for sub in _subgraphs(node):
        names.extend(_captured(sub))
    return names


def _captured(graph: onnx.GraphProto) -> list[str]:
    own = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    own.update(s.values.name for s in graph.sparse_initializer)
    for node in graph.node:
        own.update(node.output)
    return [name for node in graph.node for name in _reads(node) if name not in own]


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _label(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type} -> {', '.join(name or '?' for name in node.output)}"


def _check_unique_initializers(graph: onnx.GraphProto, path: Path) -> None:
    names = [t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer]
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise InputError(f"two initializers are named '{twice}'", path)
    for node in graph.node:
        for sub in _subgraphs(node):
            _check_unique_initializers(sub, path)


def _check_io_types(graph: onnx.GraphProto, path: Path) -> None:
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            if not value.HasField("type"):
                raise InputError(f"graph {kind} '{value.name}' has no type", path)
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type == 0:
                raise InputError(f"graph {kind} '{value.name}' has no element type", path)


def tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor in the model: initializers, sparse ones' parts, attributes; subgraphs and functions."""

    def of_graph(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in graph.node:
            yield from of_node(node)

    def of_node(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from of_graph(attr.g)
            for sub in attr.graphs:
                yield from of_graph(sub)

    yield from of_graph(proto.graph)
    for function in proto.functions:
        for node in function.node:
            yield from of_node(node)


def _declared_bytes(tensor: onnx.TensorProto, path: Path) -> int | None:
    """The bytes the tensor's dims and type need (None for strings)."""
    try:
        dtype = ir.DataType(tensor.data_type)
    except ValueError:
        dtype = ir.DataType.UNDEFINED
    if dtype == ir.DataType.UNDEFINED:
        raise InputError(f"tensor '{tensor.name}' has an unknown data type ({tensor.data_type})", path)
    if dtype == ir.DataType.STRING:
        return None
    if any(d < 0 for d in tensor.dims):
        raise InputError(f"tensor '{tensor.name}' has a negative dim {list(tensor.dims)}", path)
    size: int = math.ceil(math.prod(tensor.dims) * dtype.bitwidth / 8)
    return size


def _check_tensor_data(tensor: onnx.TensorProto, path: Path, data_files: dict[str, tuple[Path, int]]) -> None:
    needed = _declared_bytes(tensor, path)
    shape = f"shape {list(tensor.dims)} of {onnx.TensorProto.DataType.Name(tensor.data_type)}"
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        _check_external(tensor, needed, shape, path, data_files)
    elif needed is not None and tensor.HasField("raw_data") and len(tensor.raw_data) != needed:
        raise InputError(
            f"tensor '{tensor.name}' declares {shape} ({_bytes(needed)}) but holds {_bytes(len(tensor.raw_data))} "
            "of data; the declared size disagrees with the data",
            path,
        )


def _check_external(
    tensor: onnx.TensorProto, needed: int | None, shape: str, path: Path, data_files: dict[str, tuple[Path, int]]
) -> None:
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    if location not in data_files:
        data_path = paths.data_file(location, path, tensor.name)
        if not data_path.is_file():
            why = "is missing" if not data_path.exists() else "is not a regular file"
            raise InputError(
                f"external data file '{location}' of tensor '{tensor.name}' {why} (looked for {data_path})", path
            )
        data_files[location] = (data_path, data_path.stat().st_size)
    data_path, size = data_files[location]
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries["length"]) if "length" in entries else needed
    except ValueError:
        raise InputError(f"tensor '{tensor.name}': external data offset or length is not an integer", path) from None
    if offset < 0 or (length is not None and length < 0):
        raise InputError(f"tensor '{tensor.name}': external data offset or length is negative", path)
    if needed is not None and length != needed:
        raise InputError(
            f"tensor '{tensor.name}' declares {shape} ({_bytes(needed)}) but {_bytes(length or 0)} of external data; "
            "the declared size disagrees with the data",
            path,
        )
    if length is not None and offset + length > size:
        raise InputError(
            f"external data file '{location}' is too short for tensor '{tensor.name}' "
            f"(needs {offset + length} bytes, has {size}); is it truncated?",
            path,
        )


def _bytes(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{n:,} bytes, {human_bytes(n)}"
