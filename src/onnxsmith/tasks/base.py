"""What a task adapter is: how a model's real inputs are made and its outputs judged.

A transform's own gate compares raw outputs on a few input sets. A task goes
further: it turns real data into inputs (``samples``), decodes outputs into what
a user of the model sees (an age in years, a next token), and says how far a
variant's decoded outputs are from the source's (``evaluate``), as named
metrics that gates can bound::

    @register_task
    class FaceAge(Task, settings=FACEAGE):  # name, summary, Options (recipe keys / CLI flags): settings/faceage.py
        metrics = (MetricSpec("max_abs_age_error", "max |Δage|", "lower", "years"), ...)
        default_gates = {"max_abs_age_error": 0.5}

        def samples(self, model, options, source) -> list[Sample]: ...
        def evaluate(self, reference, candidate, samples, options, *, number_format) -> Evaluation: ...

``reference`` and ``candidate`` are the raw outputs of the source and the variant,
one dict per sample, from :meth:`Task.run` (override it for models that need a
loop); ``number_format``: the one the two models differ in (analysis/number_formats.py), for
a task that judges raw outputs with the one gate (generic). A task that runs the two models its own way implements :meth:`Task.judge`
instead of ``evaluate`` (the language-model task scores both with its own runner). Option fields whose metadata has ``{"path": True}`` name
files: a recipe resolves them against its own folder and checks they exist.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.number_formats import FP32, NumberFormat
from onnxsmith.core.errors import UsageError
from onnxsmith.core.registry import Registry
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import adapt_feeds
from onnxsmith.settings import TaskSettings
from onnxsmith.verify.compare import Comparison

LOWER = "lower"  # the metric is an error: a gate is an upper bound
HIGHER = "higher"  # the metric is an agreement: a gate is a lower bound

#: How a metric summarises its per-sample values (``Evaluation.per_sample``), which says what interval it has
#: (release/confidence.py): their mean (a bootstrap interval), their max (none), or the fraction of samples that
#: agree (per-sample values 1.0/0.0; a Clopper–Pearson interval). "": not a summary of samples (no interval).
MEAN, MAX, AGREEMENT = "mean", "max", "agreement"


@dataclass(frozen=True)
class MetricSpec:
    name: str  # the key gates use, e.g. "max_abs_age_error"
    label: str  # how tables show it, e.g. "max |Δage|"
    better: str  # LOWER or HIGHER
    unit: str = ""
    summary: str = ""  # MEAN, MAX, AGREEMENT of the per-sample values, or "" (see above)

    def passes(self, value: float, gate: float) -> bool:
        if value is None or math.isnan(value):
            return False
        return value <= gate if self.better == LOWER else value >= gate

    def severity(self, value: float, gate: float) -> float:
        """How far ``value`` is from failing ``gate``, in the gate's units: <= 1 passes, graded beyond it (what a
        step that repairs its variant measures its choices with). Agreements (higher is better) lie in [0, 1]."""
        if value is None or math.isnan(value):
            return math.inf
        if self.better == LOWER:
            if gate > 0:
                return max(value, 0.0) / gate
            return 0.0 if value <= gate else 1.0 + value
        if value >= gate:
            return (1.0 - value) / (1.0 - gate) if gate < 1 else 0.0
        return 1.0 + (gate - value) / max(1.0 - gate, 1e-3)

    def gate_text(self, gate: float) -> str:
        return f"{'≤' if self.better == LOWER else '≥'} {gate:g}"


@dataclass
class Sample:
    """One input set: an id a person can find it by, and the model's feeds."""

    id: str
    feeds: dict[str, np.ndarray]
    #: What the task needs besides the model outputs (an LM's next tokens, say).
    target: Any = None
    #: Made up from the input spec (random values), not the model's real data.
    random: bool = False
    #: What each input was taken to be where onnxsmith made or converted the values (analysis/input_roles.py).
    inputs: tuple[str, ...] = ()
    #: Where the feeds are read from when they are not held (:meth:`Task.sample_refs`): a task's own data.
    ref: Any = None

    def without_feeds(self) -> Sample:
        return dataclasses.replace(self, feeds={})


