"""runtime/int8_measure.py: the probe that measures the outputs' error of any set of int8 Linears in one session."""

from __future__ import annotations

import numpy as np
import pytest

from onnxsmith.io.load import load_model
from onnxsmith.passes.quantize_linears import LinearPlan, find_linears, smoothing_factors
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.runtime.int8_measure import SensitivityProbe, measure_inputs, unsmoothed_name
from tests.support.fusion import FACEAGE


def test_a_smoothed_linears_unsmoothed_form_is_measured_in_the_same_probe():
    source = FACEAGE["dynamo"]
    model = load_model(source)
    feeds = [random_inputs(model, seed=0)]
    linears = [linear for linear in find_linears(model) if min(linear.kn()) >= 16]
    stats = measure_inputs(source, feeds)
    smoothed = {
        linear.name: LinearPlan(smoothing_factors(stats[linear.name].channel_absmax, [linear.weight_array()], 0.75))
        for linear in linears
    }
    names = set(smoothed)
    plain = SensitivityProbe(source, feeds, dict.fromkeys(names, LinearPlan()))
    both = SensitivityProbe(source, feeds, smoothed, unsmoothed=names)
    try:
        unsmoothed_error = plain.error(names)
        assert both.error(set()) == 0.0  # every switch off: the source
        assert both.error({unsmoothed_name(n) for n in names}) == pytest.approx(unsmoothed_error, rel=1e-5)
        smoothed_error = both.error(names)
        assert smoothed_error > 0 and not np.isclose(smoothed_error, unsmoothed_error, rtol=1e-3)
        # the unsmoothed form wins where both are switched on
        assert both.error(names | {unsmoothed_name(n) for n in names}) == pytest.approx(unsmoothed_error, rel=1e-5)
    finally:
        plain.close()
        both.close()
