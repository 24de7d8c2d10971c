"""After the gate refused an fp16 candidate: what to keep fp32, measured (precision/repair.py), and the
candidate made again (release/variant.py). A deliberately broken variant is still refused."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.core.errors import GateFailed
from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.precision.repair import MAX_GROUPS, TARGET, choose_exact, split
from onnxsmith.release.variant import produce_variant
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.transforms.fp16 import Options as Fp16Options
from onnxsmith.transforms.fuse import Fuse


def cancelling(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 64] -> (x + 1000) - 1000 -> MatMul -> Relu -> MatMul: fp16 holds x + 1000 to 0.5, so the
    difference loses x's low bits (cancellation: nothing overflows, nothing underflows, ranges see nothing)."""
    rng = np.random.default_rng(seed)
    weights = {
        "offset": np.array(1000, np.float32),
        "w1": (rng.standard_normal((64, 64)) / 8).astype(np.float32),
        "w2": (rng.standard_normal((64, 16)) / 8).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "offset"], ["shifted"]),
            helper.make_node("Sub", ["shifted", "offset"], ["back"]),
            helper.make_node("MatMul", ["back", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "cancelling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(a, name) for name, a in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(path, samples: int = 2):
    model = load_model(path)
    return [random_inputs(model, seed=s) for s in range(samples)]


def _dtypes(path) -> dict[str, ir.DataType]:
    model = ir.load(path)
    infer_types(model)  # fuse does not write inferred types
    return {v.name: v.dtype for node in model.graph for v in node.outputs}


# ---------------------------------------------------------------- the choice, on numbers


def test_the_fewest_groups_that_bring_the_rest_within_the_target_are_kept():
    # Errors add in quadrature: groups 2 and 5 carry most of it.
    share = {0: 0.1, 1: 0.2, 2: 1.5, 3: 0.1, 4: 0.3, 5: 0.9, 6: 0.05, 7: 0.1}
    groups = [[f"t{g}"] for g in share]
    calls = []

    def severity(rounded: set[int]) -> float:
        calls.append(set(rounded))
        return float(np.sqrt(sum(share[g] ** 2 for g in rounded)))

    choice = choose_exact(groups, severity)
    assert sorted(choice.kept) == [2, 5] and choice.tensors == ["t2", "t5"]
    assert choice.after <= TARGET < 1 < choice.before and choice.repaired
    assert choice.runs == len(calls) <= 1 + len(groups) + 3  # everything, each alone, a binary search


def test_nothing_is_kept_when_rounding_everything_measures_within_the_bounds():
    choice = choose_exact([["a"], ["b"]], lambda rounded: 0.4 * len(rounded))
    assert choice.kept == [] and choice.runs == 1 and not choice.repaired


def test_nothing_is_kept_when_only_keeping_every_group_exact_would_pass():
    """That would be the source again, not an fp16 variant: the refusal stands (an --atol of 1e-9, say)."""
    choice = choose_exact([["a"], ["b"], ["c"]], lambda rounded: 2.0 if rounded else 0.0)
    assert choice.everything and choice.kept == [] and not choice.repaired


def test_tensors_are_split_into_at_most_max_groups_in_order():
    tensors = [f"t{i}" for i in range(100)]
    groups = split(tensors)
    assert len(groups) == MAX_GROUPS and [t for g in groups for t in g] == tensors
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert split(["a", "b"]) == [["a"], ["b"]]


# ---------------------------------------------------------------- a model whose rounding the ranges do not see


@pytest.mark.parametrize("command", ["fp16", "fuse"])
def test_a_refused_fp16_candidate_is_made_again_with_what_the_refusal_comes_from_fp32(save_proto, tmp_path, command):
    source = save_proto(cancelling())
    step = ("fp16", Fp16Options()) if command == "fp16" else ("fuse", Fuse.Options(precision="fp16"))
    result = produce_variant(source, tmp_path / "v.onnx", [step], feeds=_feeds(source))
    assert result.comparison.passed
    assert min(o.cosine for o in result.comparison.outputs) >= 0.9999
    (line,) = [line for line in result.headline if "kept fp32 after verification" in line]
    assert "1 of " in line and "measured runs" in line
    dtypes = _dtypes(tmp_path / "v.onnx")
    assert dtypes["shifted"] == ir.DataType.FLOAT  # the sum whose low bits the difference needs
    assert dtypes["h"] == dtypes["r"] == ir.DataType.FLOAT16  # the rest computes in fp16


def test_without_a_refusal_nothing_is_measured_or_kept(save_proto, tmp_path):
    from tests.support.models import mlp

    source = save_proto(mlp())
    result = produce_variant(source, tmp_path / "v.onnx", [("fp16", Fp16Options())], feeds=_feeds(source))
    assert not any("after verification" in line for line in result.headline)


def test_a_broken_variant_is_still_refused_after_the_repair(save_proto, tmp_path):
    """fp16 then a conversion that breaks a weight: fp16's own rounding measures within the bounds, so
    nothing is kept for it, and the chain is refused; nothing is written."""
    import tests.test_gate as gate_tests  # registers the test-only defect transform

    source = save_proto(cancelling())
    steps = [("fp16", Fp16Options()), ("test-only-defect", gate_tests.DefectOptions("flipped sign", "w2"))]
    with pytest.raises(GateFailed, match="variant not written"):
        produce_variant(source, tmp_path / "v.onnx", steps, feeds=_feeds(source))
    assert not (tmp_path / "v.onnx").exists()
