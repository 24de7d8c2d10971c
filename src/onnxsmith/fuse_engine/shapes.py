"""Step 1 of fuse, the shapes: input dims named (or fixed), shape arithmetic folded to constants, dims named.

After it every Reshape has a constant target with -1 for the batch, a fixed-size image input needs no
Shape/Gather/Concat/Expand at run time, and inferred dims carry the names of the input dims they follow
(passes/name_dims.py), so the rules can compare them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import LiftConstantsToInitializersPass, RemoveUnusedNodesPass
from onnxscript.rewriter import RewritePass

from onnxsmith.fuse_engine.report import unknown_static_dims
from onnxsmith.passes.fold_shapes import FoldShapesPass, FoldShapesResult, constants_to_evaluate
from onnxsmith.passes.name_dims import NameDimsPass, name_input_dims
from onnxsmith.probes.evaluate import evaluate_constants
from onnxsmith.rules import noop_reshape
from onnxsmith.rules.apply import RuleOutcome, apply_rules, bypass_identities
from onnxsmith.rules.cleanup import cleanup_rules
from onnxsmith.runtime.inputs import input_specs


def input_dims(model: ir.Model, feeds: dict[str, np.ndarray], static: Sequence[str] = ()) -> dict[str, int]:
    """Each symbolic input dim (unnamed ones get named) with its size in ``feeds``; ``static`` ones become fixed."""
    names = name_input_dims(model)
    unknown = sorted(set(static) - set(names))
    if unknown:
        raise unknown_static_dims(unknown, names)
    sizes: dict[str, int] = {}
    for value, spec in zip(
        [v for v in model.graph.inputs if v.name not in model.graph.initializers], input_specs(model)
    ):
        shape = np.shape(feeds[spec.name]) if spec.name in feeds else ()
        for axis, dim in enumerate(value.shape or ()):
            if not isinstance(dim, int) and axis < len(shape):
                sizes.setdefault(dim.value, int(shape[axis]))
    for name in static:
        for value in model.graph.inputs:
            if value.shape is not None:
                value.shape = ir.Shape(
                    [sizes[name] if not isinstance(d, int) and d.value == name else d for d in value.shape]
                )
    return {name: size for name, size in sizes.items() if name not in static}


def prepare_shapes(model: ir.Model, *, progress=None) -> tuple[FoldShapesResult, RuleOutcome]:
    """Step 1: shape arithmetic folded, Constants lifted, no-op Casts and Reshapes gone, dims named."""
    request = constants_to_evaluate(model)
    if progress and request.values:
        progress(f"evaluating {len(request.values)} constant shape computations")
    fold = FoldShapesPass(evaluate_constants(model, request))(model)
    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    RewritePass(cleanup_rules)(model)
    RemoveUnusedNodesPass()(model)
    NameDimsPass()(model)
    noop = apply_rules(model, "no-op Reshape", noop_reshape.noop_reshape_rules)
    bypass_identities(model.graph)
    return fold, noop
