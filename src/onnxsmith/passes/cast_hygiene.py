"""Casts only where precision really changes: no fp16 round trips, no duplicates, no orphans.

* ``Cast(to=fp32)`` of ``Cast(to=fp16)`` of an fp32 value ``x``: the pair only
  rounds ``x`` to fp16 and back. Its readers read ``x`` itself — the value stays
  fp32 between two fp32 nodes instead of passing through fp16 (an fp16 overflow
  there is exactly the NaN this project exists to prevent).
* ``Cast(to=fp16)`` of ``Cast(to=fp32)`` of an fp16 value: widening is exact, so
  the pair is the identity; its readers read the fp16 value.
* Casts of the same value to the same type are merged into one.
* A Cast that nothing reads any more (the down-cast whose up-cast was removed)
  is deleted.

Graph outputs keep their names: a Cast that produces one is never removed, and
its input is rewired rather than its readers. Only float-to-float Casts are
touched; a Cast that changes kind (float to int) always changes values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)
_BITS = {ir.DataType.FLOAT16: 16, ir.DataType.BFLOAT16: 16, ir.DataType.FLOAT: 32, ir.DataType.DOUBLE: 64}


@dataclass
class CastCounts:
    round_trips: int = 0  # narrowing-then-widening pairs bypassed (fp32 -> fp16 -> fp32)
    identities: int = 0  # widening-then-narrowing pairs bypassed (fp16 -> fp32 -> fp16)
    merged: int = 0  # duplicate Casts of one value to one type
    orphans: int = 0  # Casts removed because nothing read them any more

    @property
    def removed(self) -> int:
        return self.merged + self.orphans

    def describe(self) -> str:
        return (
            f"removed {self.round_trips} fp32->fp16->fp32 round trips and {self.identities} identity pairs "
            f"({self.orphans} orphaned casts deleted), merged {self.merged} duplicate casts"
        )


def is_float_cast(node: ir.Node) -> bool:
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return False
    source = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
    return source in FLOATS and node.attributes.get_int("to") in [int(t) for t in FLOATS]


def count_casts(model: ir.Model) -> int:
    return sum(1 for graph in model.graphs() for node in graph if node.op_type == "Cast")


def round_trip_pairs(model: ir.Model) -> list[tuple[ir.Node, ir.Node]]:
    """Cast(fp32) nodes that read a Cast(fp16) of an fp32 value (what this pass removes)."""
    pairs = []
    for graph in model.graphs():
        for node in graph:
            inner = _inner_cast(node)
            if inner is not None and _narrows_then_widens(inner, node):
                pairs.append((inner, node))
    return pairs


def _inner_cast(node: ir.Node) -> ir.Node | None:
    if not is_float_cast(node):
        return None
    producer = _cast_input(node).producer()
    return producer if producer is not None and is_float_cast(producer) else None


def _cast_input(cast: ir.Node) -> ir.Value:
    """The value a float Cast reads (:func:`is_float_cast` checked it has one)."""
    value = cast.inputs[0]
    assert value is not None
    return value


def _narrows_then_widens(inner: ir.Node, outer: ir.Node) -> bool:
    source = _cast_input(inner).dtype
    middle = ir.DataType(inner.attributes.get_int("to"))
    target = ir.DataType(outer.attributes.get_int("to"))
    return target == source and _BITS[middle] < _BITS[source]


def _widens_then_narrows(inner: ir.Node, outer: ir.Node) -> bool:
    source = _cast_input(inner).dtype
    middle = ir.DataType(inner.attributes.get_int("to"))
    target = ir.DataType(outer.attributes.get_int("to"))
    # fp16 -> fp32 -> fp16 is exact; fp16 -> fp32 -> bf16 is not the identity.
    return target == source and _BITS[middle] > _BITS[source]


@dataclass
class CastHygieneResult(ir.passes.PassResult):
    counts: CastCounts = field(default_factory=CastCounts)


class CastHygienePass(ir.passes.InPlacePass):
    """See the module docstring; the result's ``counts`` say what was removed."""

    def call(self, model: ir.Model) -> CastHygieneResult:
        counts = CastCounts()
        for graph in model.graphs():
            self._bypass_pairs(graph, counts)
            self._merge_duplicates(graph, counts)
            self._remove_orphans(graph, counts)
        modified = bool(counts.round_trips or counts.identities or counts.removed)
        return CastHygieneResult(model, modified, counts)

    def _bypass_pairs(self, graph: ir.Graph, counts: CastCounts) -> None:
        for node in list(graph):
            inner = _inner_cast(node)
            if inner is None:
                continue
            if _narrows_then_widens(inner, node):
                counts.round_trips += 1
            elif _widens_then_narrows(inner, node):
                counts.identities += 1
            else:
                continue
            _bypass(graph, node, _cast_input(inner))

    def _merge_duplicates(self, graph: ir.Graph, counts: CastCounts) -> None:
        seen: dict[tuple[ir.Value, int], ir.Node] = {}
        for node in list(graph):
            if not is_float_cast(node):
                continue
            key = (_cast_input(node), node.attributes.get_int("to"))
            kept = seen.get(key)
            if kept is None:
                seen[key] = node
                continue
            # Keep the one that is a graph output, so output names survive.
            if node.outputs[0].is_graph_output() and not kept.outputs[0].is_graph_output():
                kept, node = node, kept
                seen[key] = kept
            if node.outputs[0].is_graph_output():
                continue  # two outputs of the same values: both names are the interface
            _bypass(graph, node, kept.outputs[0])
            counts.merged += 1

    def _remove_orphans(self, graph: ir.Graph, counts: CastCounts) -> None:
        changed = True
        while changed:
            changed = False
            for node in reversed(list(graph)):
                if is_float_cast(node) and not node.outputs[0].uses() and not node.outputs[0].is_graph_output():
                    graph.remove(node, safe=True)
                    counts.orphans += 1
                    changed = True


def _bypass(graph: ir.Graph, cast: ir.Node, replacement: ir.Value) -> None:
    """Readers of ``cast`` read ``replacement`` instead. A Cast producing a graph output stays,
    to keep the output's name, reading ``replacement`` (then possibly a same-type, exact Cast)."""
    out = cast.outputs[0]
    for user, index in list(out.uses()):
        user.replace_input_with(index, replacement)
    if out.is_graph_output():
        cast.replace_input_with(0, replacement)
    else:
        graph.remove(cast, safe=True)
