"""runtime/sizing.py: unsized input dims get sizes the model runs at (issue 11 class 3), or a one-line error naming them."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxsmith.io.load import load_model
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.runtime.sizing import inputs_that_run
from tests.conftest import assert_one_line_error


def _image_model(save_proto, columns: int, *, metadata: dict[str, str] | None = None, name="image.onnx"):
    """x[batch, 1, height, width] -> Reshape(-1, columns): runs only where height * width divides by ``columns``."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"])],
        "image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([-1, columns], np.int64), "target")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    return save_proto(model, name)


def test_an_image_gets_the_first_stride_friendly_size_it_runs_at(save_proto):
    # 224 x 224 does not divide by 640; 320 x 320 does. The old guess (1 x 1) does not.
    model = load_model(_image_model(save_proto, 640))
    (feeds,) = inputs_that_run(model)
    assert feeds["x"].shape == (1, 1, 320, 320)
    assert random_inputs(model)["x"].shape == (1, 1, 1, 1)  # random_inputs alone keeps its plain defaults


def test_an_image_no_square_runs_at_is_sized_as_a_text_line(save_proto):
    """A recogniser folds its height to one row (PaddleOCR's rec runs at no square side tried): 48 x 320, a
    text line, not the 1 x 1 picture that exercises nothing. Here 48 * 320 = 15360 elements divide; no square's do."""
    model = load_model(_image_model(save_proto, 48 * 320))
    (feeds,) = inputs_that_run(model)
    assert feeds["x"].shape == (1, 1, 48, 320)


def test_the_image_size_in_the_models_metadata_comes_first(save_proto):
    model = load_model(_image_model(save_proto, 8, metadata={"imgsz": "[96, 128]"}))
    feeds = inputs_that_run(model, samples=2)
    assert [f["x"].shape for f in feeds] == [(1, 1, 96, 128)] * 2
    assert not np.array_equal(feeds[0]["x"], feeds[1]["x"])  # seeded apart


def test_given_sizes_are_kept(save_proto):
    model = load_model(_image_model(save_proto, 8))
    (feeds,) = inputs_that_run(model, dims={"height": 4, "width": 2})
    assert feeds["x"].shape == (1, 1, 4, 2)


def test_a_window_of_samples_grows_until_it_runs(save_proto):
    """A reflect-padded STFT window (silero VAD): 64 samples padded by 64 do not run; 512 do."""
    graph = helper.make_graph(
        [helper.make_node("Pad", ["audio", "pads"], ["y"], mode="reflect")],
        "audio",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([0, 64, 0, 64], np.int64), "pads")],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    (feeds,) = inputs_that_run(model)
    assert feeds["audio"].shape == (1, 512)


def test_a_sample_rate_input_is_16_khz(save_proto):
    graph = helper.make_graph(
        [helper.make_node("Cast", ["sr"], ["y"], to=TensorProto.FLOAT)],
        "rate",
        [helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    assert random_inputs(model)["sr"].tolist() == 16000


def test_when_no_size_runs_the_error_names_the_dims_to_set(save_proto, cli, tmp_path):
    path = _image_model(save_proto, 1001)  # 7 * 11 * 13: no square side tried divides it
    result = cli("fp16", path, tmp_path / "out.onnx")
    assert_one_line_error(result, "height=224, width=224", "height=640, width=640", "--shape x:1,1,H,W")
    assert not (tmp_path / "out.onnx").exists()
    # and with the sizes given, it runs
    result = cli("fp16", path, tmp_path / "out.onnx", "--shape", "x:1,1,7,143")
    assert result.returncode == 0, result.stderr


def test_a_dim_named_as_a_sum_is_its_terms_sizes_added(save_proto):
    """optimum's attention mask is [batch, past_sequence_length + sequence_length]: with an empty cache it is as long
    as the ids, whatever length the ids grow to (a real decoder's export failed at every size when the sum was taken
    for a past length and sized 0)."""
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["input_ids", "rows"], ["y"]),  # runs at 64 tokens only
            helper.make_node("Gather", ["attention_mask", "last"], ["z"], axis=1),
        ],
        "decoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info(
                "past_key_values.0.key", TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length", 4]
            ),
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch_size", "past_sequence_length + sequence_length"]
            ),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.INT64, None),
            helper.make_tensor_value_info("z", TensorProto.INT64, None),
        ],
        [
            onnx.numpy_helper.from_array(np.array([-1, 64], np.int64), "rows"),
            onnx.numpy_helper.from_array(np.array([63], np.int64), "last"),
        ],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    (feeds,) = inputs_that_run(model)
    assert feeds["input_ids"].shape == (1, 64) and feeds["attention_mask"].shape == (1, 64)
    assert feeds["past_key_values.0.key"].shape == (1, 2, 0, 4) and feeds["attention_mask"].all()
