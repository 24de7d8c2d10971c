"""Evaluating parts of a graph with onnxruntime, for passes that take the results as data.

* :func:`evaluate_constants`: the constants :class:`~onnxsmith.passes.fold_shapes.FoldShapesPass`
  folds whose values the symbolic-shape engine does not hold (a RoPE table built from a fixed
  image size), computed once from the constants and shape values behind them;
* :func:`evaluate_min_max`: min and max of int64 values computed from constants, for
  :class:`~onnxsmith.passes.narrow_int64.NarrowInt64Pass`.

The passes never run a model themselves: a transform calls these, on the model as it is
right before the pass, and hands the pass what came out. Neither runs the model on inputs:
what is evaluated reads no graph input, so it is the same at every input size.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.core.errors import InputError
from onnxsmith.passes.fold_shapes import ConstantsToEvaluate, EvaluatedConstants
from onnxsmith.runtime import runner


def evaluate_constants(model: ir.Model, request: ConstantsToEvaluate) -> EvaluatedConstants:
    """The values of ``request.values``: the part of the graph between ``request.given`` (fed with their
    elements) and them, run once. A part onnxruntime cannot run gives no values and the reason."""
    if not request.values:
        return EvaluatedConstants()
    model.graph.sort()  # extraction copies nodes in graph order, which must be topological
    piece = ir.convenience.extract(model.graph, inputs=list(request.given), outputs=request.values)
    probe = ir.Model(piece, ir_version=model.ir_version, functions=list(model.functions.values()))
    feeds = {value.name: array for value, array in request.given.items()}
    try:
        session = runner.open_session(probe, label="shape computations")
        results = runner.run(session, feeds, [v.name for v in request.values], label="shape computations")
    except InputError as err:
        return EvaluatedConstants(skipped=err.problem)
    return EvaluatedConstants(results)


def evaluate_min_max(model: ir.Model, values: list[ir.Value]) -> dict[str, tuple[int, int]]:
    """(min, max) of each of ``values`` (computed from constants only), by name: the subgraph behind them
    runs once and only min and max come out (:func:`onnxsmith.passes.narrow_int64.values_to_evaluate`)."""
    if not values:
        return {}
    model.graph.sort()  # extraction copies nodes in graph order, which must be topological
    piece = ir.convenience.extract(model.graph, inputs=[], outputs=values)
    outputs = []
    for i, value in enumerate(piece.outputs):
        for op in ("ReduceMin", "ReduceMax"):
            node = ir.node(op, [value], attributes={"keepdims": 0}, num_outputs=1)
            node.outputs[0].name = f"onnxsmith::{op}_{i}"
            piece.append(node)
            outputs.append(node.outputs[0])
    piece.outputs.clear()
    piece.outputs.extend(outputs)
    probe = ir.Model(piece, ir_version=model.ir_version, functions=list(model.functions.values()))
    session = runner.open_session(probe, label="an int64 index chain")
    results = runner.run(session, {})
    return {
        value.name: (int(results[f"onnxsmith::ReduceMin_{i}"]), int(results[f"onnxsmith::ReduceMax_{i}"]))
        for i, value in enumerate(values)
    }
