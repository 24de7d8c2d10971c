"""runtime/image_range.py: an image input's value range, where the graph does not say it, read from its first Conv.

The models here are built the way training leaves them: a first Conv whose BatchNormalization's running
statistics (or, folded, whose scale) are those of photos in one convention. Photos in each convention then
go through it, and the one it was "trained" on must be found; where nothing tells, the range stays a guess.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.input_roles import INFERRED_RANGES, input_roles, parse_role_options, ranges_alike, with_given
from onnxsmith.io.load import load_model
from onnxsmith.runtime import runner
from onnxsmith.runtime.image_range import infer_image_ranges
from onnxsmith.runtime.plausible import image
from onnxsmith.runtime.sizing import inputs_that_run
from tests.support.realmodels import real_model

SHAPE = (1, 3, 64, 64)
OPSET = [helper.make_opsetid("", 17)]


def _weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), rng.normal(0, 0.1, 8).astype(np.float32)


def _graph(nodes, consts, name="first_conv") -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def _conv_stats(convention: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and variance of the Conv's output on photos in ``convention`` (what training saw)."""
    w, b = _weights()
    conv = _graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"w": w, "b": b})
    pictures = image((4, *SHAPE[1:]), "NCHW", convention, np.dtype(np.float32), np.random.default_rng(11))
    out = runner.run(runner.open_session(ir.serde.deserialize_model(conv)), {"x": pictures}, ["y"])["y"]
    return out.mean(axis=(0, 2, 3)), out.var(axis=(0, 2, 3))


def _with_batch_norm(save_proto, convention: str):
    mean, var = _conv_stats(convention)
    w, b = _weights()
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    consts = {"w": w, "b": b, "g": np.ones(8), "beta": np.zeros(8), "mean": mean, "var": var}
    return load_model(save_proto(_graph(nodes, consts), f"bn_{convention}.onnx"))


def _folded(save_proto, convention: str):
    """The BatchNormalization folded into the Conv: its outputs unit-scale on photos in ``convention``."""
    mean, var = _conv_stats(convention)
    w, b = _weights()
    scale = 1 / np.sqrt(var)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    consts = {"w": w * scale[:, None, None, None], "b": (b - mean) * scale}
    return load_model(save_proto(_graph(nodes, consts), f"folded_{convention}.onnx"))


def _taken(model) -> tuple[str, bool, str]:
    inputs_that_run(model, shapes={"x": SHAPE})
    role = input_roles(model)["x"]
    return role.value_range, role.range_guessed, role.why


@pytest.mark.parametrize("convention", ["0..255", "normalized"])
def test_a_batch_norm_s_running_statistics_tell_the_range(save_proto, convention):
    model = _with_batch_norm(save_proto, convention)
    assert input_roles(model)["x"].range_guessed  # the graph alone does not say
    value_range, guessed, why = _taken(model)
    assert (value_range, guessed) == (convention, False)
    assert "matches its BatchNormalization's statistics in " + convention in why


def test_a_folded_first_conv_s_output_scale_tells_0_to_255_apart(save_proto):
    """0..255 is 50-255 times the other conventions' scale: unit scale there is evidence (int8 calibrates on it)."""
    value_range, guessed, why = _taken(_folded(save_proto, "0..255"))
    assert (value_range, guessed) == ("0..255", False)
    assert "near unit scale on photos in 0..255, 16 times off in the others" in why


def test_a_folded_first_conv_s_output_scale_tells_the_likely_range(save_proto):
    """Normalized is only about 4 times 0..1's scale, which a trained layer's scale may blur: pictures are made
    in the range it points to, but it stays a guess for what would fix activation scales from them (int8)."""
    model = _folded(save_proto, "normalized")
    value_range, guessed, why = _taken(model)
    assert (value_range, guessed) == ("normalized", True)
    assert "near unit scale on photos in normalized, and about as near in 0..1" in why and "not a stated one" in why
    # 0..255 is ruled out: the guess lies between two ranges, and pictures in both cover it (int8)
    assert input_roles(model)["x"].ranges_alike == ("0..1",)
    assert (
        ranges_alike(model) == {"x": ("normalized", "0..1")}
        and ranges_alike(model, {"x": {"value_range": "0..1"}}) == {}
    )


