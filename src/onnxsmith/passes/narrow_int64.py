"""Born int32: int64 index tensors that provably fit int32 are stored and computed as int32.

Exporters write every index as int64. When constant folding materialises an
index grid (HITNet's Expand -> Tile -> Tile -> GatherElements: 1.8 GB of one
file) or the graph computes one at run time, half of those bytes are zeros.
Indices into a tensor that fits in memory fit int32, and Gather/GatherElements/
ScatterElements accept int32 indices, so the grid can be int32 from where it is
made.

A *region* is a connected set of int64 values that become int32 together:
values read where int32 is accepted (indices, a Cast's input) and, upstream of
them, the values flowing through ops that move or combine them and run on int32
in onnxruntime (Expand, Tile, Reshape, Concat, Add, Mod, Range, ...). A region
is narrowed when every value in it provably fits int32 — by static bounds
(:mod:`onnxsmith.analysis.intervals`), or, for a producer static reasoning
cannot bound but that depends on constants only (:func:`values_to_evaluate`), by
its min and max evaluated once with onnxruntime and given to the pass
(:func:`onnxsmith.probes.evaluate.evaluate_min_max`) — and when it saves at least
``min_bytes``. Then:

* constants in the region are stored as int32 (born int32, no Cast);
* ConstantOfShape and Cast-from-a-small-int producers are told to make int32;
* any other producer (Shape, ArgMax, NonZero, ...) gets a Cast to int32 right
  after it: the Cast goes at the producer, never at the consumer;
* a use outside the region (a shape input, a graph output) reads a Cast back to
  int64, so every consumer sees the values it saw before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.intervals import VALUE_MOVING, Bounds, Interval, fits_int32, hull, static_size
from onnxsmith.irutil.casts import cast_node, insert_after_producer
from onnxsmith.irutil.names import FreshNames, node_label
from onnxsmith.irutil.unionfind import UnionFind
from onnxsmith.irutil.walk import const_tensor, visit

INT64 = ir.DataType.INT64
INT32 = ir.DataType.INT32

#: Input slots that take int32 as well as int64 without changing the node's output.
SINK_SLOTS: dict[str, tuple[int, ...]] = {
    "Gather": (1,),
    "GatherElements": (1,),
    "ScatterElements": (1,),
    "Cast": (0,),  # an int that fits int32 casts to the same value from either type
}

#: Ops that run on int32 in onnxruntime's CPU provider and whose output type is that of
#: these input slots (None: every input). A region passes through them.
REGION_OPS: dict[str, tuple[int, ...] | None] = {
    **VALUE_MOVING,  # an output holds some of the inputs' values, so has their type
    "Pad": (0, 2),
    "ReduceSum": (0,),
    "CumSum": (0,),
    "Add": None,
    "Sub": None,
    "Mul": None,
    "Div": None,
    "Mod": None,
    "Max": None,
    "Min": None,
    "Neg": (0,),
    "Abs": (0,),
    "Clip": None,
    "Range": None,
}
#: Ops that only take integers from this opset on (Clip-11 is float-only).
_MIN_OPSET = {"Clip": 12}

#: A producer whose bounds are evaluated with onnxruntime may be at most this big.
EVALUATE_LIMIT_BYTES = 256 * 2**20


@dataclass
class Region:
    values: list[ir.Value]
    ops: set[ir.Node]
    #: (node, slot) reads that accept int32
    sinks: set[tuple[ir.Node, int]] = field(default_factory=set)

    def uses_inside(self, value: ir.Value) -> list[tuple[ir.Node, int]]:
        inside = []
        for use in value.uses():
            node, slot = use.node, use.idx
            if (node, slot) in self.sinks or (node in self.ops and slot in _data_slots(node)):
                inside.append((node, slot))
        return inside


@dataclass
class RegionReport:
    """One region, narrowed or not, for ``--explain``."""

    values: list[str]
    read_by: list[str]
    bounds: Interval | None
    saved_bytes: int  # stored constants
    saved_runtime_bytes: int  # computed tensors (static shapes only)
    proof: str  # how the bounds were found, or why narrowing was skipped
    narrowed: bool
    casts_at_producers: list[str] = field(default_factory=list)
    casts_back: int = 0


def _is_onnx(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _data_slots(node: ir.Node) -> tuple[int, ...]:
    slots = REGION_OPS[node.op_type]
    return tuple(range(len(node.inputs))) if slots is None else slots


def _data_inputs(node: ir.Node) -> list[ir.Value]:
    return [v for i in _data_slots(node) if i < len(node.inputs) and (v := node.inputs[i]) is not None]


def _is_region_op(node: ir.Node, opset: int) -> bool:
    return (
        _is_onnx(node)
        and node.op_type in REGION_OPS
        and opset >= _MIN_OPSET.get(node.op_type, 0)
        and all(out.dtype == INT64 for out in node.outputs)
    )


def _is_constant(value: ir.Value) -> bool:
    return ir.convenience.get_const_tensor(value) is not None and not value.is_graph_input()


def find_regions(graph: ir.Graph, opset: int) -> list[Region]:
    """Connected int64 values from int32-accepting reads upstream through region ops."""
    connected: UnionFind[ir.Value] = UnionFind()
    sinks: list[tuple[ir.Node, int]] = []
    stack: list[ir.Value] = []
    for node in graph:
        if not _is_onnx(node):
            continue
        for slot in SINK_SLOTS.get(node.op_type, ()):
            value = node.inputs[slot] if slot < len(node.inputs) else None
            if value is not None and value.dtype == INT64:
                sinks.append((node, slot))
                stack.append(value)
    ops: set[ir.Node] = set()
    order: list[ir.Value] = []
    seen: set[ir.Value] = set()
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        order.append(value)
        connected.add(value)
        linked: list[ir.Value | None] = []
        producer = value.producer()
        if producer is not None and producer.graph is graph and _is_region_op(producer, opset):
            ops.add(producer)
            linked += _data_inputs(producer)
            linked += producer.outputs
        # Downstream too, through one-input ops that make nothing bigger (a Slice of the grid for a
        # graph output): the Cast back to int64 then converts the small result, not the whole grid.
        for use in value.uses():
            node = use.node
            if (
                node.graph is graph
                and _is_region_op(node, opset)
                and _data_inputs(node) == [value]
                and _not_bigger(node.outputs, value)
            ):
                ops.add(node)
                linked += node.outputs
        for other in linked:
            if other is None:
                continue
            connected.union(value, other)
            if other not in seen:
                stack.append(other)
    regions = []
    for values in connected.groups(order):  # discovery order keeps the result deterministic
        members = set(values)
        ops_inside = {op for op in ops if any(out in members for out in op.outputs)}
        regions.append(
            Region(values, ops_inside, {(node, slot) for node, slot in sinks if node.inputs[slot] in members})
        )
    return regions


def values_to_evaluate(
    model: ir.Model, min_bytes: int = 64 * 1024, evaluate_limit_bytes: int = EVALUATE_LIMIT_BYTES
) -> list[ir.Value]:
    """Region values static bounds miss but whose min/max can be evaluated: computed from constants only,
    at most ``evaluate_limit_bytes``, in regions worth narrowing (give their intervals to the pass)."""
    regions = _worth_narrowing(model, min_bytes)
    static = Bounds()
    wanted: list[ir.Value] = []
    for region in regions:
        for value in region.values:
            if value.producer() is None or static.of(value) is not None:
                continue
            size = static_size(value)
            if size is None or size * 8 > evaluate_limit_bytes or not _constant_only(value):
                continue
            wanted.append(value)
    return wanted


def _worth_narrowing(model: ir.Model, min_bytes: int) -> list[Region]:
    opset = model.opset_imports.get("", 1)
    return [r for r in find_regions(model.graph, opset) if _savings(r)[0] + _savings(r)[1] >= min_bytes]


@dataclass
class NarrowInt64Result(ir.passes.PassResult):
    """What :class:`NarrowInt64Pass` did: one report per region, narrowed or not."""

    reports: list[RegionReport] = field(default_factory=list)


class NarrowInt64Pass(ir.passes.InPlacePass):
    """Store and compute int64 index regions as int32 where their values provably fit.

    ``evaluated``: (min, max) of values static bounds miss, by name (:func:`values_to_evaluate`,
    measured by :func:`onnxsmith.probes.evaluate.evaluate_min_max`).
    """

    def __init__(self, min_bytes: int = 64 * 1024, evaluated: dict[str, Interval] | None = None) -> None:
        super().__init__()
        self.min_bytes = min_bytes
        self.evaluated = dict(evaluated or {})
        self._names = FreshNames()

    def call(self, model: ir.Model) -> NarrowInt64Result:
        self._result = NarrowInt64Result(model, False)  # filled while the pass runs
        graph = model.graph
        regions = _worth_narrowing(model, self.min_bytes)
        measured = {
            value: self.evaluated[value.name]
            for region in regions
            for value in region.values
            if value.name in self.evaluated
        }
        bounds = Bounds(measured)
        self._names = FreshNames(taken=(v.name for v in ir.convenience.create_value_mapping(graph).values() if v.name))
        modified = False
        for region in regions:
            report = self._judge(region, bounds, measured)
            if report.narrowed:
                self._rewrite(graph, region, report)
                modified = True
            self._result.reports.append(report)
        self._result.modified = modified
        return self._result

    # -- proving ---------------------------------------------------------------------

    def _judge(self, region: Region, bounds: Bounds, measured: dict[ir.Value, Interval]) -> RegionReport:
        saved, saved_runtime = _savings(region)
        report = RegionReport(
            values=[v.name or "?" for v in region.values],
            read_by=sorted({node_label(node) for node, _ in region.sinks}),
            bounds=None,
            saved_bytes=saved,
            saved_runtime_bytes=saved_runtime,
            proof="",
            narrowed=False,
        )
        for value in region.values:
            if value.is_graph_input():
                report.proof = f"reads graph input '{value.name}', whose values are unknown"
                return report
            if not _is_constant(value) and value.producer() is None:
                report.proof = f"'{value.name}' comes from outside this graph"
                return report
        intervals = {v: bounds.of(v) for v in region.values}
        unknown = [v for v, i in intervals.items() if i is None]
        if unknown:
            producer = unknown[0].producer()
            op = producer.op_type if producer is not None else "constant"
            report.proof = f"cannot bound '{unknown[0].name}' ({op}) statically or by evaluating it"
            return report
        report.bounds = hull(*intervals.values())
        outside = [v for v, i in intervals.items() if not fits_int32(i)]
        if outside:
            interval = intervals[outside[0]]
            assert interval is not None  # none is unknown (checked above)
            lo, hi = interval
            report.proof = f"'{outside[0].name}' may hold values in {lo}..{hi}, outside int32"
            return report
        evaluated = [v.name for v in region.values if v in measured and v.name is not None]  # measured: by name
        report.proof = (
            f"min/max of {', '.join(evaluated)} evaluated once with onnxruntime; the rest by static bounds"
            if evaluated
            else "static bounds"
        )
        report.narrowed = True
        return report

    # -- rewriting -------------------------------------------------------------------

    def _rewrite(self, graph: ir.Graph, region: Region, report: RegionReport) -> None:
        members = set(region.values)
        for value in region.values:
            inside = region.uses_inside(value)
            producer = value.producer()
            if producer is not None and producer in region.ops:
                self._retype(graph, value, inside)
            elif _is_constant(value) and _storable(value):
                self._store_int32(value)
                self._retype(graph, value, inside)
            elif producer is not None and producer.op_type == "ConstantOfShape" and _is_onnx(producer):
                fill = producer.attributes.get("value")
                array = np.zeros(1, np.int32) if fill is None else fill.value.numpy().astype(np.int32)
                producer.attributes["value"] = ir.AttrTensor("value", ir.tensor(array))
                self._retype(graph, value, inside)
            elif (
                producer is not None
                and producer.op_type == "Cast"
                and _is_onnx(producer)
                and producer.inputs[0] not in members
            ):
                producer.attributes["to"] = ir.AttrInt64("to", INT32)
                self._retype(graph, value, inside)
            else:  # Shape, ArgMax, NonZero, ...: the Cast goes right after the producer
                narrow = self._cast_after(graph, value, INT32, "int32")
                for node, slot in inside:
                    node.replace_input_with(slot, narrow)
                report.casts_at_producers.append(node_label(producer) if producer else value.name or "?")
        report.casts_back = sum(1 for v in region.values if v.meta.get("onnxsmith.cast_back"))

    def _retype(self, graph: ir.Graph, value: ir.Value, inside: list[tuple[ir.Node, int]]) -> None:
        """``value`` becomes int32; whoever outside the region reads it gets a Cast back to int64."""
        inside_set = set(inside)
        outside = [(u.node, u.idx) for u in value.uses() if (u.node, u.idx) not in inside_set]
        value.dtype = INT32
        if not outside and not value.is_graph_output():
            return
        value.meta["onnxsmith.cast_back"] = True
        wide = self._cast_after(graph, value, INT64, "int64")
        for node, slot in outside:
            node.replace_input_with(slot, wide)
        if value.is_graph_output():
            # The graph output keeps its name and int64 type; the int32 value is renamed.
            name = value.name
            value.name = self._names(f"{name}_int32")
            wide.name = name
            for i, out in enumerate(graph.outputs):
                if out is value:
                    graph.outputs[i] = wide

    def _store_int32(self, value: ir.Value) -> None:
        array = const_tensor(value).numpy().astype(np.int32)
        narrowed = ir.tensor(array, name=value.name)
        producer = value.producer()
        if producer is not None:  # a Constant node
            producer.attributes["value"] = ir.AttrTensor("value", narrowed)
        else:
            value.const_value = narrowed

    def _cast_after(self, graph: ir.Graph, value: ir.Value, to: ir.DataType, suffix: str) -> ir.Value:
        node = cast_node(value, to, name=self._names(f"{value.name}_{suffix}"))
        insert_after_producer(graph, value, node)
        return node.outputs[0]


def _not_bigger(outputs: Sequence[ir.Value], value: ir.Value) -> bool:
    size = static_size(value)
    sizes = [static_size(out) for out in outputs]
    return size is not None and all(s is not None and s <= size for s in sizes)


def _storable(value: ir.Value) -> bool:
    """A constant whose int32 form can replace it in place (an initializer or Constant(value=...))."""
    producer = value.producer()
    if producer is None:
        return value.is_initializer()
    return producer.op_type == "Constant" and "value" in producer.attributes


def _savings(region: Region) -> tuple[int, int]:
    """(bytes of stored constants saved, bytes of computed tensors saved) by going int32."""
    stored = runtime = 0
    for value in region.values:
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is not None:
            stored += tensor.nbytes // 2
        else:
            size = static_size(value)
            runtime += 4 * size if size is not None else 0
    return stored, runtime


def _constant_only(value: ir.Value) -> bool:
    """Whether ``value`` is computed from constants alone (no graph input, no outer scope)."""
    return all(_is_constant(v) or _computed_inside(v) for v in visit([value], _operands))


def _computed_inside(value: ir.Value) -> bool:
    """Whether a node of the graph computes ``value`` from its inputs alone (it has no subgraph)."""
    producer = value.producer()
    return producer is not None and not any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in producer.attributes.values()
    )


def _operands(value: ir.Value) -> list[ir.Value]:
    """What ``value`` is computed from (nothing for a constant or a graph input: the walk ends there)."""
    producer = value.producer()
    if _is_constant(value) or producer is None:
        return []
    return [i for i in producer.inputs if i is not None]
