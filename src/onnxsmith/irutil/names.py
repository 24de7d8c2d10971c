"""Names: how a node is named in messages, and fresh names for the values and weights a rewrite makes."""

from __future__ import annotations

import onnx_ir as ir


def node_label(node: ir.Node) -> str:
    """How a node is named in messages: its name, else its op and first output."""
    if node.name:
        return node.name
    first = node.outputs[0].name if node.outputs else "?"
    return f"{node.op_type}->{first}"


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``, which records it."""
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def fresh_name(graph: ir.Graph | ir.Function, base: str, taken: set[str]) -> str:
    """A name no initializer of ``graph`` has yet; ``taken`` collects the names handed out in one run."""
    existing = graph.initializers if isinstance(graph, ir.Graph) else {}
    name, k = base, 1
    while name in existing or name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name
