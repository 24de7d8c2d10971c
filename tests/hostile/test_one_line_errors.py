"""Bad numbers, bombs, huge inputs and hand-edited releases: one line naming the file or option, exit 2
(issue classes 7, 8 and 10). Each of these once ended in a Python traceback (or the process died).

Commands run in this process (imports take seconds) except where memory is the point: those run in a
child whose address space is capped, so an allocation that the fix should prevent fails the test instead
of swapping the machine.
"""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import assert_one_line_error, run_cli, run_cli_in_process
from tests.support.lm_models import TEXT, gpt2_folder
from tests.support.models import mlp
from tests.support.release import face_images, recipe_text, save_toy_faceage, wider_annotations

#: The address space a child may take where memory is what a test is about (imports need ~1.5 GB of it).
CHILD_MEMORY = 3 * 2**30


def run_capped(*args, cwd=None) -> subprocess.CompletedProcess:
    """``python -m onnxsmith ARGS`` in a child that cannot map more than :data:`CHILD_MEMORY`."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))

    return run_cli(*args, cwd=cwd, preexec_fn=cap)


def _model(path: Path, inputs, outputs, nodes) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _relu(path: Path, shape) -> Path:
    return _model(
        path,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
    )


def _png_declaring(path: Path, width: int, height: int) -> Path:
    """A tiny valid-looking PNG whose header declares ``width`` x ``height`` grey pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(600))) + chunk(b"IEND", b"")
    )
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """A toy face-age model, two face images with WIDER FACE boxes and a recipe building one variant."""
    root = tmp_path_factory.mktemp("faces")
    source = save_toy_faceage(root / "toy.onnx")
    images = face_images(root / "images", count=2)
    (root / "images" / "boxes.txt").write_text(wider_annotations([(n, [b]) for n, b in images]))
    (root / "recipe.toml").write_text(
        recipe_text(
            source,
            '[[variants]]\nname = "fp16"\nsteps = [{ pass = "fp16" }]\n',
            validation='[validation]\ntask = "faceage"\ndata = "images"\nboxes = "images/boxes.txt"\n',
        )
    )
    (root / "sub").mkdir()
    return root


# ---- numbers where they are parsed --------------------------------------------------------------------


@pytest.mark.parametrize("box", ["nan,10,40,40", "10,1e999,40,40", "10,10,inf,40", "10,10,40,-nan"])
def test_a_box_that_is_not_a_finite_number_is_refused_naming_the_option(faces, cli, box):
    result = cli("predict", "--task", "faceage", faces / "toy.onnx", faces / "images" / "face0.png", "--box", box)
    assert_one_line_error(result, f"--box {box}: coordinates must be finite numbers")


@pytest.mark.parametrize("line", ["nan 12 60 70", "10 12 1e999 70", "10 -inf 60 70", "1e300 12 60 70"])
def test_a_boxes_file_with_a_number_out_of_range_names_the_file_and_line(faces, cli, tmp_path, line):
    shutil.copy(faces / "images" / "face0.png", tmp_path / "face0.png")
    (tmp_path / "boxes.txt").write_text(f"face0.png\n1\n{line} 0 0 0 0 0 0\n")
    result = cli(
        "validate", "--task", "faceage", faces / "toy.onnx", faces / "toy.onnx", "--boxes", tmp_path / "boxes.txt"
    )
    assert_one_line_error(result, f"{tmp_path / 'boxes.txt'}:3: box of 'face0.png': coordinates must be")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seed", "-1"], "argument --seed: expected a non-negative integer, not '-1'"),
        (["--rtol", "-1"], "argument --rtol: expected a finite number >= 0, not '-1'"),
        (["--atol", "inf"], "argument --atol: expected a finite number >= 0, not 'inf'"),
        (["--min-cosine", "nan"], "argument --min-cosine: expected a cosine in [-1, 1], not 'nan'"),
        (["--min-cosine", "1.5"], "argument --min-cosine: expected a cosine in [-1, 1], not '1.5'"),
        (["--samples", "0"], "argument --samples: expected a positive integer, not '0'"),
        (["--seed", "x"], "argument --seed: expected a non-negative integer, not 'x'"),
    ],
)
def test_compare_refuses_nonsense_numbers_in_one_line(save_proto, cli, flags, message):
    model = save_proto(mlp())
    assert_one_line_error(cli("compare", model, model, *flags), "compare: " + message)


@pytest.mark.parametrize(
    "command, message",
    [
        (["fp16", "{model}", "{out}", "--seed", "-1"], "fp16: argument --seed: expected a non-negative integer"),
        (["inspect", "{model}", "--top", "-3"], "inspect: argument --top: expected a non-negative integer"),
        (
            ["validate", "{model}", "{model}", "--task", "generic", "--seed", "-1"],
            "--seed expects a non-negative integer",
        ),  # a task's
    ],
)
def test_every_command_gets_the_same_number_types(save_proto, cli, tmp_path, command, message):
    model = save_proto(mlp())
    args = [a.format(model=model, out=tmp_path / "out.onnx") for a in command]
    assert_one_line_error(cli(*args), message)
    assert not (tmp_path / "out.onnx").exists()


