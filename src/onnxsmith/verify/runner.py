"""Running models in onnxruntime, from a file or from an in-memory onnx-ir model."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from onnxsmith.errors import InputError
from onnxsmith.io.save import save_model

CPU = ["CPUExecutionProvider"]


def session_options(*, optimize: bool = True, threads: int | None = None, config: dict[str, str] | None = None):
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only; onnxsmith reports what matters itself
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return options


def open_session(
    model: ir.Model | str | os.PathLike,
    *,
    providers: list[str] | None = None,
    options: ort.SessionOptions | None = None,
    label: str | os.PathLike | None = None,
) -> ort.InferenceSession:
    """An onnxruntime session; an in-memory model is written to a temporary file first."""
    providers = providers or CPU
    options = options or session_options()
    if isinstance(model, ir.Model):
        with tempfile.TemporaryDirectory(prefix="onnxsmith-run-") as tmp:
            path = Path(tmp) / "model.onnx"
            save_model(model, path)
            return _session(path, options, providers, label or "<in-memory model>")
    return _session(Path(model), options, providers, label or model)


def _session(path: Path, options, providers, label) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(os.fspath(path), sess_options=options, providers=providers)
    except Exception as err:  # onnxruntime raises its own exception types
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"onnxruntime cannot load the model: {message}", label) from None


def run(
    session: ort.InferenceSession,
    feeds: dict[str, np.ndarray],
    outputs: list[str] | None = None,
    *,
    label: str | os.PathLike | None = None,
) -> dict[str, np.ndarray]:
    """Outputs by name."""
    names = outputs or [o.name for o in session.get_outputs()]
    try:
        values = session.run(names, feeds)
    except Exception as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"onnxruntime failed to run the model: {message}", label) from None
    return dict(zip(names, values))