def test_pictures_are_made_again_in_the_range_read(save_proto):
    model = _with_batch_norm(save_proto, "0..255")
    (feeds,) = inputs_that_run(model, shapes={"x": SHAPE})
    assert feeds["x"].max() > 100 and feeds["x"].min() >= 0  # 0..255 photos, not the normalized guess's


def test_nothing_read_where_no_conv_comes_first_and_the_users_range_wins(save_proto):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Conv", ["r", "w"], ["y"])]
    relu_first = load_model(save_proto(_graph(nodes, {"w": _weights()[0]}), "relu.onnx"))
    assert _taken(relu_first)[:2] == ("normalized", True)
    assert relu_first.meta[INFERRED_RANGES] == {}  # tried once, not again

    model = _with_batch_norm(save_proto, "0..255")
    given = parse_role_options("x=0..1")
    (feeds,) = inputs_that_run(model, shapes={"x": SHAPE}, given=given)
    assert model.meta[INFERRED_RANGES] == {}  # the user said it: nothing measured
    assert with_given(input_roles(model), given)["x"].value_range == "0..1" and feeds["x"].max() <= 1


def test_pictures_of_a_few_pixels_tell_nothing(save_proto):
    model = _with_batch_norm(save_proto, "0..255")
    tiny = {"x": np.zeros((1, 3, 8, 8), np.float32)}
    assert infer_image_ranges(model, tiny) == {} and input_roles(model)["x"].range_guessed


def _focus():
    """YOLOv5's Focus: space-to-depth written as four strided Slices that one Concat gathers again."""
    import torch

    class Focus(torch.nn.Module):
        def forward(self, x):
            return torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)

    return Focus()


@pytest.mark.parametrize("focus", [False, True], ids=["conv", "focus"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("convention", ["0..255", "normalized"])
def test_torch_exports_of_a_conv_bn_stem(tmp_path, dynamo, convention, focus):
    """A stem as torch writes it (the TorchScript exporter folds the BatchNormalization, the dynamo one keeps
    it), its running statistics those of photos in ``convention``; the Conv reads them directly or through a
    Focus."""
    import torch

    layers = [_focus()] if focus else []
    layers += [torch.nn.Conv2d(12 if focus else 3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
    stem = torch.nn.Sequential(*layers)
    stem.eval()
    pictures = torch.from_numpy(
        image((4, *SHAPE[1:]), "NCHW", convention, np.dtype(np.float32), np.random.default_rng(5))
    )
    with torch.no_grad():
        out = stem[:-2](pictures)
        stem[-2].running_mean.copy_(out.mean(dim=(0, 2, 3)))
        stem[-2].running_var.copy_(out.var(dim=(0, 2, 3)))
    path = tmp_path / "stem.onnx"
    torch.onnx.export(stem, (pictures[:1],), str(path), input_names=["x"], output_names=["y"], dynamo=dynamo)
    model = load_model(path)
    x = model.graph.inputs[0].name
    inputs_that_run(model)
    role = input_roles(model)[x]
    kept = any(node.op_type == "BatchNormalization" for node in model.graph)  # evidence: the range is known
    # folded, unit scale tells 0..255 from the others (50-255 times apart), not normalized from 0..1 (about 4)
    guessed = not kept and convention == "normalized"
    assert (role.value_range, role.range_guessed) == (convention, guessed), role.why


@pytest.mark.realmodel
@pytest.mark.parametrize(
    ("name", "taken"),
    [("ddddocr_det", ("0..255", False)), ("open_nsfw", ("0..255", False)), ("ppocr_v6_det_tiny", ("normalized", True))],
)
def test_real_stems_folded_into_their_first_conv(name, taken):
    """ddddocr's YOLOX detector (through a Focus) and open_nsfw's ResNet (NHWC, Caffe's 0..255 less the mean) are
    near unit scale on 0..255 photos and far from it on the others; PP-OCRv6's detector, fed -1..1, is near unit
    scale on normalized photos and only about 4 times off on 0..1 ones: likely, still a guess."""
    model = load_model(real_model(name))
    inputs_that_run(model)
    (role,) = [r for r in input_roles(model).values() if r.kind == "image"]
    assert (role.value_range, role.range_guessed) == taken, role.why
