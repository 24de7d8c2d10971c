"""What a transform is: the user-facing operations (fp16, fuse, quantize, shrink, ...).

A transform turns an in-memory model into a variant and reports what it did. It
is built from IR passes (:mod:`onnxsmith.passes`) and may measure the source
first (calibration). Its options are a dataclass, so the CLI flags and a
recipe's keys come from one definition (:mod:`onnxsmith.core.options`).

What a step measures travels in its :class:`TransformContext`, never on the
transform object; how its variant is judged is declared (:attr:`Transform.gate_task`)
and applied by the release layer (:func:`onnxsmith.release.variant.produce_variant`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import onnx_ir as ir

from onnxsmith.core.registry import Registry

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class ReferenceOutputs:
    """The source's outputs on the calibration feeds, computed while calibrating (stacked per output)."""

    outputs: dict[str, np.ndarray]
    #: How the source was run (``runtime.runner.NATIVE`` or ``FAITHFUL``).
    mode: str


#: The gate as a function: how far ``candidate``'s outputs are from ``reference``'s (both stacked over
#: the input sets), in units of its bounds (<= 1 passes; inf for new NaN/inf).
Judge = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], float]
#: A judge that says None where no output is what it judges (``TransformContext.structured_judge``).
StructuredJudge = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], float | None]


@contextlib.contextmanager
def _temporary_folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="onnxsmith-step-") as tmp:
        yield Path(tmp)


class JobEngine(Protocol):
    """Where a measurement's jobs run (:mod:`onnxsmith.execution.engine`: this process or a Ray cluster)."""

    def map(
        self, worker: Any, jobs: Sequence[Any], *, on_result: Callable[[int, Any], None] | None = None
    ) -> list[Any]: ...

    def release(self, worker: Any) -> None: ...


@dataclass
class TransformContext:
    """What a transform may use besides the model, and what it leaves for the gate."""

    source_path: Path
    #: Input sets to measure the source on (calibration) — random from the input spec unless given.
    feeds: list[dict[str, np.ndarray]]
    #: Writes a model to a file (``io.save.save_model``): given by whoever runs the chain, so this layer reads no files.
    save: Callable[[ir.Model, Path], Any]
    progress: Progress = _quiet
    #: Whether the model is still the source as loaded: true for the first step of a chain until it edits the
    #: model (:meth:`changed`); then :meth:`model_file` writes what the model is now.
    model_is_source: bool = True
    #: The source's outputs on ``feeds``, if a step computed them while measuring (the gate then reuses them).
    reference: ReferenceOutputs | None = None
    #: Set when the gate refused this chain's first variant (release/ makes it again): the gate as a
    #: function, how far outputs are from reference outputs (both stacked over input sets) in units of its
    #: bounds (<= 1 passes). A step that can keep more of the model exact measures its choices with it.
    judge: Judge | None = None
    #: The gate as a function from the first make, for a step that measures its choices with it
    #: (:attr:`Transform.measured_as`): how far outputs are from reference outputs in units of its bounds where
    #: some output is one the gate judges for what it is (detections, a top-k: any rounding reorders its rows;
    #: labels: a flip between class ids 3 and 40 is no larger than between 3 and 4; audio: heard by its spectrum),
    #: else None.
    structured_judge: StructuredJudge | None = None
    #: Whether ``feeds`` are real inputs (the user's, a task's data) rather than random ones from the input spec:
    #: what a calibration that fixes scales needs (int8's Convs: activation scales real data would overflow).
    real_inputs: bool = False
    #: Whether made-up ``feeds`` look like the real thing (every float input an image, a waveform or a state
    #: beside one: :func:`onnxsmith.analysis.input_roles.plausible`): ranges a calibration may fix scales from.
    plausible_inputs: bool = False
    #: Image inputs whose value range (0..255, 0..1, normalized) is a guess, not read from the graph, its metadata
    #: or the user: made-up inputs in a guessed range give activation scales real data may overflow 100-fold.
    guessed_ranges: tuple[str, ...] = ()
    #: Made-up float inputs that do not look like the real thing, each "'name' (what it was taken to be)": why
    #: ``plausible_inputs`` is False (analysis/input_roles.unlike_real), for the words of what stays fp32.
    unlike_real: tuple[str, ...] = ()
    #: Input sets to measure static activation ranges on (int8's Convs), a superset of ``feeds`` where onnxsmith
    #: makes them up: a scale from two photo crops clips a third's (None: ``feeds``).
    range_feeds: list[dict[str, np.ndarray]] | None = None
    #: A private folder for :meth:`model_file`'s copies, removed when the block ends (release/ gives one that a
    #: later run removes if this one is killed).
    scratch: Callable[[], AbstractContextManager[Path]] = _temporary_folder
    #: Where calibration statistics that add up over input sets are measured, in shards (None: this process);
    #: the variant is the same either way (int8_engine/statistics.py).
    engine: JobEngine | None = None

    def changed(self) -> None:
        """The step edited the model (fused it, folded its BatchNorms) before measuring it: the source file no
        longer holds it, and the outputs measured on it are not the source's."""
        self.model_is_source = False

    @contextlib.contextmanager
    def model_file(self, model: ir.Model) -> Iterator[Path]:
        """A file holding ``model`` as it is now, for a measurement that runs it: the one way a step gets one.

        The source file itself while the model is still the source (nothing written); once a step (this one or
        an earlier one of the chain) changed it, a copy in a private folder the block owns: a calibration must
        see the tensors of the graph it converts.
        """
        if self.model_is_source:
            yield self.source_path
            return
        with self.scratch() as folder:
            path = Path(folder) / self.source_path.name
            self.save(model, path)
            yield path


