"""Bad input: one line naming the file and the problem, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxsmith
from onnxsmith.cli.main import COMMANDS as COMMAND_MODULES
from onnxsmith.core.errors import UsageError
from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from tests.conftest import assert_one_line_error
from tests.support.models import mlp

COMMANDS = [("inspect",), ("compare", "{good}")]


def _bad_files(tmp_path, save_proto):
    good = save_proto(mlp(), "good.onnx")
    files = {"missing": (tmp_path / "nope.onnx", "no such file")}

    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    files["truncated"] = (truncated, "not a valid ONNX file")

    random = tmp_path / "random.onnx"
    random.write_bytes(bytes(range(256)) * 7)
    files["random"] = (random, "not a valid ONNX")

    save_model(load_model(good), tmp_path / "ext.onnx", external_data=True)
    (tmp_path / "ext.onnx.data").unlink()
    files["missing external data"] = (tmp_path / "ext.onnx", "external data file 'ext.onnx.data'")

    future = mlp()
    future.ir_version = onnx.IR_VERSION + 5
    files["future IR"] = (save_proto(future, "future.onnx"), f"IR version {onnx.IR_VERSION + 5}")

    cyclic = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Relu", ["b"], ["a"], name="r1"),
                helper.make_node("Relu", ["a"], ["b"], name="r2"),
                helper.make_node("Add", ["x", "a"], ["y"], name="add"),
            ],
            "cyclic",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
    )
    files["cycle"] = (save_proto(cyclic, "cyclic.onnx"), "not a DAG")

    dangling = mlp()
    dangling.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, [1]))
    files["missing output"] = (save_proto(dangling, "dangling.onnx"), "graph output 'ghost' is not produced")

    undefined = mlp()
    undefined.graph.node[2].input[0] = "nowhere"
    files["undefined input"] = (save_proto(undefined, "undefined.onnx"), "reads 'nowhere'")

    (tmp_path / "folder.onnx").mkdir()
    files["folder"] = (tmp_path / "folder.onnx", "is a folder")
    return good, files


@pytest.mark.parametrize("command", ["inspect", "compare"])
def test_every_bad_input_kind_is_one_line_exit_2(cli, tmp_path, save_proto, command):
    good, files = _bad_files(tmp_path, save_proto)
    for kind, (path, message) in files.items():
        args = ["inspect", path] if command == "inspect" else ["compare", good, path]
        result = cli(*args)
        assert_one_line_error(result, str(path), message)
        assert result.stdout == "", kind


@pytest.mark.parametrize("kind", ["truncated", "cycle"])
def test_a_real_process_prints_one_line_and_no_traceback(tmp_path, save_proto, kind):
    from tests.conftest import run_cli

    _, files = _bad_files(tmp_path, save_proto)
    path, message = files[kind]
    assert_one_line_error(run_cli("inspect", path), str(path), message)


def test_bad_options_are_one_line(cli, save_proto, tmp_path):
    good = save_proto(mlp())
    assert_one_line_error(cli("compare", good, good, "--shape", "x:1,2,3"), "3 dims given")
    assert_one_line_error(cli("compare", good, good, "--inputs", tmp_path / "none.npz"), "none.npz", "no such file")


def test_input_sets_of_different_shapes_are_one_line(cli, save_proto, tmp_path):
    """The outputs of every input set are compared stacked: a folder whose arrays differ in shape was a traceback
    from numpy; it is the second file, named, and the shapes."""
    good = save_proto(mlp())
    folder = tmp_path / "sets"
    folder.mkdir()
    np.savez(folder / "a.npz", x=np.zeros((3, 8), np.float32))
    np.savez(folder / "b.npz", x=np.zeros((2, 8), np.float32))
    result = cli("compare", good, good, "--inputs", folder)
    assert_one_line_error(result, "b.npz", "'x' is [2, 8], a.npz's [3, 8]: every input set must have the same shapes")
    with pytest.raises(UsageError, match=r"feeds: input set 1: 'x' is \[2, 8\], the first input set's \[3, 8\]"):
        onnxsmith.compare(good, good, feeds=[{"x": np.zeros((3, 8), np.float32)}, {"x": np.zeros((2, 8), np.float32)}])


def test_a_model_onnxruntime_cannot_run_is_one_line_without_its_log(tmp_path, save_proto):
    """onnxruntime logs its kernel error on stderr ("[E:onnxruntime:...]") before raising it: only the raise shows."""
    from tests.conftest import run_cli

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"])],
        "fixed_reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
        [helper.make_tensor("target", TensorProto.INT64, [2], [4, 2])],
    )
    path = save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    result = run_cli("compare", path, path, "--shape", "x:2,3")
    assert_one_line_error(result, str(path), "onnxruntime failed to run the model", "Reshape")


@pytest.mark.parametrize("command", [m.removesuffix("_cmd").replace("_", "-") for m in COMMAND_MODULES])
def test_every_command_prints_its_help(cli, command):
    """Help texts come from the transforms' option docs; argparse formats them with ``%``, so one "1 %" in
    int8's broke ``onnxsmith int8 --help`` with a traceback."""
    result = cli(command, "--help")
    assert result.returncode == 0, result.stderr[-300:]
    assert result.stdout.startswith(f"usage: onnxsmith {command}")
