"""Constant operands inside rules: reading them, and naming the new weights a rewrite makes."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.graph import const_array


def constant(value: ir.Value | None) -> np.ndarray | None:
    """The array of a constant operand (initializer or Constant node), else None."""
    if value is None or value.is_graph_input():
        return None
    return const_array(value)


def fresh_name(graph: ir.Graph | ir.Function, base: str, taken: set[str]) -> str:
    """A name no initializer of ``graph`` has yet; ``taken`` collects the names handed out in one run."""
    existing = graph.initializers if isinstance(graph, ir.Graph) else {}
    name, k = base, 1
    while name in existing or name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name