@dataclass
class StepReport:
    """What one transform did, for the console, the card and the report."""

    step: str
    options: dict[str, Any]
    #: Sentences for the card, e.g. "removed 118 up-casts and 47 orphaned down-casts".
    notes: list[str] = field(default_factory=list)
    #: Why the variant is not smaller or faster than it is, in the transform's words: the report's
    #: first lines after what was achieved, e.g. "the LSTM's weights stay fp32 (onnxruntime's CPU
    #: LSTM is fp32 only): 16 MB of 54 MB".
    why_not_more: list[str] = field(default_factory=list)
    #: Numbers worth keeping (nodes before/after, Casts, bytes, ...).
    stats: dict[str, Any] = field(default_factory=dict)
    #: Named tables (lists of rows) such as the fp32 islands with their measured ranges.
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Session options the variant needs at run time, e.g. {"session.disable_quant_qdq": "1"}.
    runtime: dict[str, str] = field(default_factory=dict)
    #: Tables shown only on ``--explain``: each change and why, before/after breakdowns.
    details: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Transform:
    """Base class: subclasses implement :meth:`apply` and take ``name``, ``summary`` and ``Options`` from their
    declaration (``class Fp16(Transform, settings=FP16)``: :mod:`onnxsmith.settings`) or set them."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Options: ClassVar[type]
    #: The task whose gate judges this transform's variants (e.g. ``"lm"``: next-token KL and
    #: top-1 agreement) instead of the one gate on every output (:mod:`onnxsmith.verify.gate`).
    gate_task: ClassVar[str | None] = None
    #: Whether the variant holds what was measured on the calibration inputs (int8's static activation scales):
    #: then made-up inputs calibrate it and other made-up inputs judge it, so the gate sees inputs it was not fit to.
    judged_on_unseen: ClassVar[bool] = False
    #: The number format its variant computes in, where its search measures choices with the gate on structured
    #: outputs from the first make (``TransformContext.structured_judge``: int8's), else None.
    measured_as: ClassVar[str | None] = None
    #: Whether it measures calibration statistics in shards on ``TransformContext.engine`` (settings' on_engines).
    on_engines: ClassVar[bool] = False

    def __init_subclass__(cls, settings: Any = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if settings is not None:
            cls.name, cls.summary, cls.Options = settings.name, settings.summary, settings.options
            cls.on_engines = settings.on_engines

    def apply(self, model: ir.Model, options: Any, context: TransformContext) -> StepReport:
        raise NotImplementedError

    def repairs(self, options: Any) -> bool:
        """Whether, told how the gate measures (``TransformContext.judge``) after it refused a variant,
        this step keeps more of the model exact (fp16's conversions, :mod:`onnxsmith.precision.repair`)."""
        return False

    def gate_task_for(self, model: Any, options: Any) -> str | None:
        """The task whose gate judges this step's variant of ``model`` (read before the step runs):
        :attr:`gate_task`, unless what the model is decides (int8 judges a decoder as a language model)."""
        return self.gate_task

    def task_gate_settings(self, options: Any) -> dict[str, Any]:
        """Keyword arguments for that task's gate (its bounds, how to run the variant)."""
        return {}

    def gate_settings(self, options: Any) -> dict[str, Any]:
        """Bounds for the one gate (``min_cosine``, ``rtol``, ``atol``; None derives it from the number
        format), for a transform whose variants legitimately move more than their format's rounding.
        The bounds a user sets win."""
        return {}


#: Every transform, by name; filled by importing :mod:`onnxsmith.transforms`.
TRANSFORMS: Registry[Transform] = Registry("transform", "the transform (fp16, fuse, quantize, shrink, ...)")


def register(cls: type[Transform]) -> type[Transform]:
    """Class decorator: a transform users can ask for by name."""
    return TRANSFORMS.register(cls)
