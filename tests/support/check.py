"""Checking a pass the way every pass is checked: run before and after in onnxruntime, compare."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxsmith.io.save import save_model
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.verify.compare import Comparison, compare_models


def save_ir(model: ir.Model, path: Path) -> Path:
    save_model(model, path)
    return path


def assert_pass_preserves_outputs(
    before: Path,
    after: ir.Model | Path,
    tmp_path: Path,
    *,
    feeds: list[dict[str, np.ndarray]] | None = None,
    samples: int = 2,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    **input_options,
) -> Comparison:
    """Run ``before`` (a file) and ``after`` (a model or file) on the same inputs; assert they agree."""
    if isinstance(after, ir.Model):
        after = save_ir(after, tmp_path / "after.onnx")
    if feeds is None:
        from onnxsmith.io.load import load_model

        model = load_model(before)
        feeds = [random_inputs(model, seed=s, **input_options) for s in range(samples)]
    comparison = compare_models(before, after, copy.deepcopy(feeds), atol=atol, rtol=rtol)
    assert comparison.passed, comparison.failures()
    return comparison
