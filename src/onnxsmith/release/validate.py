"""Validating a variant against its source on a task's real data, and gating it.

The source and the variant run on the same samples (a model with fp16 tensors
runs storage-faithfully, as a GPU would hold its values); the task decodes both
and measures the difference as named metrics; gates bound those metrics. The
source's outputs are computed once per :class:`TaskRun` and reused for every
variant of a build.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxsmith.analysis.number_formats import NumberFormat, compared_format, formats_of
from onnxsmith.core.transform import Judge, Progress
from onnxsmith.execution.engine import Engine, LocalEngine
from onnxsmith.io.load import load_model
from onnxsmith.release.confidence import metric_intervals, worst_metric, worst_samples
from onnxsmith.release.shards import SampleRunner, run_sharded, shards_of
from onnxsmith.runtime.runner import run_mode
from onnxsmith.settings.execution import ExecutionOptions
from onnxsmith.tasks.base import Evaluation, Sample, Task


@dataclass
class MetricResult:
    name: str
    label: str
    unit: str
    better: str
    value: float
    display: str
    gate: float | None = None
    passed: bool | None = None  # None: not gated
    #: The value's 95 % interval (release/confidence.py): None for a metric that has none (a maximum, a count).
    interval: tuple[float, float] | None = None

    def failure(self) -> str:
        bound = ">" if self.better == "lower" else "<"
        return f"{self.label} {self.display} {bound} gate {self.gate:g}"


@dataclass
class Validation:
    task: str
    data: str
    samples: int
    reference: str
    candidate: str
    modes: dict[str, str]
    metrics: list[MetricResult]
    errors: dict[str, list[float]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why a gate fails, beyond its metric (Evaluation.reasons)
    #: The samples that fare worst, worst first: {"sample": id, "value": float, "metric": name} (:func:`worst_of`).
    worst: list[dict] = field(default_factory=list)
    #: Where the samples ran, e.g. "32 shards of up to 64 samples on 2 worker(s) on the Ray cluster at ...".
    ran_on: str = ""
    #: Wall seconds the validation took (the source's run too where it ran in it): timed, so not in to_json.
    seconds: float | None = field(default=None, compare=False)

    @property
    def passed(self) -> bool:
        return all(m.passed is not False for m in self.metrics)

    def failures(self) -> list[str]:
        failed = [m.failure() for m in self.metrics if m.passed is False]
        return failed + self.reasons if failed else []

    def metric(self, name: str) -> MetricResult:
        return next(m for m in self.metrics if m.name == name)

    def to_json(self) -> dict:
        return {
            "task": self.task,
            "data": self.data,
            "samples": self.samples,
            "reference": self.reference,
            "candidate": self.candidate,
            "modes": self.modes,
            "passed": self.passed,
            "metrics": [_metric_json(m) for m in self.metrics],
            "rows": [_finite(r) for r in self.rows],
            "errors": self.errors,
            "reasons": self.reasons,
            "worst": [_finite(w) for w in self.worst],
            "ran_on": self.ran_on,
        }


def _finite(row: dict) -> dict:
    """JSON has no NaN: write it as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _metric_json(metric: MetricResult) -> dict:
    """A metric's JSON: its interval [lo, hi], or null where it has none (or an end is not finite)."""
    data = _finite(asdict(metric))
    interval = metric.interval
    finite = interval is not None and all(math.isfinite(v) for v in interval)
    data["interval"] = [float(v) for v in interval] if finite else None
    return data


def check_gates(task: Task, gates: dict[str, float]) -> dict[str, float]:
    """The task's default gates overridden by ``gates``; unknown metric names are errors."""
    for name in gates:
        task.metric(name)
    return {**task.default_gates, **gates}


def gated_metrics(task: Task, evaluation: Evaluation, gates: dict[str, float]) -> list[MetricResult]:
    """The task's metrics with their gates, and each one's interval from the evaluation's per-sample values."""
    intervals = metric_intervals(task.metrics, evaluation)
    results = []
    for spec in task.metrics:
        value = evaluation.values.get(spec.name, float("nan"))
        display = evaluation.display.get(spec.name) or f"{value:.4g}"
        gate = gates.get(spec.name)
        passed = None if gate is None else spec.passes(value, gate)
        results.append(
            MetricResult(
                spec.name, spec.label, spec.unit, spec.better, value, display, gate, passed, intervals.get(spec.name)
            )
        )
    return results


def worst_of(task: Task, evaluation: Evaluation, samples: list[Sample]) -> list[dict]:
    """The samples that fare worst by the task's first lower-is-better metric with per-sample values, worst
    first (release/confidence.py's :func:`worst_samples`), as ``Validation.worst`` holds them."""
    metric = worst_metric(task.metrics, evaluation.per_sample)
    if metric is None:
        return []
    ranked = worst_samples(task.metrics, evaluation.per_sample, [s.id for s in samples])
    return [{"sample": sample, "value": value, "metric": metric.name} for sample, value in ranked]


