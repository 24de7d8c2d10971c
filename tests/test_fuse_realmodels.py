"""``fuse`` on other people's models: a BERT encoder and an OCR recogniser fuse; where no rule applies the graph stays equal."""

import numpy as np
import onnx_ir as ir
import pytest

from onnxsmith.io.load import load_model
from onnxsmith.irutil.walk import all_nodes
from onnxsmith.release.variant import produce_variant
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.transforms.fuse import Fuse
from onnxsmith.verify.compare import compare_models
from tests.support.fusion import op_count
from tests.support.realmodels import real_model

pytestmark = pytest.mark.realmodel


def _contrib_ops(model):
    return sorted({n.op_type for n in all_nodes(model) if n.domain == "com.microsoft"})


def test_minilm_attention_skip_layernorm_and_bias_gelu_fuse(tmp_path):
    source = real_model("minilm")
    model = load_model(source)
    feeds = [random_inputs(model, seed=0)]  # batch 1, sequence 8
    result = produce_variant(source, tmp_path / "minilm.onnx", [("fuse", Fuse.Options())], feeds=feeds)
    fused = load_model(tmp_path / "minilm.onnx")
    assert op_count(fused, "MultiHeadAttention") == 3  # 3 layers
    assert op_count(fused, "SkipLayerNormalization") == 6  # both residual LayerNorms of each layer
    assert op_count(fused, "BiasGelu") == 3
    assert op_count(fused, "Softmax") == 0 and op_count(fused, "Transpose") == 0
    assert result.nodes_after < result.nodes_before / 3
    # Batch and sequence both stay dynamic: other sizes than the ones the shapes were evaluated at.
    other = [random_inputs(model, dims={"batch_size": 2, "sequence_length": 5}, seed=s) for s in range(2)]
    comparison = compare_models(source, tmp_path / "minilm.onnx", other, atol=1e-4, rtol=1e-3)
    assert comparison.passed, comparison.failures()
    assert max(o.max_abs for o in comparison.outputs) < 1e-4


def test_ppocr_recogniser_layernorms_and_attention_fuse_and_run_at_other_sizes(tmp_path):
    """Paddle2ONNX at opset 12 writes its LayerNorms out: they fuse (the model raised to opset 17), and so do
    its two attentions; every other rule leaves the graph as it was."""
    source = real_model("ppocr_rec")
    model = load_model(source)
    feeds = [random_inputs(model, shapes={"x": (1, 3, 48, 320)}, seed=0)]
    result = produce_variant(
        source, tmp_path / "ppocr.onnx", [("fuse", Fuse.Options(static_dims=["x_dim2"]))], feeds=feeds
    )
    matched = {row["rule"]: row["matched"] for row in result.reports[0].tables["rules"] if row["matched"]}
    assert matched.pop("written-out LayerNorm -> LayerNormalization") == 5
    assert matched.pop("softmax attention -> SDPA") == matched.pop("SDPA -> MultiHeadAttention") == 2
    assert set(matched) <= {"no-op Transpose/Reshape pairs", "Add + LayerNorm -> SkipLayerNormalization"}
    fused = load_model(tmp_path / "ppocr.onnx")
    assert op_count(fused, "LayerNormalization") + op_count(fused, "SkipLayerNormalization") == 5
    assert op_count(fused, "MultiHeadAttention") == 2 and op_count(fused, "Shape") == 0  # height 48: shapes fold
    other = [random_inputs(model, shapes={"x": (2, 3, 48, 160)}, seed=1)]  # batch and width stay free
    comparison = compare_models(source, tmp_path / "ppocr.onnx", other, atol=1e-4, rtol=1e-3)
    assert comparison.passed, comparison.failures()


def test_silero_vad_has_nothing_to_fuse_and_stays_equal(tmp_path):
    source = real_model("silero_vad")
    rng = np.random.default_rng(0)
    feeds = [
        {
            "input": (0.1 * rng.standard_normal((1, 512))).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64),
        }
    ]
    result = produce_variant(source, tmp_path / "vad.onnx", [("fuse", Fuse.Options())], feeds=feeds)
    assert all(row["matched"] == 0 for row in result.reports[0].tables["rules"] if not row["rule"].startswith("no-op"))
    assert _contrib_ops(load_model(tmp_path / "vad.onnx")) == []
    comparison = compare_models(source, tmp_path / "vad.onnx", feeds, atol=1e-7, rtol=0)
    assert comparison.passed, comparison.failures()


def test_t5_encoder_at_opset_14_fuses_into_a_valid_model(tmp_path):
    """onnxscript's MultiHeadAttention rules write Shape(start, end) (opset 15): lowered to the model's opset 14."""
    import onnx

    source = real_model("t5_encoder")
    model = load_model(source)
    assert model.opset_imports[""] == 14
    feeds = [random_inputs(model, seed=0)]
    result = produce_variant(source, tmp_path / "t5.onnx", [("fuse", Fuse.Options())], feeds=feeds)
    assert result.comparison.passed
    fused = load_model(tmp_path / "t5.onnx")
    assert op_count(fused, "MultiHeadAttention") == 4 and fused.opset_imports[""] == 14
    assert all(
        "start" not in n.attributes and "end" not in n.attributes for n in all_nodes(fused) if n.op_type == "Shape"
    )
    onnx.checker.check_model(str(tmp_path / "t5.onnx"), full_check=True)
    other = [random_inputs(model, dims={"batch": 2, "sequence": 5}, seed=1)]
    comparison = compare_models(source, tmp_path / "t5.onnx", other, atol=1e-4, rtol=1e-3)
    assert comparison.passed, comparison.failures()


def _bytes(path) -> int:
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + ".data")) if p.exists())


def _fused(tmp_path, name):
    """(the real model's path, the model, its `fuse` variant) with fuse's defaults, verified on one random input."""
    source = real_model(name)
    model = load_model(source)
    produce_variant(source, tmp_path / f"{name}.onnx", [("fuse", Fuse.Options())], feeds=[random_inputs(model, seed=0)])
    return source, model, load_model(tmp_path / f"{name}.onnx")


def test_minilm_int8_fuses_and_keeps_its_weights_int8(tmp_path):
    """fold_shapes stored every dequantised weight in fp32: 2.39x the source."""
    source, _, fused = _fused(tmp_path, "minilm_int8")
    assert op_count(fused, "MultiHeadAttention") == 6 and op_count(fused, "SkipLayerNormalization") == 12
    int8 = [v for v in fused.graph.initializers.values() if v.const_value.dtype == ir.DataType.INT8]
    assert len(int8) == 38  # every weight, the embeddings included
    assert _bytes(tmp_path / "minilm_int8.onnx") <= _bytes(source)


def test_rxnmap_shared_weights_stay_shared(tmp_path):
    """Its blocks share weights (read through an Identity per reuse): fold_shapes stored copies, 1.10x."""
    source, model, fused = _fused(tmp_path, "rxnmap")
    assert op_count(fused, "MultiHeadAttention") == 15
    big = [v.name for v in fused.graph.initializers.values() if v.const_value.nbytes >= 1 << 20]
    source_big = [v.name for v in model.graph.initializers.values() if v.const_value.nbytes >= 1 << 20]
    assert sorted(big) == sorted(source_big)  # no weight stored twice
    assert _bytes(tmp_path / "rxnmap.onnx") <= _bytes(source)
