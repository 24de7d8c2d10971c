"""A generator of broken and malicious model files: each kind is what a hostile or unlucky user hands us.

:func:`make_all` writes every kind into its own folder (a kind may need more files beside its
model: external data, a symbolic link) and returns, per kind, the model's path and a phrase the
one-line refusal must contain. Every kind is refused when the model is loaded, so every command
that takes a model must exit 2 on each of them without writing anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.models import mlp, with_if_subgraph

OPSET = 17


def _model(nodes, inits=(), inputs=None, outputs=None, opset=OPSET, ir_version=None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "broken",
        inputs if inputs is not None else [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        outputs if outputs is not None else [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def _add_w(tensor: onnx.TensorProto, **kwargs) -> onnx.ModelProto:
    """y = x + w, with ``w`` as given (usually broken)."""
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [tensor], **kwargs)


def _raw(name: str, dims: list[int], raw: bytes, data_type: int = TensorProto.FLOAT) -> onnx.TensorProto:
    tensor = TensorProto(name=name, data_type=data_type, dims=dims)
    tensor.raw_data = raw
    return tensor


def _ones(n: int = 8) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(n, np.float32), "w")


def _save(folder: Path, model: onnx.ModelProto, name: str = "model.onnx") -> Path:
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


def _bytes(folder: Path, data: bytes) -> Path:
    path = folder / "model.onnx"
    path.write_bytes(data)
    return path


def _external(
    folder: Path, location: str, *, offset: int = 0, length: int | None = 32, data: bytes | None = b"\0" * 32
) -> Path:
    """y = x + w with w[8] float kept in an external data file at ``location`` (written unless ``data`` is None)."""
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[8], data_location=TensorProto.EXTERNAL)
    entries = [("location", location), ("offset", str(offset))] + (
        [("length", str(length))] if length is not None else []
    )
    for key, value in entries:
        tensor.external_data.add(key=key, value=value)
    if data is not None and not os.path.isabs(location) and ".." not in location:
        (folder / location).write_bytes(data)
    return _save(folder, _add_w(tensor))


def _good_bytes() -> bytes:
    return mlp(hidden=64).SerializeToString()


def _truncated(fraction: float) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        data = _good_bytes()
        return _bytes(folder, data[: max(1, int(len(data) * fraction))])

    return make


def _cycle(folder: Path) -> Path:
    nodes = [
        helper.make_node("Relu", ["b"], ["a"], name="r1"),
        helper.make_node("Relu", ["a"], ["b"], name="r2"),
        helper.make_node("Add", ["x", "a"], ["y"], name="add"),
    ]
    return _save(folder, _model(nodes))


def _undefined_in_subgraph(folder: Path) -> Path:
    model = with_if_subgraph()
    branch = model.graph.node[-1].attribute[0].g
    branch.node[0].input[0] = "nowhere"
    return _save(folder, model)


def _escape_outside(folder: Path) -> Path:
    """location '../victim.bin': a real file one folder up (what CVE-2024-27318 reads)."""
    (folder.parent / "victim.bin").write_bytes(b"\x01" * 32)
    return _external(folder, "../victim.bin")


def _absolute(folder: Path) -> Path:
    victim = folder.parent / "absolute-victim.bin"
    victim.write_bytes(b"\x02" * 32)
    return _external(folder, os.fspath(victim))


def _symlink_outside(folder: Path) -> Path:
    victim = folder.parent / "linked-victim.bin"
    victim.write_bytes(b"\x03" * 32)
    (folder / "weights.bin").symlink_to(victim)
    return _external(folder, "weights.bin", data=None)


def _symlinked_folder_outside(folder: Path) -> Path:
    outside = folder.parent / "outside-folder"
    outside.mkdir(exist_ok=True)
    (outside / "w.bin").write_bytes(b"\x04" * 32)
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    return _external(folder, "sub/w.bin", data=None)


def _data_is_folder(folder: Path) -> Path:
    (folder / "w.bin").mkdir()
    return _external(folder, "w.bin", data=None)


def _data_is_fifo(folder: Path) -> Path:
    os.mkfifo(folder / "w.bin")  # reading it would wait forever
    return _external(folder, "w.bin", data=None)


def _model_is_fifo(folder: Path) -> Path:
    path = folder / "model.onnx"
    os.mkfifo(path)
    return path


def _model_is_device(folder: Path) -> Path:
    path = folder / "model.onnx"
    path.symlink_to("/dev/zero")
    return path


def _two_writers(folder: Path) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="first"), helper.make_node("Neg", ["x"], ["y"], name="second")]
    return _save(folder, _model(nodes))


def _duplicate_initializers(folder: Path) -> Path:
    model = _add_w(_ones())
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(8, np.float32), "w"))
    return _save(folder, model)


def _no_elem_type(folder: Path) -> Path:
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")])
    model.graph.input[0].type.tensor_type.elem_type = 0
    return _save(folder, model)


def _no_type(folder: Path) -> Path:
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")])
    model.graph.input[0].ClearField("type")
    return _save(folder, model)


def _const_bad_raw(folder: Path) -> Path:
    value = _raw("v", [8], b"\0" * 3)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=value, name="const"),
        helper.make_node("Add", ["x", "w"], ["y"], name="add"),
    ]
    return _save(folder, _model(nodes))


def _big_lazy_truncated(folder: Path) -> Path:
    """A 33 MB file (read through a memory map) cut inside a weight."""
    w = numpy_helper.from_array(np.zeros((8, 1024 * 1024), np.float32), "w")
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [w],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1024 * 1024])],
    )
    data = model.SerializeToString()
    return _bytes(folder, data[: len(data) - 1024])


def _with_sequence_op_mismatch(folder: Path) -> Path:
    nodes = [helper.make_node("Add", ["x", "i"], ["y"], name="add")]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
        helper.make_tensor_value_info("i", TensorProto.INT64, ["batch", 8]),
    ]
    return _save(folder, _model(nodes, inputs=inputs))


def _bad_float_data(folder: Path) -> Path:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[8])
    tensor.float_data.extend([1.0, 2.0])
    return _save(folder, _add_w(tensor))


def _no_graph_output_producer(folder: Path) -> Path:
    model = mlp()
    model.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, [1]))
    return _save(folder, model)


def _undefined_input(folder: Path) -> Path:
    model = mlp()
    model.graph.node[2].input[0] = "nowhere"
    return _save(folder, model)


def _no_opset(folder: Path) -> Path:
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")])
    del model.opset_import[:]
    return _save(folder, model)


def _unknown_domain(folder: Path) -> Path:
    return _save(folder, _model([helper.make_node("Frob", ["x"], ["y"], domain="evil.example", name="frob")]))


#: kind -> (writer into an empty folder returning the model path, phrase the refusal contains)
KINDS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "empty file": (lambda f: _bytes(f, b""), "file is empty"),
    "random bytes": (lambda f: _bytes(f, np.random.default_rng(1).bytes(4096)), "not a valid ONNX"),
    "zeros": (lambda f: _bytes(f, b"\0" * 1000), "not a"),
    "text": (lambda f: _bytes(f, b"ir_version: 8\ngraph { name: 'x' }\n"), "not a"),
    "gzip bytes": (lambda f: _bytes(f, b"\x1f\x8b\x08\x00" + bytes(range(200))), "not a valid ONNX"),
    "truncated at 1 byte": (_truncated(0.0), "not a"),
    "truncated at 10%": (_truncated(0.1), "not a valid ONNX"),
    "truncated at 50%": (_truncated(0.5), "not a valid ONNX"),
    "truncated at 99%": (_truncated(0.99), "not a valid ONNX"),
    "big file truncated in a weight": (_big_lazy_truncated, "not a valid ONNX"),
    "a GraphProto": (lambda f: _bytes(f, mlp().graph.SerializeToString()), "not an ONNX model"),
    "a TensorProto": (lambda f: _bytes(f, _ones().SerializeToString()), "not a"),
    "a NodeProto": (lambda f: _bytes(f, helper.make_node("Relu", ["x"], ["y"]).SerializeToString()), "not a"),
    "IR version 0": (lambda f: _save(f, _model([helper.make_node("Relu", ["x"], ["y"])], ir_version=0)), "IR version"),
    "IR version 2": (
        lambda f: _save(f, _model([helper.make_node("Relu", ["x"], ["y"])], ir_version=2)),
        "IR version 2",
    ),
    "IR version from the future": (
        lambda f: _save(f, _model([helper.make_node("Relu", ["x"], ["y"])], ir_version=onnx.IR_VERSION + 5)),
        f"IR version {onnx.IR_VERSION + 5}",
    ),
    "opset 99": (lambda f: _save(f, _model([helper.make_node("Relu", ["x"], ["y"])], opset=99)), "opset 99"),
    "opset 0": (lambda f: _save(f, _model([helper.make_node("Relu", ["x"], ["y"])], opset=0)), "opset 0"),
    "no opset import": (_no_opset, "opset"),
    "unknown op": (lambda f: _save(f, _model([helper.make_node("Frobnicate", ["x"], ["y"])])), "Frobnicate"),
    "unknown domain": (_unknown_domain, "evil.example"),
    "cycle": (_cycle, "not a DAG"),
    "undefined input": (_undefined_input, "reads 'nowhere'"),
    "undefined read in a subgraph": (_undefined_in_subgraph, "reads 'nowhere'"),
    "graph output nobody produces": (_no_graph_output_producer, "graph output 'ghost'"),
    "two nodes write one value": (_two_writers, "'y' is written twice"),
    "duplicate initializer names": (_duplicate_initializers, "two initializers are named 'w'"),
    "dims of 2^40 with 32 bytes of data": (lambda f: _save(f, _add_w(_raw("w", [2**40], b"\0" * 32))), "disagrees"),
    "raw_data shorter than the shape": (lambda f: _save(f, _add_w(_raw("w", [8], b"\0" * 31))), "disagrees"),
    "raw_data longer than the shape": (lambda f: _save(f, _add_w(_raw("w", [8], b"\0" * 33))), "disagrees"),
    "float_data shorter than the shape": (_bad_float_data, "float_data"),
    "negative dim": (lambda f: _save(f, _add_w(_raw("w", [-8], b""))), "negative dim"),
    "unknown data type": (lambda f: _save(f, _add_w(_raw("w", [8], b"\0" * 32, data_type=999))), "data type"),
    "Constant with bad raw data": (_const_bad_raw, "disagrees"),
    "graph input without element type": (_no_elem_type, "graph input 'x' has no element type"),
    "graph input without type": (_no_type, "graph input 'x' has no type"),
    "attribute of the wrong type": (
        lambda f: _save(f, _model([helper.make_node("Softmax", ["x"], ["y"], axis="zero", name="sm")])),
        "axis",
    ),
    "too few inputs": (lambda f: _save(f, _model([helper.make_node("Add", ["x"], ["y"], name="add")])), "input size"),
    "input types disagree": (_with_sequence_op_mismatch, "onnx.checker"),
    "output shape disagrees with inference": (
        lambda f: _save(
            f,
            _model(
                [helper.make_node("Relu", ["x"], ["y"], name="relu")],
                outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 9])],
            ),
        ),
        "onnx.checker",
    ),
    "external data missing": (lambda f: _external(f, "w.bin", data=None), "is missing"),
    "external data file too short": (lambda f: _external(f, "w.bin", data=b"\0" * 16), "too short"),
    "external length shorter than the shape": (lambda f: _external(f, "w.bin", length=16), "disagrees"),
    "external offset not a number": (lambda f: _external(f, "w.bin", offset="x"), "not an integer"),  # type: ignore[arg-type]
    "external offset negative": (lambda f: _external(f, "w.bin", offset=-4), "negative"),
    "external data under ../": (_escape_outside, "'..'"),
    "external data at an absolute path": (_absolute, "absolute path"),
    "external data through a symlink outside": (_symlink_outside, "symbolic link"),
    "external data in a symlinked folder outside": (_symlinked_folder_outside, "symbolic link"),
    "external data is a folder": (_data_is_folder, "not a regular file"),
    "external data is a fifo": (_data_is_fifo, "not a regular file"),
    "external location empty": (lambda f: _external(f, "", data=None), "empty location"),
    "model is a folder": (lambda f: (f / "model.onnx").mkdir() or f / "model.onnx", "is a folder"),
    "model is a fifo": (_model_is_fifo, "not a regular file"),
    "model is a device": (_model_is_device, "not a regular file"),
    "model is missing": (lambda f: f / "model.onnx", "no such file"),
}


def make_all(root: Path) -> dict[str, tuple[Path, str]]:
    """Every kind written under ``root`` (one folder each): kind -> (model path, phrase of its refusal)."""
    made = {}
    for index, (kind, (write, phrase)) in enumerate(KINDS.items()):
        folder = root / f"kind{index:02d}"
        folder.mkdir(parents=True)
        made[kind] = (write(folder), phrase)
    return made
