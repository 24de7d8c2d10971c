"""The precision engine: measure, decide, apply — what ``fp16`` and ``fuse --precision fp16`` both run.

* :func:`measured` runs the model as it is now on the calibration inputs
  (:func:`onnxsmith.probes.ranges.measure_ranges`); measuring the source also gives the
  gate its reference outputs, so the source is not run twice. While the file is open the
  engine can measure more on it: what rounding a recurrent cell's weights does.
* :func:`convert` is ``fp16`` on a measured model: stream decisions, islands
  (:mod:`.plan`), then the passes (:mod:`.apply`).
* ``fuse --precision fp16`` runs the same decisions in two places:
  :func:`rescale_streams_for_fusion` on the unfused graph, where the residual stream is
  a chain of Adds read by LayerNorms, and :func:`convert_fused` on the fused graph, with
  :meth:`Settings.for_fused_graph <onnxsmith.precision.plan.Settings.for_fused_graph>`.

After the gate refused a first candidate, both take the gate (``judge``) and first measure
what to keep fp32 for it (:mod:`.repair`): the conversion is then made with those tensors fp32.

The result is a :class:`PrecisionRecord` (data); :mod:`.report` turns it into notes and tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.measurements import TensorRange
from onnxsmith.core.errors import OnnxsmithError, TimeLimitExceeded
from onnxsmith.core.transform import ReferenceOutputs, TransformContext
from onnxsmith.io.load import load_model
from onnxsmith.irutil.tensors import lazy_tensor
from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import constant_tensors
from onnxsmith.precision.apply import Applied, apply_plan, rescale_streams
from onnxsmith.precision.plan import (
    Plan,
    Settings,
    StreamDecision,
    check_store_low,
    decide,
    decide_streams,
    weights_converted_anyway,
)
from onnxsmith.precision.repair import Judge, Repair, keep_exact
from onnxsmith.probes.ranges import measure_ranges
from onnxsmith.runtime import runner
from onnxsmith.runtime.fp16_storage import has_fp16
from onnxsmith.runtime.runner import FAITHFUL, NATIVE


@dataclass
class PrecisionRecord:
    """One conversion: what was measured, what was decided, what the passes did."""

    ranges: list[TensorRange]
    plan: Plan
    applied: Applied
    #: what was kept fp32 after the gate refused a first candidate (None: no refusal to repair)
    repair: Repair | None = None

    @property
    def repair_lines(self) -> list[str]:
        """The report's lines on what was kept fp32 after verification, and why."""
        return self.repair.lines() if self.repair is not None else []

    @property
    def precision(self):
        return self.applied.precision


@dataclass
class Measurement:
    """What was measured on one model file, which stays readable while it is in use (:func:`measured`)."""

    path: Path
    feeds: list[dict[str, np.ndarray]]
    ranges: list[TensorRange]
    #: the model's outputs on ``feeds`` (stacked per output, as runtime.runner.run_all gives them)
    outputs: dict[str, np.ndarray]

    def outputs_with_weights_rounded(self, names: Collection[str], dtype: ir.DataType) -> dict[str, np.ndarray]:
        """The outputs on the same inputs with the weights ``names`` rounded to ``dtype`` (nothing else changed)."""
        model = load_model(self.path)
        low = dtype.numpy()
        for const in constant_tensors(model):
            if const.value.name not in names:
                continue
            rounded = lazy_tensor(
                const.tensor, lambda a: a.astype(low).astype(a.dtype), dtype=const.tensor.dtype, name=const.value.name
            )
            if const.node is not None:
                const.node.attributes["value"] = ir.AttrTensor(
                    "value", ir.tensor(rounded.numpy(), name=const.value.name)
                )
            else:
                const.value.const_value = rounded
        session = runner.open_session(model, label=self.path)
        return runner.run_all(session, model, self.feeds, self.path)


@contextlib.contextmanager
def measured(model: ir.Model, context: TransformContext) -> Iterator[Measurement]:
    """Every float tensor's range on ``context.feeds``, measured on ``model`` as it is now (a step that edited
    it first says so: ``context.changed()``). Measuring the source leaves its outputs in ``context.reference``
    for the gate."""
    outputs: dict[str, np.ndarray] = {}
    with context.model_file(model) as path:
        ranges = measure_ranges(path, context.feeds, outputs=outputs, derive_movement=True, engine=context.engine)
        # After an edit the outputs are the edited model's, not the source's: not reused.
        if context.model_is_source:
            context.reference = ReferenceOutputs(outputs, FAITHFUL if has_fp16(model) else NATIVE)
        yield Measurement(Path(path), context.feeds, ranges, outputs)


