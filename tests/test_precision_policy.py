"""The constant rule of analysis/precision_policy.py: which weights fp16 storage would wreck."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxsmith.analysis.precision_policy import (
    CONSTANT_ROUNDING,
    Limits,
    _rounding_bound_holds,
    rounding_error,
    unsafe_constant,
)

FP16 = Limits.for_dtype(ir.DataType.FLOAT16)


def _tensor(values) -> ir.Tensor:
    return ir.tensor(np.asarray(values, dtype=np.float32))


def test_an_ordinary_weight_is_safe():
    rng = np.random.default_rng(0)
    assert unsafe_constant(_tensor(rng.normal(0, 0.02, (256, 256))), FP16) is None


def test_a_weight_below_the_normal_range_is_not():
    rng = np.random.default_rng(1)
    reason = unsafe_constant(_tensor(rng.normal(0, 1e-7, (64, 64))), FP16)
    assert reason is not None and "below fp16's normal range" in reason


def test_a_clamp_of_1e_9_stays_fp32_and_a_few_tiny_values_in_a_big_weight_do_not_matter():
    assert unsafe_constant(_tensor([1e-9]), FP16) is not None
    rng = np.random.default_rng(2)
    weight = rng.normal(0, 0.05, 10_000)
    weight[:50] = 1e-9  # judged as a whole: 0.5 % of the values cannot move its norm
    assert unsafe_constant(_tensor(weight), FP16) is None


@pytest.mark.parametrize("exponent", range(-10, 3))
def test_the_rms_shortcut_never_passes_a_weight_the_exact_check_refuses(exponent):
    """Where the shortcut says "safe", rounding really moves the weight by at most 2^-5 of its size,
    at every scale, including the ones around fp16's subnormal range where it stops answering."""
    rng = np.random.default_rng(exponent + 100)
    for values in (
        rng.normal(0, 10.0**exponent, 4096),
        rng.uniform(0, 10.0**exponent, 4096),
        rng.standard_t(2, 4096) * 10.0**exponent,
    ):
        values = values.astype(np.float32)
        if _rounding_bound_holds(values, FP16.min_normal):
            assert rounding_error(values) <= CONSTANT_ROUNDING
    # ... and it does answer for the weights of real models (RMS 1e-4 and up)
    if exponent >= -4:
        assert _rounding_bound_holds(rng.normal(0, 10.0**exponent, 4096).astype(np.float32), FP16.min_normal)
