"""Constant folding that may not grow the model: what would add bytes to the file stays computed.

Folding a node whose inputs are all constants usually shrinks a graph. But an
Expand, Tile or ConstantOfShape over constants *makes* data: HITNet's index grid
(Expand -> Tile -> Tile) folded into a 1.8 GB int64 initializer and pushed the
file past protobuf's 2 GB limit; a Cast of an int8 weight to float stores it four
times over (MiniLM int8: 1.5x the file); a Transpose of a weight that other nodes
also read stores it twice. A node is folded only when the shared rule of
:mod:`onnxsmith.analysis.fold_cost` allows it: the constant it leaves behind adds at
most ``max_growth`` bytes (its output, less the constants that die with it; default
a few KB, enough for shape arithmetic), and its inputs are small enough to evaluate
in memory. What is refused stays in the graph and runs at load time.

The folding itself is onnxscript's (``optimizer.fold_constants``: onnx's reference
evaluator, its partial evaluators for shape arithmetic); this pass decides which
nodes it may fold, before anything is evaluated, from the output shapes that its
incremental shape inference has just computed. The partial evaluators are not asked:
a Shape or Size of a statically known shape (and a Gather from one) becomes a
constant of a few int64s whatever the limit, which is what makes shapes static.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass
from onnxscript.optimizer import fold_constants_ir

from onnxsmith.analysis.fold_cost import SMALL_FOLD, fold_cost, fold_refusal
from onnxsmith.irutil.names import node_label

DEFAULT_MAX_GROWTH = SMALL_FOLD
#: Nodes whose constant inputs total more than this are not evaluated (memory, time).
DEFAULT_MAX_INPUT_BYTES = 64 * 2**20
#: Kept as they are: folding them would erase quantization parameters.
_KEEP = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


@dataclass
class RefusedFold:
    node: str
    op_type: str
    output_bytes: int | None  # None: not known before evaluating
    growth: int | None
    reason: str


@dataclass
class GuardedFoldResult(ir.passes.PassResult):
    """What :class:`FoldConstantsGuardedPass` did: what it folded, and what it refused and why."""

    refused: list[RefusedFold] = field(default_factory=list)
    folded: int = 0


class FoldConstantsGuardedPass(ir.passes.InPlacePass):
    """Fold constant subexpressions whose results grow the model by at most ``max_growth`` bytes each."""

    def __init__(self, max_growth: int = DEFAULT_MAX_GROWTH, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> None:
        super().__init__()
        self.max_growth = max_growth
        self.max_input_bytes = max_input_bytes

    def call(self, model: ir.Model) -> GuardedFoldResult:
        self._result = GuardedFoldResult(model, False)  # filled while the pass runs
        nodes_before = sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))
        result = fold_constants_ir(
            model,
            onnx_shape_inference=True,
            # The limits are this pass's to apply (in should_fold, before evaluation).
            input_size_limit=2**62,
            output_size_limit=2**62,
            should_fold=self._should_fold,
        )
        RemoveUnusedNodesPass()(model)
        nodes_after = sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))
        self._result.modified = result.modified or nodes_after != nodes_before
        return self._result

    def _should_fold(self, node: ir.Node) -> bool:
        if node.op_type in _KEEP:
            return False
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
            return False  # never a copy: onnxscript's partial evaluator has its readers read the input
        inputs = [v for v in node.inputs if v is not None]
        input_bytes = sum(_const_bytes(v) for v in inputs)
        if input_bytes > self.max_input_bytes:
            return self._refuse(
                node, None, None, f"its constant inputs take {input_bytes} bytes; not evaluated in memory"
            )
        output_bytes = 0
        for out in node.outputs:
            size = _static_nbytes(out)
            if size is None:
                return self._refuse(node, None, None, "its output size is unknown before evaluating it")
            output_bytes += size
        cost = fold_cost(node.outputs, output_bytes)
        refusal = fold_refusal(cost, self.max_growth)
        if refusal is not None:
            return self._refuse(node, output_bytes, cost.growth, refusal)
        self._result.folded += 1
        return True

    def _refuse(self, node: ir.Node, output_bytes: int | None, growth: int | None, reason: str) -> bool:
        self._result.refused.append(RefusedFold(node_label(node), node.op_type, output_bytes, growth, reason))
        return False


def _const_bytes(value: ir.Value) -> int:
    tensor = ir.convenience.get_const_tensor(value)
    return 0 if tensor is None else tensor.nbytes


def _static_nbytes(value: ir.Value) -> int | None:
    if value.dtype is None or value.shape is None:
        return None
    dims = [d for d in value.shape if isinstance(d, int)]
    if len(dims) != len(value.shape):  # a symbolic dim
        return None
    return math.ceil(math.prod(dims) * value.dtype.itemsize)