def measure(model: ir.Model, context: TransformContext) -> list[TensorRange]:
    """The ranges of :func:`measured`, when nothing else is to be measured on the file."""
    with measured(model, context) as measurement:
        return measurement.ranges


def convert(
    model: ir.Model,
    ranges: list[TensorRange],
    settings: Settings | None = None,
    *,
    keep_fp32: dict[str, str] | None = None,
    infer: bool = True,
    measurement: Measurement | None = None,
    judge: Judge | None = None,
) -> PrecisionRecord:
    """Convert ``model`` in place to ``settings.dtype`` with fp32 islands, given its measured ``ranges``.

    ``settings``: what it may do (default: ``fp16``'s defaults). ``keep_fp32`` adds tensors
    the caller wants kept fp32 (name -> reason); ``infer``: False when the caller has just run
    :func:`infer_types` on ``model``. ``measurement``: the file ``ranges`` were measured on, to
    measure what rounding a recurrent cell's weights does (without it they stay fp32). ``judge``:
    the gate that refused a first candidate; what to keep fp32 for it is measured on that file first.
    """
    settings = settings or Settings()
    keep = dict(keep_fp32 or {})
    repair = None
    if judge is not None and measurement is not None:
        repair = keep_exact(
            measurement.path,
            measurement.feeds,
            settings.dtype,
            judge,
            lambda copy: convert(copy, ranges, settings, keep_fp32=keep, infer=False),
        )
        keep.update(repair.keep_fp32)
    if infer:
        infer_types(model)
    streams = decide_streams(model, ranges, settings)
    plan = decide(model, ranges, settings, streams, keep_fp32=keep)
    _check_store_low(model, plan, measurement)
    rescale_streams(model, streams)
    # Rescaling changed constants and attributes only: the types inferred above still hold.
    return PrecisionRecord(ranges, plan, apply_plan(model, plan, infer=False), repair)


def _check_store_low(model: ir.Model, plan: Plan, measurement: Measurement | None) -> None:
    """Measure each group of weights the plan would store low although they are read in fp32 (one run
    each with those weights rounded; one more for a compared group over the budget), and decide."""
    if not plan.store_low_groups:
        return
    dtype = plan.settings.dtype
    for group in plan.store_low_groups:
        if measurement is None:
            group.refused = "their rounding not measured"
            plan.store_low_checked.append(f"{len(group.weights)} {group.what} kept fp32 ({group.refused})")
            continue

        def others() -> dict[str, np.ndarray]:
            try:
                return measurement.outputs_with_weights_rounded(weights_converted_anyway(model, plan), dtype)
            except TimeLimitExceeded:  # stopped, not failed: the next run would be stopped too
                raise
            except OnnxsmithError:  # rounded, a constant computing sizes or indices made the model fail
                return {}

        rounded = measurement.outputs_with_weights_rounded(group.weights, dtype)
        check_store_low(plan, group, measurement.outputs, rounded, others if group.compared else None)


def rescale_streams_for_fusion(model: ir.Model, ranges: list[TensorRange]) -> list[StreamDecision]:
    """``fuse --precision fp16`` before fusing: scale each overflowing stream so the fp16 projections
    that write it fit (after fusion the stream is SkipLayerNormalization's fp32 skip)."""
    infer_types(model)
    streams = decide_streams(model, ranges, Settings.for_fused_graph())
    rescale_streams(model, streams)
    return streams


def convert_fused(model: ir.Model, measurement: Measurement, judge: Judge | None = None) -> PrecisionRecord:
    """``fuse --precision fp16`` after fusing: MatMul, attention, RoPE, BiasGelu in fp16; the residual
    stream, the normalisations and the per-sample tail fp32. ``measurement``: the fused graph's;
    ``judge``: as :func:`convert`'s."""
    settings = Settings.for_fused_graph()
    repair = None
    keep: dict[str, str] = {}
    if judge is not None:

        def convert_copy(copy: ir.Model) -> None:
            apply_plan(copy, decide(copy, measurement.ranges, settings), infer=False)

        repair = keep_exact(measurement.path, measurement.feeds, settings.dtype, judge, convert_copy)
        keep = repair.keep_fp32
    plan = decide(model, measurement.ranges, settings, keep_fp32=keep)
    _check_store_low(model, plan, measurement)
    return PrecisionRecord(measurement.ranges, plan, apply_plan(model, plan), repair)
