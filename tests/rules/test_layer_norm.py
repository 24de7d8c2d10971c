"""rules/layer_norm.py: a LayerNorm written out in elementwise ops becomes LayerNormalization (issue 11 class 9)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.fuse_engine.fusions import apply_fusion
from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.release.variant import produce_variant
from onnxsmith.rules.layer_norm import layer_norm_no_beta_rules, layer_norm_rules
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.transforms.fuse import Fuse
from tests.support.fusion import assert_same_outputs, assert_untouched, fusion_trace, op_count, prepared_mlp
from tests.support.realmodels import real_model

STEP = "written-out LayerNorm -> LayerNormalization"


def _export(path, dynamo: bool) -> None:
    """Two written-out LayerNorms, the second after a residual Add (as in a transformer block)."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self, width: int = 32):
            super().__init__()
            self.g1, self.g2 = (torch.nn.Parameter(torch.rand(width) + 0.5) for _ in range(2))
            self.b1, self.b2 = (torch.nn.Parameter(0.1 * torch.randn(width)) for _ in range(2))
            self.linear = torch.nn.Linear(width, width)

        @staticmethod
        def norm(x, gamma, beta):
            mean = x.mean(-1, keepdim=True)
            variance = (x - mean).pow(2).mean(-1, keepdim=True)
            return (x - mean) / torch.sqrt(variance + 1e-5) * gamma + beta

        def forward(self, x):
            return self.norm(x + self.linear(self.norm(x, self.g1, self.b1)), self.g2, self.b2)

    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    if dynamo:
        dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("tokens")}
        torch.onnx.export(
            Block().eval(), (x,), path, dynamo=True, input_names=["x"], dynamic_shapes=(dims,), external_data=False
        )
    else:
        axes = {"x": {0: "batch", 1: "tokens"}}
        torch.onnx.export(
            Block().eval(), (x,), path, dynamo=False, opset_version=14, input_names=["x"], dynamic_axes=axes
        )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("layernorm")
    paths = {}
    for exporter in ("dynamo", "torchscript"):
        paths[exporter] = folder / f"{exporter}.onnx"
        _export(paths[exporter], dynamo=exporter == "dynamo")
    return paths


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_both_exporters_layernorms_fuse(exported, exporter, tmp_path):
    source = load_model(exported[exporter])
    assert op_count(source, "ReduceMean") == 4 and op_count(source, "LayerNormalization") == 0
    steps = fusion_trace(str(exported[exporter]))
    assert steps[STEP].outcome.matched == 2
    fused = steps[STEP].model_after()
    assert op_count(fused, "LayerNormalization") == 2 and op_count(fused, "ReduceMean") == 0
    # TorchScript wrote opset 14: LayerNormalization needs 17, so the model was converted to it.
    assert fused.opset_imports[""] == (17 if exporter == "torchscript" else source.opset_imports[""])
    assert all(len(n.inputs) == 3 for n in fused.graph if n.op_type == "LayerNormalization")  # beta taken in
    assert_same_outputs(steps[STEP].before, steps[STEP].after, tmp_path, atol=1e-5, rtol=1e-5)
    # The residual Add and the second LayerNorm then become SkipLayerNormalization.
    assert steps["Add + LayerNorm -> SkipLayerNormalization"].outcome.matched == 1


@pytest.mark.realmodel
def test_ppocr_v6_recogniser_layernorms_and_attention_fuse(tmp_path):
    """PP-OCRv6 rec (Paddle2ONNX, opset 11): 5 written-out LayerNorms (onnxruntime's optimizer fuses 4)."""
    source = real_model("ppocr_v6_rec")
    feeds = [{"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 320)).astype(np.float32)}]
    result = produce_variant(source, tmp_path / "rec.onnx", [("fuse", Fuse.Options())], feeds=feeds)
    assert result.comparison.passed
    assert result.reports[0].stats["rules"][STEP] == 5
    assert f"the model was converted from opset 11 to 17: {STEP} needs it" in result.reports[0].notes
    fused = load_model(tmp_path / "rec.onnx")
    assert fused.opset_imports[""] == 17
    # Two of the four after a residual Add become SkipLayerNormalization: the other two Adds' operands
    # have token counts that shape inference cannot prove equal (W/8 as two unknown dims).
    assert op_count(fused, "LayerNormalization") == 3 and op_count(fused, "SkipLayerNormalization") == 2
    assert op_count(fused, "MultiHeadAttention") == 2 and op_count(fused, "Sqrt") == 0
    assert (tmp_path / "rec.onnx").stat().st_size <= source.stat().st_size


def test_a_model_without_the_pattern_keeps_its_opset():
    model = prepared_mlp()
    model.opset_imports[""] = 11
    outcome = apply_fusion(model, STEP, (layer_norm_rules, layer_norm_no_beta_rules))
    assert outcome.matched == 0 and outcome.reason and model.opset_imports[""] == 11


def _written_out(axes: list[int], gamma_shape: tuple[int, ...], eps_node: bool = False) -> ir.Model:
    rng = np.random.default_rng(0)
    eps = np.array(1e-5, np.float32)
    nodes = [helper.make_node("Constant", [], ["eps"], value=numpy_helper.from_array(eps))] if eps_node else []
    nodes += [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=axes),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=axes),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(rng.random(gamma_shape).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.random(gamma_shape).astype(np.float32), "beta"),
    ]
    graph = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])],
        inits if eps_node else [*inits, numpy_helper.from_array(eps, "eps")],
    )
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    infer_types(model)
    return model


@pytest.mark.parametrize("eps_node", [False, True], ids=["initializer", "constant-node"])
def test_fuses_a_written_out_layernorm_over_the_last_axis(eps_node):
    model = _written_out([-1], (8,), eps_node=eps_node)
    assert apply_fusion(model, STEP, (layer_norm_rules, layer_norm_no_beta_rules)).matched == 1
    [node] = [node for node in model.graph if node.op_type != "Constant"]
    assert node.op_type == "LayerNormalization" and node.attributes.get_float("epsilon") == pytest.approx(1e-5)


@pytest.mark.parametrize(
    ("axes", "gamma_shape", "why"),
    [([1], (8,), "reduces axes [1], not the last one"), ([-1], (4, 8), "does not match the normalised axis")],
)
def test_refuses_what_layernormalization_cannot_compute(axes, gamma_shape, why):
    outcome = assert_untouched(_written_out(axes, gamma_shape), STEP, layer_norm_rules, layer_norm_no_beta_rules)
    assert why in outcome.reason


def test_random_inputs_agree(exported, tmp_path):
    """The fused TorchScript variant at another batch and length than the one fuse looked at."""
    source = exported["torchscript"]
    model = load_model(source)
    result = produce_variant(source, tmp_path / "fused.onnx", [("fuse", Fuse.Options())], feeds=[random_inputs(model)])
    assert result.comparison.passed
    from tests.support.check import assert_pass_preserves_outputs

    feeds = [random_inputs(model, dims={"batch": 3, "tokens": 11}, seed=1)]
    assert_pass_preserves_outputs(source, tmp_path / "fused.onnx", tmp_path, feeds=feeds, atol=1e-5, rtol=1e-4)