def test_a_task_option_or_gate_of_nan_is_refused(faces, cli):
    model = faces / "toy.onnx"
    data = ["--task", "faceage", "--data", faces / "images", "--boxes", faces / "images" / "boxes.txt"]
    assert_one_line_error(cli("validate", model, model, *data, "--padding", "nan"), "--padding expects a finite number")
    assert_one_line_error(
        cli("validate", model, model, *data, "--gate", "max_abs_age_error=nan"), "--gate max_abs_age_error=nan"
    )


def test_a_recipe_option_or_gate_of_nan_is_refused_at_its_line(faces, cli, tmp_path):
    text = (faces / "recipe.toml").read_text()
    for extra, message in [
        ("padding = nan", ":13: [validation] task faceage: option 'padding' expects a finite number"),
        ("gates = { max_abs_age_error = inf }", ":13: [validation] gates must be a table of numbers"),
    ]:
        recipe = faces / "bad.toml"
        recipe.write_text(text.replace('boxes = "images/boxes.txt"\n', f'boxes = "images/boxes.txt"\n{extra}\n'))
        assert_one_line_error(cli("build", recipe, "--out", tmp_path / "out", "--no-bench"), "bad.toml" + message)
        assert not (tmp_path / "out").exists()


# ---- images -------------------------------------------------------------------------------------------


def test_a_tiny_png_declaring_50000_squared_pixels_is_refused_before_decoding(faces, cli, tmp_path):
    bomb = _png_declaring(tmp_path / "bomb.png", 50000, 50000)
    assert bomb.stat().st_size < 700
    result = cli("predict", "--task", "faceage", faces / "toy.onnx", bomb)
    assert_one_line_error(result, f"{bomb}: the image declares 2,500,000,000 pixels, more than the 89,478,485")
    crops = tmp_path / "crops"
    crops.mkdir()
    shutil.copy(bomb, crops / "face.png")
    result = cli("validate", "--task", "faceage", faces / "toy.onnx", faces / "toy.onnx", "--data", crops)
    assert_one_line_error(result, f"{crops / 'face.png'}: the image declares")


def test_an_image_just_over_pils_warning_threshold_is_refused_too(faces, cli, tmp_path):
    """PIL only warns between 89 and 179 megapixels; onnxsmith refuses from the first."""
    image = _png_declaring(tmp_path / "wide.png", 10000, 9000)
    result = cli("predict", "--task", "faceage", faces / "toy.onnx", image)
    assert_one_line_error(result, f"{image}: the image declares 90,000,000 pixels")


def test_a_face_box_outside_its_image_names_the_file(faces, cli, tmp_path):
    image = faces / "images" / "face0.png"
    result = cli("predict", "--task", "faceage", faces / "toy.onnx", image, "--box", "1000,1000,40,40")
    assert_one_line_error(result, f"{image}: the face box (1000, 1000, 40, 40) lies outside the 160x120 image")
    shutil.copy(image, tmp_path / "face0.png")
    (tmp_path / "boxes.txt").write_text("face0.png\n1\n1000 1000 50 50 0 0 0 0 0 0\n")
    result = cli(
        "validate", "--task", "faceage", faces / "toy.onnx", faces / "toy.onnx", "--boxes", tmp_path / "boxes.txt"
    )
    assert_one_line_error(
        result, f"{tmp_path / 'boxes.txt'}:3: the face box (1000, 1000, 50, 50) lies outside the 'face0.png' (160x120)"
    )


# ---- input sizes --------------------------------------------------------------------------------------


def test_an_input_declared_2_to_the_62_is_refused_naming_it_and_its_shape(cli, tmp_path):
    model = _relu(tmp_path / "huge.onnx", [2**62])
    result = cli("compare", model, model)
    assert_one_line_error(result, f"{model}: input 'x' of shape [{2**62}] (float32) would take", "--shape")


def test_a_shape_option_of_2_to_the_62_is_refused(save_proto, cli):
    model = save_proto(mlp())
    for shape in (f"x:{2**62},8", f"batch={2**62}"):
        result = cli("compare", model, model, "--shape", shape)
        assert_one_line_error(result, f"input 'x' of shape [{2**62}, 8] (float32) would take")
    assert_one_line_error(cli("compare", model, model, "--shape", "x:-1,8"), "--shape x:-1,8: dims must be integers")


def test_a_2_to_the_31_by_4_input_is_refused_before_anything_is_allocated(tmp_path):
    """32 GiB of float32: the child may map 3 GiB, so had it tried, it would have died of memory."""
    model = _relu(tmp_path / "big.onnx", [2**31, 4])
    for command in (["compare", model, model], ["validate", model, model, "--task", "generic"]):
        result = run_capped(*command)
        assert_one_line_error(
            result, f"{model}: input 'x' of shape [2147483648, 4] (float32) would take 32.0 GB, more than the"
        )


