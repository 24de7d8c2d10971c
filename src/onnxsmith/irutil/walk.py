"""Walking a model: every node (subgraphs included), every constant and its value."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir


def all_nodes(model_or_graph: ir.Model | ir.Graph) -> Iterator[ir.Node]:
    """Every node, recursing into If/Loop/Scan subgraphs (parents before their subgraphs)."""
    graph = model_or_graph.graph if isinstance(model_or_graph, ir.Model) else model_or_graph
    yield from ir.traversal.RecursiveGraphIterator(graph)


def reachable(values: Iterable[ir.Value], step: Callable[[ir.Value], Iterable[ir.Value]]) -> set[ir.Value]:
    """``values`` and every value reached from them by repeating ``step`` (a value's next ones)."""
    return set(visit(values, step))


def visit(values: Iterable[ir.Value], step: Callable[[ir.Value], Iterable[ir.Value]]) -> Iterator[ir.Value]:
    """What :func:`reachable` reaches, each value once, depth first, lazily: ``step`` is taken from a
    value only when the next one is asked for, so a caller that has its answer ends the walk."""
    seen: set[ir.Value] = set()
    pending = list(values)
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        yield value
        pending.extend(step(value))


def computing_model(model: ir.Model, outputs: list[ir.Value]) -> ir.Model:
    """The part of ``model`` that computes ``outputs`` from its graph inputs, those as its outputs.

    Shares tensors with ``model`` (nothing is read; its nodes are put in topological order);
    the graph inputs are all kept so the same feeds fit.
    """
    graph = model.graph
    graph.sort()  # extraction copies nodes in graph order, which must be topological
    inputs = [v for v in graph.inputs if not v.is_initializer()]
    piece = ir.convenience.extract(graph, inputs=inputs, outputs=outputs)
    return ir.Model(
        piece, ir_version=model.ir_version, functions=list(model.functions.values()), producer_name=model.producer_name
    )


def outputs_no_input_reaches(model: ir.Model) -> set[str]:
    """The graph outputs computed from constants alone: no graph input reaches them (a node whose subgraph reads a
    reached value counts as reached)."""
    owner: dict[ir.Node, ir.Node] = {}  # a node inside an If/Loop/Scan body -> the top-level node holding it
    for node in model.graph:
        for sub in subgraphs_of(node):
            for inner in ir.traversal.RecursiveGraphIterator(sub):
                owner[inner] = node

    def step(value: ir.Value) -> Iterator[ir.Value]:
        for user, _ in value.uses():
            yield from owner.get(user, user).outputs

    reached = reachable(model.graph.inputs, step)
    return {value.name for value in model.graph.outputs if value not in reached and value.name is not None}


def subgraphs_of(node: ir.Node) -> list[ir.Graph]:
    """The graphs a node holds in its attributes (If branches, Loop and Scan bodies)."""
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.value)
    return graphs


def captured(graph: ir.Graph) -> list[ir.Value]:
    """Values a subgraph (and its own subgraphs) reads from outside itself, in reading order."""
    own = set(graph.inputs) | set(graph.initializers.values())
    reads: list[ir.Value] = []
    for node in graph:
        own.update(node.outputs)
        reads.extend(v for v in node.inputs if v is not None)
        for sub in subgraphs_of(node):
            reads.extend(captured(sub))
    return [v for v in reads if v not in own]


@dataclass
class ConstantTensor:
    """A weight, wherever the exporter put it."""

    value: ir.Value
    tensor: ir.TensorProtocol
    node: ir.Node | None  # the Constant node holding it, None for an initializer

    @property
    def kind(self) -> str:
        return "initializer" if self.node is None else "Constant node"


def constant_tensors(model: ir.Model) -> Iterator[ConstantTensor]:
    """Initializers and Constant-node tensors of every graph (PP-OCR keeps all its weights in Constants)."""
    for graph in model.graphs():
        yield from graph_constants(graph)


def graph_constants(graph: ir.Graph) -> Iterator[ConstantTensor]:
    """Initializers and Constant-node tensors of one graph."""
    for value in graph.initializers.values():
        if value.const_value is not None:
            yield ConstantTensor(value, value.const_value, None)
    for node in graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            attr = node.attributes.get("value")
            if attr is not None and attr.type == ir.AttributeType.TENSOR:
                yield ConstantTensor(node.outputs[0], attr.value, node)


def rewritable_constants(graph: ir.Graph) -> list[ir.Value]:
    """The graph's constants a pass may replace or re-store: not graph inputs (a user may feed them)
    or outputs (their names and types are the model's interface)."""
    return [c.value for c in graph_constants(graph) if not c.value.is_graph_input() and not c.value.is_graph_output()]


def const_tensor(value: ir.Value) -> ir.TensorProtocol:
    """The tensor of a value known to be a constant (one of :func:`rewritable_constants`, an initializer)."""
    tensor = ir.convenience.get_const_tensor(value)
    assert tensor is not None, f"'{value.name}' is not a constant"
    return tensor


def const_array(value: ir.Value | None) -> Any:
    """The numpy value of a constant (initializer or Constant node output), else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def constant(value: ir.Value | None) -> np.ndarray | None:
    """The array of a constant operand (initializer or Constant node), else None."""
    if value is None or value.is_graph_input():
        return None
    array: np.ndarray | None = const_array(value)
    return array
