"""Messages that name the file and the problem (issue 12, item 9)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import assert_one_line_error


def _save(path, nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_two_nodes_writing_one_value_name_the_value_and_both_nodes(cli, tmp_path):
    path = _save(
        tmp_path / "two.onnx",
        [helper.make_node("Relu", ["x"], ["y"], name="first"), helper.make_node("Neg", ["x"], ["y"], name="second")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    result = cli("inspect", path)
    assert_one_line_error(result, "two.onnx: 'y' is written twice: by node 'first' and by node 'second'")


def test_an_input_that_is_not_a_tensor_names_the_file(cli, tmp_path):
    path = _save(
        tmp_path / "seq.onnx",
        [helper.make_node("SequenceLength", ["x"], ["n"], name="len")],
        [helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    assert cli("inspect", path).returncode == 0  # a valid model; onnxsmith just cannot feed it
    for command in ("compare", "shrink"):
        result = cli(command, path, tmp_path / "out.onnx")
        assert_one_line_error(result, "seq.onnx: graph input 'x' is a Sequence(Tensor(FLOAT)), not a tensor")
    assert not (tmp_path / "out.onnx").exists()


def test_a_tiny_file_declaring_a_huge_size_says_the_sizes_disagree(cli, tmp_path):
    """207 bytes declaring 4096 GiB once drew a warning that it was within 10 % of 2 GiB."""
    w = numpy_helper.from_array(np.zeros(8, np.float32), "w")
    w.dims[:] = [2**40]
    path = _save(
        tmp_path / "tiny.onnx",
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**40])],
        [w],
    )
    assert path.stat().st_size < 300
    result = cli("inspect", path)
    assert_one_line_error(
        result, "tiny.onnx: tensor 'w' declares shape [1099511627776] of FLOAT", "4096.0 GB", "disagrees"
    )
    assert "2 GiB" not in result.stderr
