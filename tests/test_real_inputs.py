"""Inputs made from real data: photos and a spoken sentence shipped with onnxsmith, a user's folder of files.

Issue "Proofs that mean something" (items 1 and 4): an image input gets crops of real photos in the range and
layout the graph reads, a waveform the shipped sentence; ``--data DIR`` (and ``--inputs``/``--calib``) makes
input sets of a folder of images or .wav files through what each input is, the report names what each input
was taken to be and ``--input-role`` corrects it; a folder with nothing usable is refused in one line. int8
quantizes 1-D Convs (audio models) as it does 2-D ones, and says why a 3-D one stays fp32.
"""

from __future__ import annotations

import wave

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from PIL import Image

from onnxsmith.analysis.input_roles import IMAGE, WAVEFORM, input_roles
from onnxsmith.core.errors import InputError, NothingGained
from onnxsmith.io.load import load_model
from onnxsmith.release.variant import produce_variant
from onnxsmith.runtime.data_folder import load_data
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.runtime.real_data import DATA, PHOTOS, SPEECH, photos, speech
from onnxsmith.transforms.int8 import Int8
from tests.conftest import assert_one_line_error
from tests.support.fusion import op_count

OPSET = [helper.make_opsetid("", 17)]


def _image_model(save_proto, *, shape=("batch", 3, "height", "width"), first="Div", name="image.onnx"):
    """x -> (Div by 255 | nothing) -> Conv 3->8 -> ReduceMean: an image model whose first op sets the range."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32), "W")]
    nodes = []
    x = "x"
    if first == "Div":
        inits.append(onnx.numpy_helper.from_array(np.array(255, np.float32), "k"))
        nodes.append(helper.make_node("Div", ["x", "k"], ["scaled"]))
        x = "scaled"
    nodes += [
        helper.make_node("Conv", [x, "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c"], ["y"], axes=[2, 3], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        inits,
    )
    return save_proto(helper.make_model(graph, opset_imports=OPSET), name)


def _audio_model(save_proto, name="audio.onnx"):
    """speech [batch, samples] -> frames of 160 (a Reshape) -> a Linear 160 -> 16 -> mean over frames."""
    rng = np.random.default_rng(1)
    inits = [
        onnx.numpy_helper.from_array((rng.standard_normal((160, 16)) * 0.1).astype(np.float32), "W"),
        onnx.numpy_helper.from_array(np.array([0, -1, 160], np.int64), "frames"),
    ]
    nodes = [
        helper.make_node("Reshape", ["speech", "frames"], ["f"]),
        helper.make_node("MatMul", ["f", "W"], ["h"]),
        helper.make_node("ReduceMean", ["h"], ["y"], axes=[1], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "audio",
        [helper.make_tensor_value_info("speech", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        inits,
    )
    return save_proto(helper.make_model(graph, opset_imports=OPSET), name)


def _photo_like(picture: np.ndarray) -> bool:
    """A photo's statistics, per plane [H, W] in 0..1: spread over the range, smooth between neighbours (not
    noise), and with edges (not a flat gradient)."""
    steps = np.abs(np.diff(picture, axis=-1))
    return picture.std() > 0.1 and steps.mean() < 0.3 * picture.std() and steps.max() > 0.2


def test_the_shipped_data_is_real_and_small():
    assert sum((DATA / name).stat().st_size for name in (*PHOTOS, SPEECH)) < 200_000
    assert len(photos()) == 2 and all(p.shape[2] == 3 and p.shape[0] >= 256 for p in photos())
    sentence = speech()
    assert 2.0 < sentence.size / 16000 < 4.0
    with wave.open(str(DATA / SPEECH)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)


def test_an_image_input_gets_photo_crops_in_its_range_and_layout(save_proto):
    model = load_model(_image_model(save_proto))
    role = input_roles(model)["x"]
    assert (role.kind, role.layout, role.value_range) == (IMAGE, "NCHW", "0..255")
    first = random_inputs(model, shapes={"x": (2, 3, 64, 64)}, seed=0)["x"]
    assert first.shape == (2, 3, 64, 64) and first.min() >= 0 and first.max() <= 255 and first.max() > 150
    assert all(_photo_like(plane / 255) for plane in first.reshape(-1, 64, 64))
    assert not np.allclose(first[0], first[1])  # each item its own crop
    other = random_inputs(model, shapes={"x": (2, 3, 64, 64)}, seed=1)["x"]
    assert not np.allclose(first, other)  # each input set its own crops
    # the crop is of a shipped photo: its mean colour is near some crop's of the photos (a portrait's, not a
    # random gradient's), and it is the same crop at the same seed
    assert np.array_equal(first, random_inputs(model, shapes={"x": (2, 3, 64, 64)}, seed=0)["x"])
    # NHWC read as it comes (normalized): the same photos, ImageNet-normalized, channels last
    nhwc = load_model(_image_model(save_proto, shape=(1, 32, 32, 3), first="none", name="nhwc.onnx"))
    role = input_roles(nhwc)["x"]
    assert (role.layout, role.value_range) == ("NHWC", "normalized")
    x = random_inputs(nhwc, seed=0)["x"]
    assert x.shape == (1, 32, 32, 3) and x.min() < -0.5 and x.max() > 0.5
    pixels = x * np.array([0.229, 0.224, 0.225]) + np.array([0.485, 0.456, 0.406])
    assert pixels.min() > -1e-5 and pixels.max() < 1 + 1e-5  # normalized from 0..1 pictures
    assert _photo_like(pixels[0, :, :, 0])


def test_a_wide_short_image_input_gets_a_line_of_text(save_proto):
    model = load_model(_image_model(save_proto, shape=(1, 3, 48, 320), first="none", name="rec.onnx"))
    x = random_inputs(model, seed=0)["x"][0]
    pixels = (x * np.array([0.229, 0.224, 0.225])[:, None, None] + np.array([0.485, 0.456, 0.406])[:, None, None]).mean(
        0
    )
    # a light page with dark strokes: most pixels light, a few percent dark, spread along the line
    assert np.median(pixels) > 0.6 and 0.01 < (pixels < 0.4).mean() < 0.4
    assert (pixels < 0.4).any(axis=0).mean() > 0.2


def test_a_waveform_input_gets_the_shipped_speech(save_proto):
    model = load_model(_audio_model(save_proto))
    assert input_roles(model)["speech"].kind == WAVEFORM
    wave_ = random_inputs(model, shapes={"speech": (3, 16000)}, seed=0)["speech"].astype(np.float64)
    rms = np.sqrt(np.mean(wave_**2, axis=1))
    assert ((rms > 0.02) & (rms < 0.1)).all()  # at speech level, every row: not silent
    for row in wave_:
        spectrum = np.abs(np.fft.rfft(row)) ** 2
        freqs = np.fft.rfftfreq(row.size, 1 / 16000)
        assert spectrum[(freqs > 80) & (freqs < 4000)].sum() > 0.9 * spectrum.sum()  # the speech band
        # syllables: the level changes over 50 ms frames (voiced and quieter stretches), unlike a steady tone
        frames = np.sqrt(np.mean(row[: 16000 // 800 * 800].reshape(-1, 800) ** 2, axis=1))
        assert frames.max() > 3 * np.median(frames) or frames.min() < 0.3 * frames.max()
    assert not np.allclose(wave_[0], wave_[1])  # different offsets
    # it is the sentence: each row correlates with a stretch of it
    sentence = speech()
    row = wave_[0][:4000]
    best = max(abs(np.corrcoef(row, sentence[s : s + 4000])[0, 1]) for s in range(0, sentence.size - 4000, 1))
    assert best > 0.95
    # a streaming model's short window lands on speech too
    short = random_inputs(model, shapes={"speech": (4, 512)}, seed=2)["speech"]
    assert (np.sqrt(np.mean(short.astype(np.float64) ** 2, axis=1)) > 0.01).all()


def _pngs(folder, count=3):
    folder.mkdir()
    for i, name in enumerate(PHOTOS[:count] * 2):
        if i == count:
            break
        picture = Image.open(DATA / name).convert("RGB").resize((80 + 16 * i, 64))
        picture.save(folder / f"photo{i}.png")
    return folder


def _wavs(folder, count=2):
    folder.mkdir()
    sentence = speech()
    for i in range(count):
        samples = np.round(sentence[i * 4000 : i * 4000 + 20000 + 3000 * i] * 32767).astype("<i2")
        with wave.open(str(folder / f"clip{i}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes(samples.tobytes())
    return folder


def test_a_folder_of_images_becomes_input_sets_through_the_inferred_preprocessing(save_proto, tmp_path):
    model = load_model(_image_model(save_proto))
    folder = _pngs(tmp_path / "pngs")
    sets = load_data(folder, model, shapes={"x": (1, 3, 48, 48)})
    assert len(sets) == 3
    x = sets[0]["x"]
    assert x.shape == (1, 3, 48, 48) and x.dtype == np.float32
    # the file's pixels, resized to cover 48x48 and cropped at the centre, in 0..255 (the graph divides by 255)
    expected = np.asarray(Image.open(folder / "photo0.png").convert("RGB").resize((60, 48), Image.BILINEAR), np.float32)
    assert abs(float(x.mean()) - float(expected[:, 6:54].mean())) < 3
    assert x.max() > 150 and _photo_like(x[0, 0] / 255)
    # corrected: taken as 0..1, the same pixels / 255
    corrected = load_data(folder, model, shapes={"x": (1, 3, 48, 48)}, given={"x": {"value_range": "0..1"}})
    np.testing.assert_allclose(corrected[0]["x"] * 255, x, atol=1e-3)


def test_validate_generic_with_a_folder_of_pngs_names_the_roles(save_proto, tmp_path, cli):
    source = _image_model(save_proto)
    folder = _pngs(tmp_path / "pngs")
    result = cli("validate", source, source, "--task", "generic", "--data", folder, "--shape", "x:1,3,64,64")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert "3 input set(s) from pngs" in said
    assert "'x': 3 image file(s) as image NCHW, 3 channel(s), values 0..255 (the graph divides it by 255)" in said
    # corrected with --input-role: the report says so
    result = cli("validate", source, source, "--task", "generic", "--data", folder, "--input-role", "x=NCHW,0..1")
    assert result.returncode == 0, result.stderr
    assert "values 0..1 (given with --input-role)" in " ".join(result.stdout.split())


def test_validate_generic_with_a_folder_of_wavs_names_the_roles(save_proto, tmp_path, cli):
    source = _audio_model(save_proto)
    folder = _wavs(tmp_path / "wavs")
    result = cli("validate", source, source, "--task", "generic", "--data", folder)
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert "2 input set(s) from wavs" in said
    assert "'speech': 2 audio file(s) at 16000 Hz mono (by its name)" in said
    assert "spoken sentence" not in said  # the user's audio, not the shipped sentence, is what was fed
    sets = load_data(folder, load_model(source))
    assert [s["speech"].shape for s in sets] == [(1, 20000), (1, 20000)]  # the shortest file's length
    assert np.sqrt(np.mean(sets[1]["speech"].astype(np.float64) ** 2)) > 0.02


def test_a_folder_with_nothing_usable_is_refused_in_one_line(save_proto, tmp_path, cli):
    source = _image_model(save_proto)
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.md").write_text("nothing to feed")
    result = cli("validate", source, source, "--task", "generic", "--data", folder)
    assert_one_line_error(result, "notes", "no .npz arrays, images (.png, .jpg), audio (.wav) or text (.txt)")
    # audio for a model with no waveform input: one line naming what the inputs were taken to be
    wavs = _wavs(tmp_path / "wavs")
    result = cli("fp16", source, tmp_path / "out.onnx", "--inputs", wavs)
    assert_one_line_error(result, "holds audio files but the model has no waveform input", "'x': image NCHW")
    assert not (tmp_path / "out.onnx").exists()
    # a file that is not an image
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.png").write_bytes(b"not a png")
    result = cli("validate", source, source, "--task", "generic", "--data", bad)
    assert_one_line_error(result, "x.png", "not a readable image")
    result = cli("validate", source, source, "--task", "generic", "--input-role", "x=sideways")
    assert_one_line_error(result, "x=sideways")


def test_a_transform_reports_what_each_input_was_taken_to_be(save_proto, tmp_path, cli):
    source = _image_model(save_proto)
    result = cli("fp16", source, tmp_path / "fp16.onnx", "--shape", "x:1,3,32,32")
    assert result.returncode == 0, result.stderr
    assert "inputs taken to be: 'x': image NCHW, 3 channel(s), values 0..255" in " ".join(result.stdout.split())
    folder = _pngs(tmp_path / "pngs")
    result = cli("fp16", source, tmp_path / "fp16-data.onnx", "--calib", folder, "--shape", "x:1,3,32,32")
    assert result.returncode == 0, result.stderr
    assert "inputs taken to be: 'x': 3 image file(s) as image NCHW" in " ".join(result.stdout.split())


def _conv_stack(path, *, dims=1, channels=64, layers=3, size=256):
    """x [1, 1, size...] -> ``layers`` x (Conv k5 -> Relu), ``dims``-D (1-D: an audio model's [B, C, T])."""
    rng = np.random.default_rng(0)
    inits, nodes, previous, cin = [], [], "x", 1
    for i in range(layers):
        kernel = [5] * dims
        weight = rng.standard_normal((channels, cin, *kernel)) / np.sqrt(cin * 5**dims)
        inits += [
            onnx.numpy_helper.from_array(weight.astype(np.float32), f"W{i}"),
            onnx.numpy_helper.from_array((rng.standard_normal(channels) * 0.1).astype(np.float32), f"B{i}"),
        ]
        nodes += [
            helper.make_node("Conv", [previous, f"W{i}", f"B{i}"], [f"c{i}"], name=f"conv{i}", pads=[2] * 2 * dims),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        previous, cin = f"r{i}", channels
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1] + [size] * dims)],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, channels] + [size] * dims)],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=OPSET), path)
    return path


