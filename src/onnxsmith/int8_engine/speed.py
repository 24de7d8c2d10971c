"""How fast int8 variants run against the fp32 model, measured: what ``int8`` promises about speed.

:class:`Int8Timer` makes variants of a model (each one a set of its planned Linears, tables and
Convs int8, made by the passes the rewrite uses), writes them to a temporary folder and times
them side by side with the fp32 model (runtime/speed.py: onnxruntime CPU, threads = cores,
round-robin, medians) on one input set. Times are comparable within one call only.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.io.load import discard_weights, load_model, release_weights
from onnxsmith.io.save import save_model
from onnxsmith.passes.quantize_convs import ConvPlan, QuantizeConvsPass
from onnxsmith.passes.quantize_linears import Int8Form, LinearPlan, QuantizeLinearsPass
from onnxsmith.passes.quantize_tables import QuantizeTablesPass
from onnxsmith.runtime.inputs import adapt_feeds
from onnxsmith.runtime.speed import seconds_per_run

#: The key of the fp32 model in what :func:`seconds_per_run` returns.
_FP32 = "fp32"


@dataclass
class Int8Timer:
    """Times int8 variants of the model at ``model_path`` against the fp32 model at ``fp32_path``.

    ``linears``, ``tables``, ``convs``: every part a variant may have int8 (name -> plan);
    ``form``: how its int8 Linears are made. ``timer(variants)``: (fp32 seconds per run, seconds per
    run of each variant), each variant the set of part names int8, timed together on ``feeds``.
    """

    model_path: str | os.PathLike
    fp32_path: str | os.PathLike
    feeds: dict[str, np.ndarray]
    linears: dict[str, LinearPlan]
    tables: set[str] = field(default_factory=set)
    convs: dict[str, ConvPlan] = field(default_factory=dict)
    form: Int8Form = field(default_factory=Int8Form)
    seconds: float = 2.0  # timing per call (at least a few rounds, however long they take)
    calls: int = 0

    def __call__(self, variants: list[set[str]]) -> tuple[float, list[float]]:
        self.calls += 1
        with tempfile.TemporaryDirectory(prefix="onnxsmith-int8-speed-") as tmp:
            paths = {_FP32: Path(self.fp32_path)}
            for i, names in enumerate(variants):
                paths[f"variant {i}"] = self._write(set(names), Path(tmp) / f"variant{i}" / "model.onnx")
            fp32 = load_model(self.fp32_path)
            feeds = adapt_feeds(self.feeds, fp32)
            release_weights(fp32)
            times = seconds_per_run(paths, feeds, seconds=self.seconds)
        return times[_FP32], [times[f"variant {i}"] for i in range(len(variants))]

    def _write(self, names: set[str], path: Path) -> Path:
        model = load_model(self.model_path)
        QuantizeLinearsPass({n: p for n, p in self.linears.items() if n in names}, self.form)(model)
        QuantizeTablesPass(self.tables & names)(model)
        QuantizeConvsPass({n: p for n, p in self.convs.items() if n in names})(model)
        RemoveUnusedNodesPass()(model)
        path.parent.mkdir(parents=True)
        save_model(model, path)
        discard_weights(model)  # its int8 table (0.5 GB of a 2 GB one's) now, not at the next garbage collection
        return path
