"""Evaluating parts of a graph with onnxruntime, for passes that take the results as data.

* :func:`evaluate_shapes`: the shape arithmetic :class:`~onnxsmith.passes.fold_shapes.FoldShapesPass`
  folds, at the base sizes of the symbolic input dims and with each one changed;
* :func:`evaluate_min_max`: min and max of int64 values computed from constants, for
  :class:`~onnxsmith.passes.narrow_int64.NarrowInt64Pass`.

The passes never run a model themselves: a transform calls these, on the model as it is
right before the pass, and hands the pass what came out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import onnx_ir as ir

from onnxsmith.core.errors import InputError
from onnxsmith.passes.fold_shapes import DEFAULT_KEEP_OPS, ShapeRuns, shape_probe, shape_values
from onnxsmith.passes.name_dims import varied
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import input_specs, random_inputs


def evaluate_shapes(
    model: ir.Model,
    dims: dict[str, int],
    *,
    feeds: dict[str, np.ndarray] | None = None,
    keep_ops: Iterable[str] = DEFAULT_KEEP_OPS,
    progress: Callable[[str], None] | None = None,
) -> ShapeRuns:
    """The static values of ``model`` (:func:`~onnxsmith.passes.fold_shapes.shape_values`) at several sizes.

    ``dims``: every symbolic input dim that stays dynamic, with the size to evaluate it at;
    the first run is at those sizes, then one per dim with that dim changed. ``feeds``:
    inputs at those sizes, when values matter (a sample rate, valid token ids); the other
    sizes are made from them by repeating them. Default: random inputs. A model that does
    not run at a changed size gives no runs and the reason (nothing folds).
    """
    values = shape_values(model.graph, keep_ops)
    if not values:
        return ShapeRuns()
    if progress:
        progress(f"evaluating {len(values)} shape computations")
    base = dict(dims)
    assignments = [base] + [{**base, name: varied(base[name])} for name in sorted(base)]
    try:
        return ShapeRuns(_run_at_sizes(model, values, assignments, feeds))
    except InputError as err:
        return ShapeRuns(skipped=err.problem)


def _run_at_sizes(
    model: ir.Model, values: list[ir.Value], assignments: list[dict[str, int]], feeds: dict[str, np.ndarray] | None
) -> list[dict[str, np.ndarray]]:
    """Each value's array for each assignment of the symbolic dims, computed by onnxruntime.

    A Reshape whose target is among ``values`` also reports the shapes of its data and
    its result (:func:`shape_probe`): the constant target is rebuilt from them.
    """
    graph = model.graph
    original_outputs = list(graph.outputs)
    probes = []
    for value in values:
        for user, index in value.uses():
            if user.op_type == "Reshape" and user.domain in ("", "ai.onnx") and index == 1 and user.graph is graph:
                for side, probed in (("out", user.outputs[0]), ("in", user.inputs[0])):
                    probe = ir.node("Shape", [probed], num_outputs=1)
                    probe.outputs[0].name = shape_probe(user, side)
                    probes.append(probe)
    graph.extend(probes)
    graph.outputs.extend(values)
    graph.outputs.extend(p.outputs[0] for p in probes)
    try:
        # A size the model cannot run at is an answer (nothing folds), not an error to log.
        session = runner.open_session(model, options=_quiet_session(), label="shape evaluation")
    finally:
        graph.outputs.clear()
        graph.outputs.extend(original_outputs)
        graph.remove(probes, safe=True)
    names = [v.name for v in values] + [p.outputs[0].name for p in probes]
    return [runner.run(session, _inputs(model, dims, feeds), names) for dims in assignments]


def _inputs(model: ir.Model, dims: dict[str, int], feeds: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Inputs with the symbolic dims at ``dims``: ``feeds`` repeated (or cut) to those sizes, else random."""
    if feeds is None:
        return random_inputs(model, dims=dims)
    resized = {}
    for spec in input_specs(model):
        array = feeds[spec.name]
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, str) and dim in dims and axis < array.ndim and array.shape[axis] != dims[dim]:
                array = np.take(array, np.arange(dims[dim]) % max(array.shape[axis], 1), axis=axis)
        resized[spec.name] = array
    return resized


def _quiet_session():
    options = runner.session_options()
    options.log_severity_level = 4
    return options


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
