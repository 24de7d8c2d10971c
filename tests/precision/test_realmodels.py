"""The precision engine on other people's models: what issue 11 found on them (classes 4 and 5)."""

import numpy as np
import onnx_ir as ir
import pytest

from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.precision.report import weight_bytes_by_type
from onnxsmith.release.variant import produce_variant
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.runtime.runner import FAITHFUL
from onnxsmith.transforms.fp16 import Options
from onnxsmith.transforms.fuse import Fuse
from onnxsmith.verify.compare import compare_models
from tests.support.corpus import plausible_feeds
from tests.support.realmodels import MODELS, real_model

pytestmark = pytest.mark.realmodel

DINO_224 = {"pixel_values": (1, 3, 224, 224)}


def _resize_size_types(model: ir.Model) -> list[tuple[str, str]]:
    """The Resize nodes' scales/sizes and every tensor computing them (from the dims Shape reads), as (name, dtype)."""
    found, pending, seen = [], [], set()
    for node in model.graph:
        if node.op_type == "Resize":
            pending.extend(v for v in node.inputs[1:] if v is not None)
    while pending:
        value = pending.pop()
        if value.name in seen:
            continue
        seen.add(value.name)
        found.append((value.name, str(value.dtype)))
        producer = value.producer()
        if producer is not None and producer.op_type != "Shape":
            pending.extend(v for v in producer.inputs if v is not None)
    return sorted(found)


@pytest.mark.parametrize("step", [("fp16", Options()), ("fuse", Fuse.Options(precision="fp16"))], ids=["fp16", "fuse"])
def test_dinov2_interpolated_position_grid_stays_exact(tmp_path, step):
    """Issue 11 class 5: DINOv2's cubic Resize of its position embeddings, sized by Shape arithmetic,
    ran in onnxruntime no more after fp16 ('Cubic' mode only supports ... outermost 2 scale values being 1)."""
    source = real_model("dinov2_interp")
    model = load_model(source)
    feeds = [random_inputs(model, shapes=DINO_224, seed=s) for s in range(2)]
    out = tmp_path / "dino.onnx"
    produce_variant(source, out, [step], feeds=feeds)
    variant = load_model(out)
    infer_types(model)
    infer_types(variant)  # a variant states only the types its source stated (it never grows)
    exact = dict(_resize_size_types(model))
    computed = _resize_size_types(variant)
    assert computed and all(exact.get(name, dtype) == dtype for name, dtype in computed), computed
    assert out.stat().st_size <= 0.6 * source.stat().st_size
    # At a size the variant was not made at (20x20 patches instead of 16x16): the grid is interpolated
    # to another size, storage-faithfully, and matches the source.
    other = [random_inputs(model, shapes={"pixel_values": (1, 3, 280, 280)}, seed=7)]
    comparison = compare_models(source, out, other, atol=1e9, rtol=1e9)
    assert comparison.modes["candidate"] == FAITHFUL
    assert min(o.cosine for o in comparison.outputs) >= 0.999


def _fp16(source, tmp_path, shapes=None, step=None, feeds=None):
    """(the variant's result, the variant); ``feeds`` default: two made-up input sets"""
    model = load_model(source)
    feeds = feeds or [random_inputs(model, shapes=shapes, seed=s) for s in range(2)]
    result = produce_variant(source, tmp_path / "out.onnx", [step or ("fp16", Options())], feeds=feeds)
    return result, load_model(tmp_path / "out.onnx")


def _lstm_weight_types(model: ir.Model) -> set[tuple[str, str]]:
    """(op writing each LSTM weight input, the dtype of what that op reads) — through Slice/Concat/Unsqueeze."""
    found = set()
    for graph in model.graphs():
        for node in graph:
            if node.op_type == "LSTM":
                for value in node.inputs[1:4]:
                    while value is not None and value.producer() is not None and value.producer().op_type != "Cast":
                        value = value.producer().inputs[0]
                    cast = value.producer() if value is not None else None
                    found.add(("Cast", str(cast.inputs[0].dtype)) if cast else ("weight", str(value.dtype)))
    return found


def test_crnn_lstm_weights_are_stored_fp16_and_widened_at_load(tmp_path):
    """Issue 11 class 4: ddddocr's recogniser (CNN + LSTM) came out at 0.66x, its LSTM weights fp32."""
    source = real_model("ddddocr_common")
    result, variant = _fp16(source, tmp_path)
    assert _lstm_weight_types(variant) == {("Cast", "FLOAT16")}  # the LSTM itself computes in fp32
    notes = result.reports[0].notes
    assert any(n.startswith("3 recurrent weights stored fp16, widened by a Cast at load") for n in notes), notes
    assert (tmp_path / "out.onnx").stat().st_size <= 0.51 * source.stat().st_size


def test_lstm_weights_read_inside_if_branches_are_stored_fp16(tmp_path):
    """silero VAD slices its main graph's LSTM weights inside If branches."""
    source = real_model("silero_vad_op15")
    _, variant = _fp16(source, tmp_path, shapes={"input": (1, 512)})
    assert _lstm_weight_types(variant) == {("Cast", "FLOAT16")}
    assert (tmp_path / "out.onnx").stat().st_size <= 0.55 * source.stat().st_size


