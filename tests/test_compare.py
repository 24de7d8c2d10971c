"""The verification harness and `onnxsmith compare`."""

from __future__ import annotations

import json

import numpy as np
import onnx

from onnxsmith.io.load import load_model
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.verify.compare import compare_models
from onnxsmith.verify.gate import Bounds, GateOptions, judge_output
from tests.support.models import mlp


def test_identical_models_pass_and_perturbed_fail(cli, save_proto):
    a = save_proto(mlp(), "a.onnx")
    b = save_proto(mlp(), "b.onnx")
    perturbed = mlp()
    perturbed.graph.initializer[3].raw_data = (
        (onnx.numpy_helper.to_array(perturbed.graph.initializer[3]) + np.float32(0.01)).astype(np.float32).tobytes()
    )
    c = save_proto(perturbed, "c.onnx")
    ok = cli("compare", a, b, "--shape", "batch=3", "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["passed"] and report["outputs"][0]["shape"] == [3, 4]
    assert report["modes"] == {"reference": "native", "candidate": "native"}
    bad = cli("compare", a, c)
    assert bad.returncode == 1
    assert "fails the gate" in bad.stdout and "would accept it" in bad.stdout
    assert cli("compare", a, c, "--atol", "0.02", "--min-cosine", "0.99").returncode == 0


def test_npz_inputs(cli, save_proto, tmp_path):
    a = save_proto(mlp(), "a.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32))
    result = cli("compare", a, a, "--inputs", tmp_path / "x.npz", "--json")
    assert json.loads(result.stdout)["outputs"][0]["shape"] == [5, 4]


def test_metrics():
    ref = np.array([[[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]])
    test = ref + np.array([[[0.0, 0.5, 0.0], [0.0, 0.0, 3.0]]])
    d = judge_output("y", ref, test, Bounds.for_format())
    assert d.max_abs == 3.0 and d.shape == (2, 3)
    assert d.argmax_agreement == 0.5  # the second row's argmax moved
    assert not d.passed
    nan = test.copy()
    nan[0, 0, 0] = np.nan
    d = judge_output("y", ref, nan, Bounds.for_format(options=GateOptions(min_cosine=-1, atol=10)))
    assert d.nonfinite_test == 1 and not d.passed  # a new NaN fails whatever the bounds


def test_random_inputs_are_seeded_and_fit_token_tables(save_proto):
    model = load_model(save_proto(mlp()))
    a = random_inputs(model, seed=3)
    b = random_inputs(model, seed=3)
    np.testing.assert_array_equal(a["x"], b["x"])
    assert a["x"].shape == (1, 8)


def test_compare_models_api_multiple_samples(save_proto):
    path = save_proto(mlp())
    model = load_model(path)
    feeds = [random_inputs(model, seed=s) for s in range(3)]
    comparison = compare_models(path, path, feeds)
    assert comparison.passed and comparison.samples == 3


def test_symbolic_dim_expressions_add_up():
    from onnxsmith.runtime.inputs import InputSpec, resolve_shape

    mask = InputSpec("attention_mask", np.dtype(np.int64), ("batch_size", "past_sequence_length + sequence_length"))
    assert resolve_shape(mask, {}, {}) == (1, 8)  # an empty cache plus the default sequence
    assert resolve_shape(mask, {}, {"past_sequence_length": 3, "sequence_length": 5}) == (1, 8)
    assert resolve_shape(mask, {}, {"sequence_length": 12}) == (1, 12)
