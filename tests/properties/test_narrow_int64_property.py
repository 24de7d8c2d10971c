"""Property: narrow_int64 never changes what a graph computes.

Random int64 index arithmetic (tests/support/random_graphs.py: shapes, ranges, grids,
argmax, constants sometimes beyond int32, read by Gather/GatherElements and Casts): the
pass narrows the regions it can prove fit int32 (every region, however small: min_bytes=0)
and leaves the rest. Before and after run in onnxruntime on the same inputs and give
bit-identical outputs; the result is a valid model.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
from hypothesis import event, given

from onnxsmith.analysis.intervals import Bounds
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.narrow_int64 import NarrowInt64Pass, values_to_evaluate
from onnxsmith.probes.evaluate import evaluate_min_max
from tests.support.check import assert_same_outputs, run_in_memory
from tests.support.random_graphs import PROPERTY, index_graphs


@PROPERTY
@given(case=index_graphs())
def test_narrow_int64_keeps_every_output_bit_identical(case):
    model = ir.serde.deserialize_model(case.model)
    infer_types(model)
    evaluated = evaluate_min_max(model, values_to_evaluate(model, min_bytes=0))  # as shrink does
    narrow = NarrowInt64Pass(min_bytes=0, evaluated=evaluated)(model)
    event(f"regions narrowed: {min(sum(r.narrowed for r in narrow.reports), 3)} of {min(len(narrow.reports), 3)}")
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    assert_same_outputs(case.model, after, case.feeds)


@PROPERTY
@given(case=index_graphs())
def test_the_bounds_narrowing_relies_on_hold_for_the_values_computed(case):
    """Every int64 value's static interval (analysis/intervals.py, narrow_int64's proof) contains
    the values onnxruntime computes: an interval too tight is caught even where narrowing the
    region would happen not to overflow."""
    model = ir.serde.deserialize_model(case.model)
    infer_types(model)
    bounds = Bounds()
    claimed = {}
    for node in model.graph:
        for value in node.outputs:
            if value.dtype == ir.DataType.INT64 and bounds.of(value) is not None:
                claimed[value.name] = bounds.of(value)
    event(f"int64 values bounded: {min(len(claimed), 8)}")
    exposed = onnx.ModelProto()
    exposed.CopyFrom(case.model)
    exposed.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, None)
        for name in claimed
        if name not in {o.name for o in case.model.graph.output}
    )
    for outputs in run_in_memory(exposed, case.feeds):
        for name, (low, high) in claimed.items():
            values = outputs[name]
            if values.size:
                assert low <= values.min() and values.max() <= high, (
                    f"'{name}' holds {values.min()}..{values.max()}, its bounds say {low}..{high}"
                )
