"""measure_ranges as the fp16 transform uses it: the model's own outputs from the same run, and the
ranges of pure data movement derived from its inputs instead of measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxsmith.io.load import load_model
from onnxsmith.probes.ranges import DATA_MOVEMENT_OPS, measure_ranges
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.runtime.runner import prepare_session, run_all

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "faceage_torchscript.onnx"


def test_outputs_of_the_calibration_run_and_derived_movement():
    feeds = [random_inputs(load_model(FIXTURE), seed=s) for s in range(2)]
    outputs: dict[str, np.ndarray] = {}
    derived = {r.name: r for r in measure_ranges(FIXTURE, feeds, outputs=outputs, derive_movement=True)}
    measured = {r.name: r for r in measure_ranges(FIXTURE, feeds)}

    # The instrumented run gives the model's outputs, as a plain run does.
    session, model, _ = prepare_session(FIXTURE)
    plain = run_all(session, model, feeds, FIXTURE)
    assert outputs.keys() == plain.keys()
    for name, value in plain.items():
        np.testing.assert_allclose(outputs[name], value, atol=1e-3, rtol=1e-3)

    # Every tensor still has a range; data movement gets its input's, an upper bound.
    assert derived.keys() == measured.keys()
    moved = [r for r in derived.values() if r.op_type in DATA_MOVEMENT_OPS and r.elements == 0]
    assert len(moved) > 50
    for r in moved:
        assert r.absmax >= measured[r.name].absmax * (1 - 1e-4)
    # The planted massive activation is found either way (channel 57 of the residual stream).
    stream = "/backbone/model/layer.0/Add_1_output_0"
    assert derived[stream].absmax == pytest.approx(measured[stream].absmax, rel=1e-4)
    assert derived[stream].absmax > 65504
    # Element counts come with every measured tensor (the cost rule needs them).
    assert measured[stream].elements == 201 * 128  # batch 1, 201 tokens, hidden 128