@pytest.mark.parametrize("step", [("fp16", Options()), ("fuse", Fuse.Options(precision="fp16"))], ids=["fp16", "fuse"])
def test_an_int8_model_s_report_says_first_why_fp16_is_not_half(tmp_path, step):
    source = real_model("minilm_int8")
    result, _ = _fp16(source, tmp_path, step=step)
    # The headline: the size, the verdict, then why not more.
    assert result.headline[2].endswith("are int8: fp16 converts fp32 weights only"), result.headline


def test_a_transformer_with_shared_weights_is_half_size_in_fp16(tmp_path):
    """Issue 11 class 4: rxnmap (15 blocks sharing their projections) came out at 0.998x: its "small tensors"
    rule measured a Transpose of a shared weight as the largest activation."""
    source = real_model("rxnmap")
    result, _ = _fp16(source, tmp_path)
    assert len(result.headline) == 2, result.headline  # the size and the verdict: nothing to explain
    assert (tmp_path / "out.onnx").stat().st_size <= 0.51 * source.stat().st_size


def test_lstm_weights_that_rounding_moves_too_much_stay_fp32_and_the_headline_says_so(tmp_path):
    """silero VAD (spox): its LSTMs sit in If branches nested two deep, their weights Constant nodes of
    the outer branch. Rounded to fp16 they move the carried state by ~0.06 (the rest of fp16: ~0.01)."""
    source = real_model("silero_vad")
    rng = np.random.default_rng(0)
    feeds = [
        {
            "input": (0.1 * rng.standard_normal((1, 512))).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64),
        }
        for _ in range(2)
    ]
    result = produce_variant(source, tmp_path / "out.onnx", [("fp16", Options())], feeds=feeds)
    why = result.headline[2]
    assert "stay fp32: LSTM policy" in why and "rounding them to fp16 moved output" in why, result.headline
    assert any(n.startswith("8 recurrent weights kept fp32: rounding them") for n in result.reports[0].notes)


def _weight_storage(model: ir.Model, node: ir.Node | str) -> tuple[str, str]:
    """(what ``node`` (or the node so named) reads its weight as, how that weight is stored): a Cast in
    between widens it."""
    if isinstance(node, str):
        node = next(n for n in model.graph if n.name == node)
    read = node.inputs[1]
    producer = read.producer()
    stored = producer.inputs[0] if producer is not None and producer.op_type == "Cast" else read
    return str(read.dtype), str(stored.dtype)


def test_ppocr_v6_det_weights_with_dead_channels_are_stored_fp16(tmp_path):
    """Issue 11 class 4: PP-OCRv6 det came out at 0.64x. Its head's 1x1 convs hold trained weights whose dead
    output channels are ~1e-7..1e-22 (conv2d_161.w_0: 52 % of its values below 2^-20): kept fp32 as "constant
    out of range", though fp16 moves them by 2e-4 as a whole. The conv reading conv2d_165.w_0 computes fp32 (its
    output underflows fp16), and so do the squeeze-excite gates (small tensors): their weights are stored fp16."""
    source = real_model("ppocr_v6_det")
    # what a text detector sees: pages of text (on photo crops its fp16 probability map is refused at cosine 0.9976:
    # docs/conformance.md)
    pages = [plausible_feeds(MODELS["ppocr_v6_det"].feeds, seed=s) for s in range(2)]
    result, variant = _fp16(source, tmp_path, feeds=pages)
    infer_types(variant)
    assert _weight_storage(variant, "Conv.50") == ("FLOAT16", "FLOAT16")  # reads conv2d_161.w_0
    kept = result.reports[0].tables["fp32 islands"]
    assert any(row["kept for"] == "underflow" and "fp16 578 KB (Cast at load)" in row["weights"] for row in kept), kept
    assert any(row["kept for"] == "small tensors" and "(Cast at load)" in row["weights"] for row in kept), kept
    notes = result.reports[0].notes
    assert any("weights of nodes kept fp32 for their tensors (small or out of range) stored fp16" in n for n in notes)
    assert len(result.headline) == 2, result.headline  # about half: nothing to explain
    assert (tmp_path / "out.onnx").stat().st_size <= 0.52 * source.stat().st_size


def test_ppocr_cls_squeeze_excite_convs_compute_fp32_from_fp16_weights(tmp_path):
    """Issue 11 class 4: PP-OCR's MobileNetV3 direction classifier came out at 0.61x: its squeeze-excite
    gates (8..200 elements) stay fp32 by the cost rule, and their weights stayed fp32 with them."""
    source = real_model("ppocr_cls_mobile")
    _, variant = _fp16(source, tmp_path, shapes={"x": (1, 3, 48, 192)})
    infer_types(variant)
    kept = [n for n in variant.graph if n.op_type == "Conv" and n.outputs[0].dtype == ir.DataType.FLOAT]
    assert kept and ("FLOAT", "FLOAT16") in {_weight_storage(variant, node) for node in kept}
    # What stays fp32 are the gates' biases and weights too small to be worth a Cast (under 512 bytes each).
    weights = weight_bytes_by_type(variant)
    assert weights["float"] < 0.01 * weights["float16"], weights
    assert (tmp_path / "out.onnx").stat().st_size <= 0.56 * source.stat().st_size
