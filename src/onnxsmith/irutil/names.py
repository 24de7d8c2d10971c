"""Names: how a node is named in messages, and fresh names for the values and weights a rewrite makes."""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from onnxsmith.irutil.walk import subgraphs_of


def node_label(node: ir.Node) -> str:
    """How a node is named in messages: its name, else its op and first output."""
    if node.name:
        return node.name
    first = node.outputs[0].name if node.outputs else "?"
    return f"{node.op_type}->{first}"


def graph_names(graph: ir.Graph | ir.Function) -> set[str]:
    """Every value name ``graph`` uses: inputs, initializers, node outputs (subgraphs included)."""
    names = {v.name for v in graph.inputs if v.name}
    if isinstance(graph, ir.Graph):
        names.update(graph.initializers)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names.update(out.name for out in node.outputs if out.name)
        for sub in subgraphs_of(node):
            names.update(v.name for v in [*sub.inputs, *sub.initializers.values()] if v.name)
    return names


class FreshNames:
    """Names for what a rewrite adds: ``base`` if it is free, else ``base_1``, ``base_2``, ...

    Free: no value of ``graph`` had it when this was made (:func:`graph_names`), nor
    ``taken``, and it was not handed out before. Make one per rewrite of a graph.
    """

    def __init__(self, graph: ir.Graph | ir.Function | None = None, *, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken) | (graph_names(graph) if graph is not None else set())

    def __call__(self, base: str) -> str:
        name, n = base, 1
        while name in self._taken:
            name, n = f"{base}_{n}", n + 1
        self._taken.add(name)
        return name
