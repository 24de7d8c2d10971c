"""`--shape NAME:D0,D1` / `DIM=N`: one parser (runtime/inputs.py), the same in every command and recipe."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

from onnxsmith.core.errors import UsageError
from onnxsmith.runtime.inputs import parse_shape_options
from tests.conftest import assert_one_line_error


@pytest.mark.parametrize(
    "items, shapes, dims",
    [
        (["x:1,3,224,224"], {"x": (1, 3, 224, 224)}, {}),
        (["x:1", "3", "224", "224"], {"x": (1, 3, 224, 224)}, {}),  # cut at its commas by a list option
        ("x:2,8,m=3", {"x": (2, 8)}, {"m": 3}),
        (["x:0:1,2", "y:"], {"x:0": (1, 2), "y": ()}, {}),  # an input named like TensorFlow's; a scalar
        (["batch=4", "seq = 16"], {}, {"batch": 4, "seq": 16}),
        ([], {}, {}),
    ],
)
def test_the_parser(items, shapes, dims):
    assert parse_shape_options(items) == (shapes, dims)


@pytest.mark.parametrize(
    "items, problem",
    [
        (["x:1,a"], "--shape x:1,a: dims must be integers"),
        (["3"], "--shape 3: expected NAME:d0,d1,... or DIM=N"),
        (["=3"], "--shape =3: expected DIM=N"),
        (["n=x"], "--shape n=x: expected DIM=N"),
    ],
)
def test_the_parsers_problems(items, problem):
    with pytest.raises(UsageError) as err:
        parse_shape_options(items)
    assert err.value.problem.startswith(problem)


@pytest.fixture
def two_inputs(tmp_path):
    """x[n, 8] and z[m, 8] -> y = Concat(x, z)[n + m, 8]."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["x", "z"], ["y"], axis=0)],
        "concat",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["m", 8]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 8])],
    )
    path = tmp_path / "concat.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("flags", [["--shape", "x:2,8", "--shape", "m=3"], ["--shape", "x:2,8,m=3"]])
def test_validate_takes_shapes_like_every_command(two_inputs, tmp_path, cli, flags):
    """validate's --shape is a task option: it was cut at its commas and could not be parsed."""
    result = cli("validate", two_inputs, two_inputs, "--task", "generic", *flags, "--json", tmp_path / "v.json")
    assert result.returncode == 0, result.stderr
    values = json.loads((tmp_path / "v.json").read_text())["errors"]["|Δ| (all output values)"]
    assert len(values) == 4 * (2 + 3) * 8  # 4 samples of y[2 + 3, 8]
    compared = cli("compare", two_inputs, two_inputs, *flags, "--json")
    assert json.loads(compared.stdout)["outputs"][0]["shape"] == [5, 8]


def test_validate_refuses_a_bad_shape_in_one_line(two_inputs, cli):
    result = cli("validate", two_inputs, two_inputs, "--task", "generic", "--shape", "x:2,a")
    assert_one_line_error(result, "shape x:2,a: dims must be integers")
    result = cli("validate", two_inputs, two_inputs, "--task", "generic", "--shape", "x:2,8,1")
    assert_one_line_error(result, "--shape x: 3 dims given, the input has 2")