def gates_judge(
    task: Task,
    options: Any,
    gates: dict[str, float],
    samples: list[Sample],
    number_format: NumberFormat | None = None,
) -> Judge:
    """``task``'s ``gates`` as a function of raw outputs stacked over input sets (``samples``: those sets,
    for the task's rows), in the gates' units (<= 1 passes): what a step that repairs a variant measures its
    choices with (``TransformContext.judge``)."""

    def judge(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> float:
        sets = len(next(iter(reference.values())))
        ref = [{k: v[i] for k, v in reference.items()} for i in range(sets)]
        cand = [{k: v[i] for k, v in candidate.items()} for i in range(sets)]
        values = task.evaluate(ref, cand, samples[:sets], options, number_format=number_format).values
        return max(task.metric(name).severity(values.get(name, math.nan), gate) for name, gate in gates.items())

    return judge


def _quiet(_: str) -> None:
    pass


class TaskRun:
    """A task with its options and samples, bound to the source it judges variants against."""

    def __init__(
        self,
        task: Task,
        options: Any,
        source: str | os.PathLike,
        *,
        fp16_mode: str = "auto",
        progress: Progress = _quiet,
        execution: ExecutionOptions | None = None,
        engine: Engine | None = None,
    ) -> None:
        """``engine``: where the samples run (this process unless given; the caller closes it); ``execution``:
        its shard size and the folder shards are kept in (a rerun resumes there)."""
        self.task = task
        self.options = options
        self.source = Path(source)
        self.fp16_mode = fp16_mode
        self.progress = progress
        self.execution = execution or ExecutionOptions()
        self.engine = engine or LocalEngine()
        progress(f"{task.name}: preparing the data")
        # Where the task can read them later, the samples' data are not held: each shard's is read where it runs.
        self.samples: list[Sample] = task.sample_refs(load_model(self.source), options, self.source)
        self.data = task.describe_data(options, self.samples)
        batch = getattr(self.options, "batch_size", 1)
        self._runner = SampleRunner(task, options, fp16_mode, batch)
        self._reference: tuple[list[dict[str, np.ndarray]], str] | None = None
        self._formats: dict[Path, frozenset[NumberFormat]] = {}  # of each model run, for the generic gate

    def outputs(self, path: str | os.PathLike) -> tuple[list[dict[str, np.ndarray]], str]:
        """Raw outputs of ``path`` on every sample, and how it was run."""
        model = load_model(path)
        self._formats[Path(path)] = formats_of(model)
        mode = run_mode(model, self.fp16_mode)
        del model
        self.progress(f"{self.task.name}: running {Path(path).name} on {len(self.samples)} samples ({mode})")
        outputs = run_sharded(
            self.engine,
            self._runner,
            path,
            self.samples,
            shard_size=self.execution.shard_size,
            shard_dir=self.execution.shard_dir,
            report=self.progress,
        )
        return outputs, mode

    @property
    def reference(self) -> tuple[list[dict[str, np.ndarray]], str]:
        if self._reference is None:
            self._reference = self.outputs(self.source)
        return self._reference

    def validate(self, candidate: str | os.PathLike, gates: dict[str, float], *, name: str | None = None) -> Validation:
        started = time.perf_counter()
        if self.task.judge is not None:
            self.progress(f"{self.task.name}: judging {Path(candidate).name} on {len(self.samples)} samples")
            evaluation = self.task.judge(
                self.source,
                candidate,
                self.samples,
                self.options,
                engine=self.engine,
                shard_size=self.execution.shard_size,
                shard_dir=self.execution.shard_dir,
                progress=self.progress,
            )
            ref_mode = cand_mode = "native"
        else:
            ref_outputs, ref_mode = self.reference
            cand_outputs, cand_mode = self.outputs(candidate)
            fmt = compared_format(self._formats[self.source], self._formats[Path(candidate)])
            evaluation = self.task.evaluate(ref_outputs, cand_outputs, self.samples, self.options, number_format=fmt)
        return Validation(
            task=self.task.name,
            data=self.data,
            samples=len(self.samples),
            reference=self.source.name,
            candidate=name or Path(candidate).name,
            modes={"reference": ref_mode, "candidate": cand_mode},
            metrics=gated_metrics(self.task, evaluation, gates),
            errors=evaluation.errors,
            rows=evaluation.rows,
            reasons=evaluation.reasons,
            worst=worst_of(self.task, evaluation, self.samples),
            ran_on=self._ran_on(),
            seconds=time.perf_counter() - started,
        )

    def _ran_on(self) -> str:
        # A task that runs both models itself shards its samples in whole batches of its own (the lm task's).
        batch = self._runner.batch_size if self.task.judge is None else getattr(self.options, "batch", 1)
        shards = shards_of(self.samples, self.execution.shard_size, batch)
        size = f"up to {len(shards[0]) if shards else 0} samples" + (
            f" (whole batches of {batch})" if batch > 1 else ""
        )
        return f"{len(shards)} shard(s) of {size} on {self.engine.describe()}"

    def judge(self, gates: dict[str, float], count: int, candidate: str | os.PathLike) -> Judge | None:
        """The task's ``gates`` as a function of raw outputs on the first ``count`` samples (what
        :meth:`calibration_feeds` gives the transforms), in the gates' units (<= 1 passes), judged in the number
        format ``candidate`` (validated before) differs from the source in: what a step that repairs a variant
        the gates refused measures its choices with. None for a task that runs the two models itself."""
        if self.task.judge is not None or not gates:
            return None
        fmt = compared_format(self._formats[self.source], self._formats[Path(candidate)])
        return gates_judge(self.task, self.options, gates, self.samples[: max(1, count)], fmt)

    @property
    def real_inputs(self) -> bool:
        """Whether the samples are the model's real data (not random from its input spec)."""
        return not any(s.random for s in self.samples)

    def loaded(self, count: int) -> list[Sample]:
        """The first ``count`` samples with their data."""
        return self.task.load(load_model(self.source), self.samples[: max(1, count)], self.options)

    def calibration_feeds(self, count: int) -> list[dict[str, np.ndarray]]:
        """The first ``count`` samples' feeds, for transforms to measure the source on."""
        return [dict(s.feeds) for s in self.loaded(count)]
