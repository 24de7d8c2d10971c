"""Storage-faithful fp16: catches the overflow onnxruntime's CPU provider hides."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort

from onnxsmith.runtime import runner
from onnxsmith.runtime.runner import FAITHFUL, prepare_session
from onnxsmith.verify.diagnose import first_nonfinite
from tests.support.models import overflowing_fp16

X = np.array([[100, 1, 2, 3]], np.float16)  # 100 * 1000 = 1e5 > 65,504


def test_plain_cpu_hides_the_overflow_storage_faithful_mode_catches_it(save_proto):
    path = save_proto(overflowing_fp16())
    plain = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    assert np.isfinite(plain).all()  # onnxruntime computed Mul/Relu/Sub in fp32 and never saw inf
    session, _, mode = prepare_session(path)
    assert mode == FAITHFUL
    faithful = runner.run(session, {"x": X})["y"]
    assert np.isnan(faithful).all()  # inf - 60000 = inf; softmax of inf is NaN, as on a GPU


def test_in_range_values_are_unchanged(save_proto):
    path = save_proto(overflowing_fp16())
    x = np.array([[0.5, 0.01, 2, 3]], np.float16)
    plain = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session, _, _ = prepare_session(path)
    np.testing.assert_allclose(
        runner.run(session, {"x": x})["y"].astype(np.float32), plain.astype(np.float32), atol=1e-3
    )


def test_first_nonfinite_names_the_culprit(save_proto):
    culprit = first_nonfinite(save_proto(overflowing_fp16()), {"x": X})
    assert culprit is not None and culprit.tensor == "a" and culprit.op_type == "Mul"


def test_compare_says_which_mode(cli, save_proto):
    path = save_proto(overflowing_fp16())
    np.savez(path.parent / "x.npz", x=np.array([[10, 20, 30, 40]], np.float16))  # finite: X's NaN is no evidence
    result = cli("compare", path, path, "--inputs", path.parent / "x.npz", "--json")
    assert json.loads(result.stdout)["modes"]["candidate"] == FAITHFUL
    native = cli("compare", path, path, "--inputs", path.parent / "x.npz", "--json", "--fp16-mode", "native")
    assert json.loads(native.stdout)["modes"]["candidate"] == "native"


def test_exporter_fixture_plain_fp16_conversion_overflows_storage_faithfully(tmp_path):
    """The face-age fixture's residual channel (~1.4e5) overflows fp16 storage: every output is NaN."""
    import onnx
    from onnxconverter_common import float16

    from tests.conftest import FIXTURES

    converted = float16.convert_float_to_float16(onnx.load(FIXTURES / "faceage_dynamo.onnx"), keep_io_types=True)
    path = tmp_path / "plain_fp16.onnx"
    onnx.save(converted, path)
    face = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    session, _, mode = prepare_session(path)
    assert mode == FAITHFUL
    faithful = runner.run(session, {"face": face})
    assert all(np.isnan(o).all() for o in faithful.values())
