"""Properties of shrink's passes: each leaves what a graph computes as it was.

Random graphs for each (tests/support/random_graphs.py), the pass applied in memory as
``shrink`` applies it (types inferred first), both models run in onnxruntime on the same
inputs. Bit-identical outputs, except what folding computes with onnx's reference kernels
instead of onnxruntime's (float math within 1e-5); the result is a valid model.
"""

from __future__ import annotations

from collections import defaultdict

import onnx
import onnx_ir as ir
import pytest
from hypothesis import event, given

from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import constant_tensors, rewritable_constants
from onnxsmith.passes.dedup_constants import DeduplicateConstantsPass
from onnxsmith.passes.fold_constants_guarded import FoldConstantsGuardedPass
from onnxsmith.passes.narrow_fp64 import NarrowFp64ConstantsPass
from tests.support.check import assert_same_outputs
from tests.support.random_graphs import PROPERTY, double_graphs, duplicate_graphs, folding_graphs

# Comparing equal arrays with rtol divides 0 by 0 in numpy's report of the largest difference.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _applied(case, make_pass):
    model = ir.serde.deserialize_model(case.model)
    infer_types(model)
    result = make_pass()(model)
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    return result, model, after


def _stored_bytes(model: ir.Model) -> int:
    return sum(c.tensor.nbytes for c in constant_tensors(model))


@PROPERTY
@given(case=folding_graphs())
def test_guarded_folding_keeps_outputs_and_its_growth_limit(case):
    max_growth = case.options["max_growth"]
    before = _stored_bytes(ir.serde.deserialize_model(case.model))
    fold, model, after = _applied(case, lambda: FoldConstantsGuardedPass(max_growth=max_growth))
    event(f"folded {min(fold.folded, 5)}; refused {min(len(fold.refused), 2)}")
    assert_same_outputs(case.model, after, case.feeds, atol=1e-6, rtol=1e-5)
    # Each fold may add at most max_growth stored bytes; a static shape becomes a few int64s anyway.
    shapes = sum(8 * 4 for n in case.model.graph.node if n.op_type in ("Shape", "Size"))  # rank <= 4 here
    assert _stored_bytes(model) - before <= fold.folded * max_growth + shapes


@PROPERTY
@given(case=double_graphs())
def test_narrowing_fp64_constants_keeps_outputs_bit_identical(case):
    narrow, _, after = _applied(case, NarrowFp64ConstantsPass)
    event(f"narrowed {min(len(narrow.narrowed), 4)}")
    assert_same_outputs(case.model, after, case.feeds)


@PROPERTY
@given(case=duplicate_graphs())
def test_deduplication_keeps_outputs_and_leaves_no_twins(case):
    dedup, model, after = _applied(case, DeduplicateConstantsPass)
    event(f"merged {min(len(dedup.removed), 4)}")
    assert_same_outputs(case.model, after, case.feeds)
    for graph in model.graphs():
        seen = defaultdict(list)
        for value in rewritable_constants(graph):
            tensor = ir.convenience.get_const_tensor(value)
            seen[(tensor.dtype, tuple(tensor.shape), tensor.tobytes())].append(value.name)
        twins = [names for names in seen.values() if len(names) > 1]
        assert not twins, f"constants still stored twice: {twins}"
