"""`onnxsmith extract`: the subgraph between named tensors, typed, minimal, verified; bad cuts refused."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxsmith.analysis.cut import plan_cut
from onnxsmith.core.errors import UsageError
from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from onnxsmith.passes.extract import ExtractPass
from onnxsmith.probes import exposed
from onnxsmith.release.extract import extract_piece
from onnxsmith.runtime.inputs import random_inputs
from tests.conftest import assert_one_line_error
from tests.support.surgery_models import chain, data_dependent_shape


def _io(path) -> dict[str, tuple]:
    model = onnx.load(path)
    return {
        v.name: (v.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
        for v in [*model.graph.input, *model.graph.output]
    }


def test_piece_between_named_tensors(cli, save_proto, tmp_path):
    source = save_proto(chain(), "chain.onnx")
    out = tmp_path / "piece.onnx"
    result = cli("extract", source, out, "--inputs", "b,d", "--outputs", "y", "--report", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    # Typed inputs with the shapes inference gave (the symbolic batch kept); checker-clean.
    assert _io(out) == {
        "b": (TensorProto.FLOAT, ["batch", 8]),
        "d": (TensorProto.FLOAT, ["batch", 8]),
        "y": (TensorProto.FLOAT, ["batch", 8]),
    }
    onnx.checker.check_model(onnx.load(out), full_check=True)
    piece = onnx.load(out)
    assert [n.op_type for n in piece.graph.node] == ["Add", "Tanh"] and not piece.graph.initializer
    # Independently of the command's own check: y = tanh(b + d) for any batch.
    rng = np.random.default_rng(3)
    b, d = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((5, 8)).astype(np.float32)
    y = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"b": b, "d": d})[0]
    np.testing.assert_allclose(y, np.tanh(b + d), rtol=1e-6)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verification"]["passed"] and report["nodes"] == {"source": 7, "piece": 2}


def test_only_the_initializers_the_piece_reads(cli, save_proto, tmp_path):
    source = save_proto(chain(), "chain.onnx")
    out = tmp_path / "piece.onnx"
    result = cli("extract", source, out, "--outputs", "c")  # inputs default to the source's: x and s
    assert result.returncode == 0, result.stderr
    piece = onnx.load(out)
    assert [i.name for i in piece.graph.initializer] == ["w"]  # not unused_weight (16 KB), zero1, eight1
    assert [i.name for i in piece.graph.input] == ["x", "s"]
    assert "1 initializers (32 B of the source's" in result.stdout
    # Same source and cut, same bytes.
    again = extract_piece(source, tmp_path / "again.onnx", ["x", "s"], ["c"], feeds=_feeds(source))
    assert again.files[0].path.read_bytes() == out.read_bytes()


def _feeds(path, samples: int = 2):
    model = load_model(path)
    return [random_inputs(model, seed=i) for i in range(samples)]


def test_a_shape_inference_cannot_tell_comes_from_running(save_proto, tmp_path):
    source = save_proto(data_dependent_shape(), "dd.onnx")
    out = tmp_path / "piece.onnx"
    result = extract_piece(source, out, ["t"], ["y"], feeds=_feeds(source))
    assert result.typed_by_running == ["t", "y"] and result.comparison.passed
    assert _io(out) == {"t": (TensorProto.FLOAT, [2, 8]), "y": (TensorProto.FLOAT, [2, 8])}
    onnx.checker.check_model(onnx.load(out), full_check=True)


def test_a_missing_type_is_filled_from_observed_values():
    model = ir.from_proto(chain())
    values = ir.convenience.create_value_mapping(model.graph)
    values["b"].dtype, values["b"].shape = None, None  # what an unknown op leaves behind
    observed = {"b": [np.zeros((3, 8), np.float32), np.zeros((5, 8), np.float32)]}
    extract = ExtractPass(["b", "d"], ["c"], observed=observed, static_dims=True)(model)
    piece = extract.model
    b = piece.graph.inputs[0]
    assert extract.typed_by_running == ["b"]
    # The batch differs between samples: a named dim, not a number.
    assert b.dtype == ir.DataType.FLOAT and [str(d) for d in b.shape] == ["b_dim0", "8"]


@pytest.mark.parametrize(
    ("inputs", "outputs", "needles"),
    [
        ("bb", "y", ["--inputs: no tensor named 'bb'", "nearest: b"]),
        ("b,d", "tahn_out", ["--outputs: no tensor named 'tahn_out'"]),
        ("b", "y", ["output 'y' needs 'd'", "graph input(s) 's'", "add 'd' to --inputs"]),
        ("x", "y", ["output 'y' needs 'd'"]),
        ("unused_weight_slice", "z", ["output 'z' needs graph input 'x'", "add 'x' to --inputs"]),
        ("a", "z", ["output 'z' does not depend on the given inputs", "graph input(s) 'x'"]),
        ("x,c", "a,y", ["the cut has a cycle", "output 'a' feeds input 'c'", "a -> b -> c"]),
        ("b,b", "y", ["--inputs names 'b' twice"]),
        ("c", "c", ["'c' is both an input and an output"]),
    ],
)
def test_bad_cuts_name_the_tensor_at_fault(save_proto, inputs, outputs, needles):
    source = save_proto(chain(), "chain.onnx")
    with pytest.raises(UsageError) as caught:
        plan_cut(load_model(source), inputs.split(","), outputs.split(","), source)
    message = caught.value.one_line()
    assert message.startswith(f"{source}: ")
    for needle in needles:
        assert needle in message


def test_bad_cuts_are_one_line_exit_2_and_write_nothing(cli, save_proto, tmp_path):
    source = save_proto(chain(), "chain.onnx")
    out_dir = tmp_path / "out"
    result = cli("extract", source, out_dir / "piece.onnx", "--inputs", "x,c", "--outputs", "a,y")
    assert_one_line_error(result, str(source), "the cut has a cycle", "a -> b -> c")
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_a_piece_that_does_not_match_is_not_written(cli, save_proto, tmp_path):
    """RandomNormalLike in the piece: it cannot reproduce the source's values, so the gate refuses it."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("RandomNormalLike", ["a"], ["noise"]),
        helper.make_node("Add", ["a", "noise"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "noisy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    source = save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "noisy.onnx")
    result = cli("extract", source, tmp_path / "out" / "piece.onnx", "--inputs", "a", "--outputs", "y")
    assert_one_line_error(result, "piece.onnx", "verification failed, piece not written", "output 'y'", code=1)
    assert not (tmp_path / "out").exists()  # not even the folder made for it


def test_exposed_values_without_links_fall_back_to_a_copy(save_proto, tmp_path, monkeypatch):
    """Weights stay in their files (hard links); where links fail they are copied, with the same values."""
    source = save_proto(chain(), "chain.onnx")
    save_model(load_model(source), tmp_path / "ext.onnx", external_data=True)
    model = load_model(tmp_path / "ext.onnx")
    values = ir.convenience.create_value_mapping(model.graph)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    s = np.zeros((3, 8), np.float32)
    feeds = [{"x": x, "s": s}]
    linked = exposed.run_exposed(model, [values["b"], values["z"]], feeds, near=[tmp_path])
    np.testing.assert_allclose(linked[0]["b"], np.maximum(x, 0) * np.linspace(-1, 1, 8, dtype=np.float32))

    def no_links(*_):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    copied = exposed.run_exposed(model, [values["b"], values["z"]], feeds, near=[tmp_path])
    np.testing.assert_array_equal(copied[0]["b"], linked[0]["b"])
    np.testing.assert_array_equal(copied[0]["z"], linked[0]["z"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".onnxsmith-exposed-")]  # cleaned up


def test_a_piece_past_the_protobuf_limit_goes_to_external_data(save_proto, tmp_path, monkeypatch):
    from onnxsmith.io import save as save_module

    monkeypatch.setattr(save_module, "PROTOBUF_LIMIT", 1024)  # the piece's 16 KB weight is "past 2 GB"
    monkeypatch.setattr(save_module, "_STRUCTURE_MARGIN", 0)
    source = save_proto(chain(), "chain.onnx")
    result = extract_piece(source, tmp_path / "piece.onnx", ["x"], ["z"], feeds=_feeds(source))
    assert [f.path.name for f in result.files] == ["piece.onnx", "piece.onnx.data"] and result.comparison.passed
    assert result.initializer_bytes == 64 * 64 * 4 + 16
