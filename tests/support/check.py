"""Checking a pass the way every pass is checked: run before and after in onnxruntime, compare."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
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


def run_in_memory(
    model: onnx.ModelProto | ir.Model, feeds_list: list[dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """Every output on every input set, from an in-memory session running the graph as it is
    (no onnxruntime optimisations, which could hide what a pass did), one thread."""
    import onnxruntime as ort

    proto = ir.serde.serialize_model(model) if isinstance(model, ir.Model) else model
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, feeds))) for feeds in feeds_list]


def assert_same_outputs(
    before: onnx.ModelProto | ir.Model,
    after: onnx.ModelProto | ir.Model,
    feeds_list: list[dict[str, np.ndarray]],
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> None:
    """Both models on the same inputs: the same outputs (names, dtypes, shapes), integers and bools
    equal, floats within ``atol + rtol * |before|``, NaN and inf where ``before`` has them."""
    for sample, (want, got) in enumerate(zip(run_in_memory(before, feeds_list), run_in_memory(after, feeds_list))):
        assert list(got) == list(want), f"outputs {list(got)} != {list(want)}"
        for name, expected in want.items():
            actual = got[name]
            where = f"output '{name}', input set {sample}"
            assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
                f"{where}: {actual.dtype}{list(actual.shape)} != {expected.dtype}{list(expected.shape)}"
            )
            if expected.dtype.kind in "fc":
                np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol, equal_nan=True, err_msg=where)
            else:
                np.testing.assert_array_equal(actual, expected, err_msg=where)


def ops_onnxruntime_runs(path: Path, optimized: Path, config: dict[str, str] | None = None) -> list[str]:
    """The op types of the graph onnxruntime runs after its own load-time fusions (CPU, every optimisation
    on, the session ``config`` entries), written to ``optimized``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized)
    options.log_severity_level = 3
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(optimized), load_external_data=False).graph.node]