def test_a_string_input_names_the_file(tmp_path, cli):
    model = _model(
        tmp_path / "text.onnx",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2])],
        [helper.make_node("Identity", ["s"], ["y"], name="id")],
    )
    for command in (["compare", model, model], ["validate", model, model, "--task", "generic"]):
        assert_one_line_error(cli(*command), f"{model}: cannot make random values for input 's' of type STRING")


# ---- card ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def release(faces):
    result = run_cli_in_process("build", faces / "recipe.toml", "--out", faces / "release", "--no-bench")
    assert result.returncode == 0, result.stderr
    return faces / "release"


def _copy(release: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "release"
    shutil.copytree(release, copy)
    return copy


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "measurements.json: is not JSON (Expecting property name"),
        ("[1, 2]", "is not a measurements.json as onnxsmith build writes it: expected an object, got list"),
        ('{"variants": 5}', "'variants' must be a list"),
        ("\xff\xfe", "measurements.json: is not JSON"),
    ],
)
def test_card_on_a_measurements_json_that_is_not_one(release, cli, tmp_path, text, message):
    copy = _copy(release, tmp_path)
    (copy / "measurements.json").write_bytes(text.encode("latin-1"))
    before = (copy / "README.md").read_bytes()
    assert_one_line_error(cli("card", copy), message)
    assert (copy / "README.md").read_bytes() == before


def test_card_on_measurements_missing_what_the_card_shows(release, cli, tmp_path):
    copy = _copy(release, tmp_path)
    measurements = json.loads((copy / "measurements.json").read_text())
    del measurements["source"]["file"]
    (copy / "measurements.json").write_text(json.dumps(measurements))
    assert_one_line_error(cli("card", copy), "measurements.json: is not a measurements.json", "KeyError: 'file'")


@pytest.mark.parametrize("listed", ["../outside.txt", "{outside}", "link.txt", "sub/../../outside.txt"])
def test_card_never_pins_a_file_outside_the_release(release, cli, tmp_path, listed):
    copy = _copy(release, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the release's\n")
    (copy / "link.txt").symlink_to(outside)
    listed = listed.format(outside=outside)
    measurements = json.loads((copy / "measurements.json").read_text())
    sha = hashlib.sha256(outside.read_bytes()).hexdigest()
    measurements["included"] = [{"path": listed, "bytes": outside.stat().st_size, "sha256": sha}]
    (copy / "measurements.json").write_text(json.dumps(measurements))
    before = (copy / "README.md").read_bytes()
    result = cli("card", copy)
    assert_one_line_error(result, f"{copy / 'measurements.json'}: lists '{listed}', which is")
    assert (copy / "README.md").read_bytes() == before
    assert "outside.txt" not in (copy / "README.md").read_text()


def test_card_still_rewrites_a_release_as_built(release, cli, tmp_path):
    copy = _copy(release, tmp_path)
    before = (copy / "README.md").read_bytes()
    (copy / "README.md").unlink()
    assert cli("card", copy).returncode == 0
    assert (copy / "README.md").read_bytes() == before


# ---- determinism --------------------------------------------------------------------------------------


def test_a_recipe_named_relative_or_absolute_gives_byte_identical_measurements(faces, release, cli):
    """Paths in measurements.json are as the recipe wrote them, not resolved against the working directory."""
    relative = cli("build", "../recipe.toml", "--out", "../by-relative", "--no-bench", cwd=faces / "sub")
    assert relative.returncode == 0, relative.stderr
    built = (faces / "by-relative" / "measurements.json").read_bytes()
    assert built == (release / "measurements.json").read_bytes()  # the release was built by its absolute path
    options = json.loads(built)["validation"]["options"]
    assert options["data"] == "images" and options["boxes"] == "images/boxes.txt"


# ---- eval-lm ------------------------------------------------------------------------------------------


def test_eval_lm_on_a_200_mb_single_line_streams_it(tmp_path):
    """The whole text handed to the tokenizer at once needed ~30 GB and the process was killed; read in
    pieces, the child stays within its 3 GiB."""
    line = " ".join(TEXT.read_text().split())
    text = tmp_path / "one-line.txt"
    with open(text, "w", encoding="utf-8") as f:
        for _ in range(200_000_000 // (len(line) + 1)):
            f.write(line + " ")
    assert text.stat().st_size > 199_000_000 and text.read_bytes().count(b"\n") == 0
    model = gpt2_folder(past=False) / "onnx" / "model.onnx"
    result = run_capped("eval-lm", model, "--text", text, "--max-windows", "2", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    scored = json.loads(result.stdout)
    assert scored["windows"] == 2 and np.isfinite(scored["scores"][0]["loss"])
