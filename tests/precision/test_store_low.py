"""Weights stored fp16 although their readers compute in fp32, widened by a Cast as the model loads.

A node kept fp32 for its tensors (tiny ones, by the cost rule; or measured out of fp16's range)
computes in fp32; its weights are still rounded once to fp16 when rounding them is measured not to
matter, and onnxruntime folds the Cast at load: the file shrinks, the arithmetic stays fp32.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.measurements import TensorRange
from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.precision.plan import KEPT_FOR_TENSORS, STORE_LOW_BUDGET, Settings, check_store_low, decide
from onnxsmith.release.variant import produce_variant
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.transforms.fp16 import Options
from onnxsmith.transforms.shrink import Shrink
from tests.support.check import assert_pass_preserves_outputs

F16 = ir.DataType.FLOAT16
F32 = ir.DataType.FLOAT


def _squeeze_excite() -> onnx.ModelProto:
    """MobileNetV3's squeeze-excite block: a 64-channel conv body (300 KB of weights) gated by
    GlobalAveragePool -> Conv(se1) -> Relu -> Conv(se2) -> HardSigmoid (2 KB weights each, on 64 and 8
    elements)."""
    rng = np.random.default_rng(3)
    c, r = 64, 8
    inits = [
        numpy_helper.from_array((rng.standard_normal((c, 3, 3, 3)) / 5).astype(np.float32), "stem"),
        numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / 24).astype(np.float32), "body"),
        numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / 24).astype(np.float32), "body2"),
        numpy_helper.from_array((rng.standard_normal((r, c, 1, 1)) / 8).astype(np.float32), "se1"),
        numpy_helper.from_array((rng.standard_normal((c, r, 1, 1)) / 3).astype(np.float32), "se2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "stem"], ["s"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["s"], ["sr"], name="stem_relu"),
        helper.make_node("Conv", ["sr", "body"], ["b1"], name="body", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b1", "body2"], ["b"], name="body2", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["b"], ["pooled"], name="pool"),
        helper.make_node("Conv", ["pooled", "se1"], ["e1"], name="se1"),
        helper.make_node("Relu", ["e1"], ["e1r"], name="se_relu"),
        helper.make_node("Conv", ["e1r", "se2"], ["e2"], name="se2"),
        helper.make_node("HardSigmoid", ["e2"], ["gate"], name="gate"),
        helper.make_node("Mul", ["b", "gate"], ["y"], name="excite"),
    ]
    graph = helper.make_graph(
        nodes,
        "se",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 32, 32])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _widened(model: ir.Model, node_name: str) -> tuple[ir.DataType, ir.DataType]:
    """(what the node reads its weight as, how the weight is stored) for the weight input of ``node_name``."""
    node = next(n for n in model.graph if n.name == node_name)
    read = node.inputs[1]
    producer = read.producer()
    stored = producer.inputs[0] if producer is not None and producer.op_type == "Cast" else read
    return read.dtype, stored.dtype


def test_squeeze_excite_weights_are_stored_fp16_and_computed_fp32(save_proto, tmp_path):
    source = save_proto(_squeeze_excite())
    feeds = [random_inputs(load_model(source), seed=s) for s in range(2)]
    out = tmp_path / "fp16.onnx"
    result = produce_variant(source, out, [("fp16", Options())], feeds=feeds)
    variant = load_model(out)
    infer_types(variant)
    # The gate Convs stay fp32 (the cost rule) and read their weights widened from fp16 by a Cast.
    assert _widened(variant, "se1") == (F32, F16) and _widened(variant, "se2") == (F32, F16)
    assert next(n for n in variant.graph if n.name == "se1").outputs[0].dtype == F32
    assert _widened(variant, "body") == (F16, F16)
    notes = result.reports[0].notes
    assert any(n.startswith(f"2 {KEPT_FOR_TENSORS} stored fp16, widened by a Cast at load") for n in notes), notes
    islands = result.reports[0].tables["fp32 islands"]
    assert [row["weights"] for row in islands] == ["fp16 2 KB (Cast at load)"], islands  # 4 KB stored as 2
    # Every weight in fp16: the file is half the source's, and computes what the source does.
    assert out.stat().st_size <= 0.51 * source.stat().st_size
    assert_pass_preserves_outputs(source, out, tmp_path, feeds=feeds, atol=2e-2, rtol=2e-2)
    # shrink folds nothing back: Cast(fp16 weight) folded would store the weight fp32 again.
    shrunk = tmp_path / "shrunk.onnx"
    produce_variant(out, shrunk, [("shrink", Shrink.Options())], feeds=feeds)
    shrunk_model = load_model(shrunk)
    infer_types(shrunk_model)
    assert _widened(shrunk_model, "se1") == (F32, F16)
    assert shrunk.stat().st_size <= out.stat().st_size
    # Without the cost rule the same nodes compute in fp16: the fp32 arithmetic is what the Cast buys.
    plain = tmp_path / "plain.onnx"
    produce_variant(source, plain, [("fp16", Options(small_fp32=False))], feeds=feeds)
    assert _widened(load_model(plain), "se1") == (F16, F16)


# ------------------------------------------------------------------ the decisions, on data


def _r(name: str, absmax: float, elements: int, tiny: float = 0.0) -> TensorRange:
    return TensorRange(name, "", "", 0, absmax, 0, tiny, "FLOAT", elements)


def _se_ranges(*tiny: str) -> list[TensorRange]:
    ranges = [
        _r("x", 3.0, 3072),
        _r("s", 3.0, 65536),
        _r("sr", 3.0, 65536),
        _r("b1", 3.0, 65536),
        _r("b", 3.0, 65536),
        _r("pooled", 1.0, 64),
        _r("e1", 1.0, 8),
        _r("e1r", 1.0, 8),
        _r("e2", 1.0, 64),
        _r("gate", 1.0, 64),
        _r("y", 3.0, 65536),
    ]
    return [_r(r.name, r.absmax, r.elements, tiny=0.9) if r.name in tiny else r for r in ranges]


def _se_model() -> ir.Model:
    model = ir.serde.deserialize_model(_squeeze_excite())
    infer_types(model)
    return model


def test_weights_of_nodes_kept_for_their_tensors_may_be_stored_low():
    plan = decide(_se_model(), _se_ranges(), Settings())
    (group,) = plan.store_low_groups
    assert group.compared and set(group.weights) == {"se1", "se2"}
    assert "Conv 'se1' (small:" in group.weights["se1"]
    # Measured out of range (underflowing) instead of small: the same, for the nodes that write or read it.
    plan = decide(_se_model(), _se_ranges("e1", "e2"), Settings(small_fp32=False))
    (group,) = plan.store_low_groups
    assert set(group.weights) == {"se1", "se2"} and "writes 'e2'" in group.weights["se2"]
    # One 2 KB weight is under 1 % of the model's: it could not change the file's size, nothing is measured.
    plan = decide(_se_model(), _se_ranges("e2"), Settings(small_fp32=False))
    assert plan.store_low_groups == []
    # Kept by the caller (not for a tensor fp16 cannot hold): its weights stay as they are.
    plan = decide(_se_model(), _se_ranges(), Settings(small_fp32=False), keep_fp32={"e2": "asked"})
    assert plan.store_low_groups == []


def test_kept_for_tensors_weights_are_measured_against_the_weights_converted_anyway():
    reference = {"y": np.linspace(-10, 10, 50, dtype=np.float32)}
    budget = STORE_LOW_BUDGET[F16]

    def moved(share: float) -> dict[str, np.ndarray]:
        return {"y": reference["y"] + 10 * share}

    def plan_and_group():
        plan = decide(_se_model(), _se_ranges(), Settings())
        return plan, plan.store_low_groups[0]

    asked = []

    def others(share):
        def measure():
            asked.append(share)
            return moved(share)

        return measure

    plan, group = plan_and_group()
    check_store_low(plan, group, reference, moved(budget / 2), others(1.0))
    assert set(plan.store_low) == {"se1", "se2"} and not asked  # within the budget: nothing more to run
    plan, group = plan_and_group()
    check_store_low(plan, group, reference, moved(4 * budget), others(32 * budget))
    assert set(plan.store_low) == {"se1", "se2"} and "under a quarter of the" in plan.store_low_checked[0]
    plan, group = plan_and_group()
    check_store_low(plan, group, reference, moved(4 * budget), others(8 * budget))
    assert plan.store_low == {} and group.refused.startswith("rounding them to fp16 moved output 'y' by")
    assert f"converted anyway moves them by {8 * budget:.2g}" in plan.store_low_checked[0]
