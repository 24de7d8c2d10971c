"""Casts a rewrite inserts, and where new nodes go: right after what makes the value they read."""

from __future__ import annotations

import onnx_ir as ir


def cast_node(value: ir.Value, to: ir.DataType, *, name: str, node_name: str | None = None) -> ir.Node:
    """A Cast of ``value`` to ``to`` (not yet in a graph) whose output is ``name``, typed, with ``value``'s shape."""
    node = ir.node("Cast", [value], attributes={"to": int(to)}, num_outputs=1, name=node_name)
    out = node.outputs[0]
    out.name = name
    out.dtype = to
    out.shape = value.shape
    return node


def insert_after_producer(graph: ir.Graph, value: ir.Value, nodes: ir.Node | list[ir.Node]) -> None:
    """Put ``nodes`` right after ``value``'s producer, or first in ``graph`` for an input, an initializer
    or a value of an outer graph: they run as soon as the value exists."""
    producer = value.producer()
    if producer is not None and producer.graph is graph:
        graph.insert_after(producer, nodes)
    elif len(graph):
        graph.insert_before(next(iter(graph)), nodes)
    else:
        graph.extend([nodes] if isinstance(nodes, ir.Node) else nodes)
