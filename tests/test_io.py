"""Model I/O: lazy loading, streamed deterministic atomic saving, external data, provenance."""

from __future__ import annotations

import errno
import io
import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnxsmith.core.errors import OutputError, UsageError
from onnxsmith.io import load as load_module
from onnxsmith.io import save as save_module
from onnxsmith.io.files import sha256_file
from onnxsmith.io.load import load_model
from onnxsmith.io.save import PROVENANCE_KEY, Provenance, save_model, write_single_file
from tests.support.models import mlp, with_if_subgraph


def _run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_streamed_file_equals_canonical_serialization(save_proto):
    path = save_proto(mlp(hidden=600))  # w1 is 19 KB: streamed, b2 is inline
    model = ir.load(path)
    model.graph.node(0).outputs[0].dtype = ir.DataType.FLOAT  # an inner value's type: stated, so written
    buffer = io.BytesIO()
    write_single_file(model, buffer)
    canonical = ir.serde.serialize_model(model)
    # onnx-ir restates each initializer's dtype and dims as value_info: the file leaves those out.
    assert sorted(v.name for v in canonical.graph.value_info) == ["b1", "b2", "h0", "w1", "w2"]
    written = onnx.load_from_string(buffer.getvalue())
    assert [v.name for v in written.graph.value_info] == ["h0"]
    del canonical.graph.value_info[:]
    canonical.graph.value_info.extend(written.graph.value_info)
    assert buffer.getvalue() == canonical.SerializeToString()


def test_lazy_load_keeps_weights_on_disk_and_round_trips(save_proto, tmp_path, monkeypatch):
    path = save_proto(mlp(hidden=600))
    monkeypatch.setattr(load_module, "LAZY_TENSOR_BYTES", 1024)
    model = load_model(path, lazy_file_bytes=1)
    w1 = model.graph.initializers["w1"].const_value
    assert isinstance(w1, ir.ExternalTensor) and w1.path == str(path)
    np.testing.assert_array_equal(w1.numpy(), onnx.numpy_helper.to_array(onnx.load(path).graph.initializer[0]))
    out = tmp_path / "copy.onnx"
    save_model(model, out)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(path, x), _run(out, x))


def test_save_is_deterministic(save_proto, tmp_path):
    source = save_proto(mlp())
    digests = set()
    for name in ("a.onnx", "b.onnx"):
        model = load_model(source)
        records = save_model(
            model,
            tmp_path / name,
            provenance=Provenance("mlp.onnx", sha256_file(source), [{"name": "x", "options": {"k": 1}}]),
        )
        digests.add(records[0].sha256)
    assert len(digests) == 1


def test_provenance_is_stamped(save_proto, tmp_path):
    source = save_proto(mlp())
    model = load_model(source)
    save_model(
        model,
        tmp_path / "out.onnx",
        provenance=Provenance("model.onnx", sha256_file(source), [{"name": "fp16", "options": {}}]),
    )
    proto = onnx.load(tmp_path / "out.onnx")
    assert proto.producer_name == "onnxsmith"
    stamp = json.loads({p.key: p.value for p in proto.metadata_props}[PROVENANCE_KEY])
    assert stamp["source"]["sha256"] == sha256_file(source)
    assert stamp["steps"] == [{"name": "fp16", "options": {}}]


def test_external_data_forced_and_automatic(save_proto, tmp_path, monkeypatch):
    source = save_proto(mlp(hidden=64))
    x = np.ones((2, 8), np.float32)
    records = save_model(load_model(source), tmp_path / "ext.onnx", external_data=True)
    assert [r.path.name for r in records] == ["ext.onnx", "ext.onnx.data"]
    np.testing.assert_array_equal(_run(source, x), _run(tmp_path / "ext.onnx", x))
    # Over the (shrunk) protobuf limit the data goes beside the model by itself.
    monkeypatch.setattr(save_module, "PROTOBUF_LIMIT", 1024)
    monkeypatch.setattr(save_module, "_STRUCTURE_MARGIN", 0)
    records = save_model(load_model(source), tmp_path / "auto.onnx")
    assert (tmp_path / "auto.onnx.data").exists() and len(records) == 2
    with pytest.raises(UsageError, match="2 GiB"):
        save_model(load_model(source), tmp_path / "single.onnx", external_data=False)