@dataclass
class Evaluation:
    """How a candidate's outputs compare with the reference's on the same samples."""

    values: dict[str, float]  # metric name -> value
    #: Metric name -> how to show it, e.g. "8/8"; falls back to the number.
    display: dict[str, str] = field(default_factory=dict)
    #: Per-sample (or per-element) errors for histograms: label -> values.
    errors: dict[str, list[float]] = field(default_factory=dict)
    #: One row per sample: its id and what each model predicted.
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: Why a gated metric fails, when the metric alone does not say (the generic task: the one gate's verdict).
    reasons: list[str] = field(default_factory=list)
    #: Metric name -> one value per sample, in the samples' order, for a metric that summarises them
    #: (``MetricSpec.summary``); NaN where a sample has none (a non-finite output).
    per_sample: dict[str, list[float]] = field(default_factory=dict)


class Task:
    """Base class of task adapters; see the module docstring."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Options: ClassVar[type]
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    default_gates: ClassVar[dict[str, float]] = {}
    #: Whether samples may be stacked along axis 0 and run as one batch.
    batchable: ClassVar[bool] = False

    def __init_subclass__(cls, settings: TaskSettings | None = None, **kwargs: Any) -> None:
        """``class FaceAge(Task, settings=FACEAGE)``: its name, line and options from :mod:`onnxsmith.settings`,
        read there by ``--help`` without the engines. A task may keep its own ``Options``: a subclass of the
        settings' that checks more with the engines' parsers (generic's)."""
        super().__init_subclass__(**kwargs)
        if settings is not None:
            cls.name, cls.summary = settings.name, settings.summary
            cls.Options = cls.__dict__.get("Options", settings.options)

    def samples(self, model: ir.Model, options: Any, source: Path) -> list[Sample]:
        """The inputs to judge on; ``source`` is the source model's path (its folder may hold a tokenizer)."""
        raise NotImplementedError

    def sample_refs(self, model: ir.Model, options: Any, source: Path) -> list[Sample]:
        """The samples without their feeds where the task can read them later (:meth:`load`), so a large dataset
        is never held whole: each sample's id and ``ref``. A task that cannot returns :meth:`samples`."""
        return self.samples(model, options, source)

    def load(self, model: ir.Model, samples: list[Sample], options: Any) -> list[Sample]:
        """``samples`` (from :meth:`sample_refs`) with their feeds; those that hold them already, as they are."""
        return samples

    #: Whether :meth:`evaluate` reads the samples' feeds (the generic task checks they exercised the model):
    #: the samples it is given then hold them.
    evaluate_reads_feeds: ClassVar[bool] = False

    def describe_data(self, options: Any, samples: list[Sample]) -> str:
        """One line saying what the samples are, for tables and the card."""
        return f"{len(samples)} samples"

    def evaluate(
        self,
        reference: list[dict[str, np.ndarray]],
        candidate: list[dict[str, np.ndarray]],
        samples: list[Sample],
        options: Any,
        *,
        number_format: NumberFormat = FP32,
    ) -> Evaluation:
        """``number_format``: the one the two models differ in (a task that judges raw outputs scales with it)."""
        raise NotImplementedError

    #: Implemented by tasks that run both models themselves: (reference path, candidate path,
    #: samples, options, *, engine, shard_size, shard_dir, progress) -> Evaluation, the samples in shards of
    #: about ``shard_size`` on ``engine``, kept in ``shard_dir`` (a rerun resumes). None: run each with :meth:`run`, then :meth:`evaluate`.
    judge = None

    def run(
        self, session, model: ir.Model, samples: list[Sample], options: Any, *, label=None, batch_size: int = 1
    ) -> list[dict[str, np.ndarray]]:
        """Raw outputs per sample. Batchable tasks stack up to ``batch_size`` samples per run."""
        names = [o.name for o in session.get_outputs()]
        step = max(1, batch_size) if self.batchable else 1
        outputs: list[dict[str, np.ndarray]] = []
        for start in range(0, len(samples), step):
            chunk = samples[start : start + step]
            if len(chunk) == 1:
                feeds = chunk[0].feeds
            else:
                feeds = {k: np.concatenate([s.feeds[k] for s in chunk]) for k in chunk[0].feeds}
            result = runner.run(session, adapt_feeds(feeds, model), names, label=label)
            if len(chunk) == 1:
                outputs.append(result)
            else:
                for i in range(len(chunk)):
                    outputs.append({k: v[i : i + 1] for k, v in result.items()})
        return outputs

    def gate(self, reference: Path, candidate: Path, feeds: list[dict[str, np.ndarray]], **settings: Any) -> Comparison:
        """Judge a transform's variant against its source on ``feeds``, for a transform that names this
        task as its ``gate_task`` (``settings``: that transform's ``gate_settings``)."""
        raise NotImplementedError(f"task '{self.name}' has no gate for transforms")

    def metric(self, name: str) -> MetricSpec:
        for spec in self.metrics:
            if spec.name == name:
                return spec
        known = ", ".join(s.name for s in self.metrics)
        raise UsageError(f"task '{self.name}' has no metric '{name}' (its metrics: {known})")


#: Every task, by name; filled by importing :mod:`onnxsmith.tasks`.
TASKS: Registry[Task] = Registry("task", "faceage, lm, generic: how inputs are made and outputs judged")


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: a task recipes and ``--task`` can name."""
    return TASKS.register(cls)