def test_1d_convs_go_int8_as_qlinearconv(tmp_path):
    source = _conv_stack(tmp_path / "conv1d.onnx")
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, 1, 256)).astype(np.float32)} for i in range(4)]
    out = tmp_path / "int8.onnx"
    options = Int8.Options(speed=False, sensitivity=False)
    result = produce_variant(source, out, [("int8", options)], feeds=feeds, real_inputs=True)
    assert result.comparison.passed
    rows = {r["conv"]: r for r in result.reports[0].tables["Convs"]}
    assert [rows[f"conv{i}"]["int8"] for i in range(3)] == ["no", "yes", "yes"]
    assert rows["conv0"]["why"].startswith("too shallow (5 multiply-adds")  # 1 channel x 5 taps
    session_options = ort.SessionOptions()
    session_options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out), session_options, providers=["CPUExecutionProvider"])
    assert op_count(load_model(tmp_path / "optimized.onnx"), "QLinearConv") == 2


def test_a_3d_conv_stays_fp32_and_says_why(tmp_path):
    source = _conv_stack(tmp_path / "conv3d.onnx", dims=3, channels=16, layers=2, size=8)
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, 1, 8, 8, 8)).astype(np.float32)} for i in range(2)]
    options = Int8.Options(speed=False, sensitivity=False)
    try:
        produce_variant(source, tmp_path / "int8.onnx", [("int8", options)], feeds=feeds, real_inputs=True)
    except NothingGained as err:
        assert "2 Conv(s) stay fp32: 3-D (int8 takes 1-D and 2-D Convs)" in str(err)
    else:
        raise AssertionError("a model of 3-D Convs only made an int8 variant")
    assert not (tmp_path / "int8.onnx").exists()


def test_a_user_folder_is_refused_before_anything_is_made(save_proto, tmp_path):
    model = load_model(_audio_model(save_proto))
    folder = _pngs(tmp_path / "pngs", count=1)
    try:
        load_data(folder, model)
    except InputError as err:
        assert "holds image files but the model has no image input" in err.problem
        assert "--input-role NAME=image" in err.problem
    else:
        raise AssertionError("images were fed to an audio model")
