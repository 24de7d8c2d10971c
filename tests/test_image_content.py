"""runtime/image_content.py: an image input whose picture some output maps gets pages of printed text with a
photo on them (a text detector finds nothing in a portrait); one whose outputs are vectors keeps its photos."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.input_roles import describe_inputs, input_roles
from onnxsmith.io.load import load_model
from onnxsmith.runtime.sizing import inputs_that_run
from tests.support.realmodels import real_model

OPSET = [helper.make_opsetid("", 17)]


def _model(save_proto, head: str):
    """A Conv over a 3-channel picture, then a map of it (a Sigmoid per pixel, or one at half its size) or a
    vector (pooled)."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.2, (4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2] if head == "half" else [1, 1])
    ]
    if head == "vector":
        nodes += [helper.make_node("GlobalAveragePool", ["c"], ["p"]), helper.make_node("Flatten", ["p"], ["y"])]
    else:
        nodes.append(helper.make_node("Sigmoid", ["c"], ["y"]))
    graph = helper.make_graph(
        nodes,
        head,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    return load_model(save_proto(helper.make_model(graph, opset_imports=OPSET), f"{head}.onnx"))


def _pages(pictures: np.ndarray) -> int:
    """How many pictures [N, C, H, W] are a page: a large share of pixels the paper's one colour (no photo's)."""
    count = 0
    for picture in pictures:
        flat = picture.reshape(picture.shape[0], -1).T
        paper = np.median(flat, axis=0)
        count += np.mean(np.abs(flat - paper).max(axis=1) < 0.02 * (np.ptp(flat) or 1)) > 0.4
    return count


@pytest.mark.parametrize(("head", "paged"), [("map", True), ("half", True), ("vector", False)])
def test_pictures_a_model_maps_are_pages_with_a_photo(save_proto, head, paged):
    model = _model(save_proto, head)
    sets = inputs_that_run(model, samples=8)
    role = input_roles(model)["x"]
    assert bool(role.pages) == paged
    pages = _pages(np.concatenate([s["x"] for s in sets]))
    assert pages == (8 if paged else 0)
    if paged:
        size = "its size" if head == "map" else "1/2 of its size"
        assert (
            f"pages of printed text with a photo (its output 'y' maps the picture at {size})"
            in describe_inputs(model)[0]
        )


@pytest.mark.realmodel
@pytest.mark.parametrize(("name", "paged"), [("ppocr_det", True), ("ppocr_cls_mobile", False), ("ddddocr_det", False)])
def test_real_text_detectors_get_pages(name, paged):
    """PP-OCR's detector answers with a probability map of the picture; its orientation classifier and ddddocr's
    YOLOX detector (a grid of boxes) with rows."""
    model = load_model(real_model(name))
    inputs_that_run(model)
    (role,) = [r for r in input_roles(model).values() if r.kind == "image"]
    assert bool(role.pages) == paged
