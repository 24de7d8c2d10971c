"""The shrink engine: make a graph smaller without changing what it computes.

``make_shrink`` is what :class:`onnxsmith.transforms.shrink.Shrink` runs. Four passes, in this order:

1. fp64 constants read only through a Cast to float are stored as fp32
   (passes/narrow_fp64.py; first, so the folding below does not hide it);
2. constant folding that never grows the file (passes/fold_constants_guarded.py, the
   rule of analysis/fold_cost.py): a constant subexpression is folded when what it
   stores, less the constants that die with it, is at most ``max_fold_growth`` bytes
   (default 4 KB: shape arithmetic). Quantised weights stay quantised (an int8 -> float
   dequantisation would store 4x), shared weights stay shared (a Transpose of a weight
   other nodes read would store a copy), an Expand/Tile/ConstantOfShape stays computed;
3. int64 index regions whose values provably fit int32 are born int32
   (passes/narrow_int64.py);
4. identical constants are stored once (passes/dedup_constants.py).

The gate (produce_variant) demands integer outputs bit-identical and float outputs
within the one gate's fp32 bounds (verify/gate.py). ``--explain`` shows every change and why, and before/after
breakdowns from the same analysis ``inspect`` uses; the words the report shows are report.py's.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.analysis.summary import summarize
from onnxsmith.core.options import to_json
from onnxsmith.core.transform import StepReport, TransformContext
from onnxsmith.irutil.types import forget_inferred_types, infer_types, typed_values
from onnxsmith.passes.dedup_constants import DeduplicateConstantsPass
from onnxsmith.passes.fold_constants_guarded import FoldConstantsGuardedPass
from onnxsmith.passes.narrow_fp64 import NarrowFp64ConstantsPass
from onnxsmith.passes.narrow_int64 import NarrowInt64Pass, values_to_evaluate
from onnxsmith.probes.evaluate import evaluate_min_max
from onnxsmith.settings.shrink import ShrinkOptions, parse_bytes
from onnxsmith.shrink_engine.report import ShrinkRecord, describe


def make_shrink(model: ir.Model, options: ShrinkOptions, context: TransformContext, name: str = "shrink") -> StepReport:
    """Shrink ``model`` in place with the passes ``options`` turn on, then drop the nodes nothing reads; the report
    says what each pass did and left, and shows the model before and after as ``inspect`` sees it."""
    stated = typed_values(model)
    infer_types(model)  # shapes size the fold guard and the int64 regions
    before = summarize(model)
    record = _run_passes(model, options, context)
    RemoveUnusedNodesPass()(model)
    after = summarize(model)
    forget_inferred_types(model, stated)  # inferred shapes are not written: they would grow the file
    return describe(StepReport(name, to_json(options)), record, before, after)


def _run_passes(model: ir.Model, options: ShrinkOptions, context: TransformContext) -> ShrinkRecord:
    """The four passes in their order (the module's doc), each one ``options`` turns on."""
    record = ShrinkRecord()
    if options.narrow_fp64:
        record.fp64 = NarrowFp64ConstantsPass()(model)
    if options.fold:
        context.progress("shrink: folding constants (guarded)")
        record.fold = FoldConstantsGuardedPass(max_growth=parse_bytes(options.max_fold_growth))(model)
    if options.narrow_int64:
        context.progress("shrink: narrowing int64 indices")
        infer_types(model)  # folding created values; the regions need their shapes
        evaluated = evaluate_min_max(model, values_to_evaluate(model))
        record.narrow = NarrowInt64Pass(evaluated=evaluated)(model)
    if options.dedup:
        record.dedup = DeduplicateConstantsPass()(model)
    return record