def test_external_data_model_loads_and_resaves_as_one_file(save_proto, tmp_path):
    source = save_proto(mlp(hidden=64))
    save_model(load_model(source), tmp_path / "ext.onnx", external_data=True)
    model = load_model(tmp_path / "ext.onnx")
    save_model(model, tmp_path / "one.onnx")
    assert not (tmp_path / "one.onnx.data").exists()
    x = np.ones((2, 8), np.float32)
    np.testing.assert_array_equal(_run(source, x), _run(tmp_path / "one.onnx", x))


def test_refuses_to_overwrite_input_even_its_data_file(save_proto, tmp_path):
    source = save_proto(mlp())
    with pytest.raises(UsageError, match="refusing to overwrite"):
        save_model(load_model(source), source, protect=[source])
    save_model(load_model(source), tmp_path / "ext.onnx", external_data=True)
    model = load_model(tmp_path / "ext.onnx")
    # The model's weights are read from ext.onnx.data: writing there would destroy them.
    with pytest.raises(UsageError, match="refusing to overwrite"):
        save_model(model, tmp_path / "ext.onnx", external_data=True)


def test_failed_save_leaves_nothing(save_proto, tmp_path, monkeypatch):
    source = save_proto(mlp(hidden=600))
    out_dir = tmp_path / "out"

    def broken(model, f, **_):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(save_module, "write_single_file", broken)
    with pytest.raises(OutputError, match="no space left on device"):
        save_model(load_model(source), out_dir / "m.onnx")
    assert not out_dir.exists()  # not even the folder made for it


def test_subgraph_initializers_survive(save_proto, tmp_path):
    source = save_proto(with_if_subgraph())
    save_model(load_model(source), tmp_path / "out.onnx")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(_run(source, x), _run(tmp_path / "out.onnx", x))


def test_a_big_file_passes_onnx_checker_once_until_it_changes(save_proto, tmp_path, monkeypatch):
    from onnxsmith.io import check as check_module

    calls = []
    real = check_module.check_with_onnx
    monkeypatch.setattr(check_module, "check_with_onnx", lambda proto, path: calls.append(path) or real(proto, path))
    monkeypatch.setattr(load_module, "LAZY_FILE_BYTES", 1024)
    path = save_proto(mlp(hidden=600))  # 19 KB: big, with the threshold at 1 KB
    load_model(path, lazy_file_bytes=1024)
    load_model(path, lazy_file_bytes=1024)
    assert len(calls) == 1  # the second load of the same file skips onnx.checker (our own checks still run)
    path.write_bytes(mlp(hidden=601).SerializeToString())  # another model, another size and mtime
    load_model(path, lazy_file_bytes=1024)
    assert len(calls) == 2
    out = tmp_path / "out.onnx"
    save_model(load_model(path, lazy_file_bytes=1024), out)  # checked as it is written: not again when loaded
    load_model(out, lazy_file_bytes=1024)
    assert len(calls) == 2


def test_a_model_that_fails_onnx_checker_is_never_written(save_proto, tmp_path):
    """What a pass leaves inconsistent (here: an output declared [3] that is [2]) is caught before it is written."""
    from onnx import TensorProto, helper

    from onnxsmith.core.errors import InputError

    model = ir.serde.deserialize_model(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Relu", ["x"], ["y"])],
                "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
    )
    for external in (False, True):
        with pytest.raises(InputError, match=r"out.onnx: the model made is not valid \(not a valid ONNX model"):
            save_model(model, tmp_path / "out" / "out.onnx", external_data=external)
        assert not (tmp_path / "out").exists()
