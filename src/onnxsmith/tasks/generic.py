"""Any model: its raw outputs judged by the one gate, as ``compare`` and the transforms judge them.

Inputs are seeded plausible values for what each input is (analysis/input_roles.py), arrays from .npz
files (one input set per file, named like the model's inputs), or a folder of images, audio or text made
into input sets through what each input is (runtime/data_folder.py); the report says what each input
was taken to be, and ``input_role`` corrects it. The verdict is
:mod:`onnxsmith.verify.gate`'s at the number format the two models differ in
(``within_gate``: every output within its bounds; no new NaN/inf); the metrics
show what it measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, overload

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.input_roles import describe_inputs, parse_role_options
from onnxsmith.analysis.number_formats import FP32, NumberFormat
from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.runtime.data_folder import data_files, load_data
from onnxsmith.runtime.data_folder import describe_data as describe_folder
from onnxsmith.runtime.inputs import input_specs, load_npz, parse_shape_options, read_npz
from onnxsmith.runtime.sizing import inputs_that_run
from onnxsmith.settings import generic as settings
from onnxsmith.tasks.base import HIGHER, LOWER, Evaluation, MetricSpec, Sample, Task, register_task
from onnxsmith.verify.compare import judge_outputs
from onnxsmith.verify.evidence import check_feeds, check_reference
from onnxsmith.verify.gate import Bounds, GateOptions, verdict

#: Histograms need no more than this many |Δ| values per variant.
_HISTOGRAM_VALUES = 20000


@dataclass
class GenericOptions(settings.GenericOptions):
    """The settings' options, ``shape`` and ``input_role`` checked by the parsers that read them (a recipe's bad
    ``shape`` is refused at its line, before any work)."""

    def validate(self) -> None:
        try:
            parse_shape_options(self.shape, option="shape")
            parse_role_options(self.input_role, option="input_role")
        except UsageError as err:
            raise ValueError(err.problem) from None


@register_task
class Generic(Task, settings=settings.GENERIC):
    Options = GenericOptions
    evaluate_reads_feeds = True  # it checks the input sets exercised the model
    metrics = (
        MetricSpec("max_abs", "max |Δ|", LOWER),
        MetricSpec("mean_abs", "mean |Δ|", LOWER),
        MetricSpec("min_cosine", "min cosine", HIGHER),
        MetricSpec("argmax_agreement", "argmax agreement", HIGHER),
        MetricSpec("within_gate", "outputs within the gate", HIGHER),
        MetricSpec("nonfinite", "NaN/inf values", LOWER),
    )
    default_gates: ClassVar[dict[str, float]] = {"nonfinite": 0, "within_gate": 1.0}

    def samples(self, model: ir.Model, options: GenericOptions, source: Path | None = None) -> list[Sample]:
        shapes, dims = parse_shape_options(options.shape)
        given = parse_role_options(options.input_role)
        if options.data:
            path = Path(options.data)
            _, files = data_files(path)
            sets = load_data(path, model, shapes=shapes, dims=dims, seed=options.seed, given=given)
            taken = describe_folder(path, model, given)
            return [Sample(f.name, feeds, inputs=taken) for f, feeds in zip(files, sets)]
        feeds = inputs_that_run(
            model, shapes=shapes, dims=dims, samples=options.samples, seed=options.seed, given=given
        )
        taken = tuple(describe_inputs(model, given))
        return [Sample(f"random#{options.seed + i}", f, random=True, inputs=taken) for i, f in enumerate(feeds)]

    def sample_refs(self, model: ir.Model, options: GenericOptions, source: Path | None = None) -> list[Sample]:
        """A folder of .npz: each file's path, read where its shard runs (the first read here: a folder whose
        arrays do not fit the model is refused before any work). Other data are made into input sets here."""
        kind, files = data_files(Path(options.data)) if options.data else ("", [])
        if kind != "npz":
            return self.samples(model, options, source)
        load_npz(files[0], model)
        taken = describe_folder(Path(options.data), model, parse_role_options(options.input_role))
        specs = tuple(input_specs(model))  # the source's: every model run reads the same values
        return [Sample(f.name, {}, inputs=taken, ref=(f, specs)) for f in files]

    def load(self, model: ir.Model, samples: list[Sample], options: GenericOptions) -> list[Sample]:
        return [s if s.ref is None else dataclasses.replace(s, feeds=read_npz(*s.ref)) for s in samples]

    def describe_data(self, options: GenericOptions, samples: list[Sample]) -> str:
        taken = samples[0].inputs if samples else ()
        roles = f"; inputs taken to be: {'; '.join(taken)}" if taken else ""
        if options.data:
            return f"{len(samples)} input set(s) from {Path(options.data).name}{roles}"
        return f"{len(samples)} seeded plausible input set(s) (seed {options.seed}){roles}"

    def evaluate(
        self, reference, candidate, samples, options: GenericOptions, *, number_format: NumberFormat = FP32
    ) -> Evaluation:
        bounds = Bounds.for_format(
            number_format, GateOptions(options.min_cosine, options.rtol, options.atol, options.min_agreement)
        )
        missing = [name for name in reference[0] if name not in candidate[0]]
        if missing:
            raise InputError(f"the variant has no output '{missing[0]}'")
        stacked = {name: np.stack([r[name] for r in reference]) for name in reference[0]}
        tested = {name: np.stack([c[name] for c in candidate]) for name in reference[0]}
        feeds = _FeedsOf(samples)
        check_feeds(feeds)
        check_reference(feeds, stacked)  # refuses a comparison that exercised nothing
        diffs = judge_outputs(stacked, tested, bounds)
        errors: list[np.ndarray] = []
        for name, ref in stacked.items():
            if ref.dtype.kind in "fc":
                delta = np.abs(ref.astype(np.float64) - tested[name].astype(np.float64))
                errors.append(delta[np.isfinite(delta)].reshape(-1))
        cosines = [d.cosine for d in diffs if d.cosine is not None]
        argmaxes = [d.argmax_agreement for d in diffs if d.argmax_agreement is not None]
        nonfinite = sum(max(0, d.nonfinite_test - d.nonfinite_ref) for d in diffs)
        values = {
            "max_abs": max(d.max_abs for d in diffs),
            "mean_abs": float(np.mean([d.mean_abs for d in diffs])),
            "min_cosine": min(cosines) if cosines else float("nan"),
            "argmax_agreement": min(argmaxes) if argmaxes else float("nan"),
            "within_gate": sum(d.passed for d in diffs) / len(diffs),
            "nonfinite": float(nonfinite),
        }
        display = {
            "within_gate": f"{sum(d.passed for d in diffs)}/{len(diffs)}",
            "nonfinite": "none" if nonfinite == 0 else str(nonfinite),
        }
        if not argmaxes:  # no output has rows an argmax decides (audio, a scalar): nothing to agree on
            display["argmax_agreement"] = "-"
        flat = np.concatenate(errors) if errors else np.zeros(0)
        if flat.size > _HISTOGRAM_VALUES:  # an even, deterministic subsample
            flat = flat[np.linspace(0, flat.size - 1, _HISTOGRAM_VALUES).astype(np.int64)]
        rows = [
            {
                "output": d.name,
                "max |Δ|": d.max_abs,
                "mean |Δ|": d.mean_abs,
                "cosine": d.cosine,
                "NaN/inf": d.nonfinite_test,
                "within the gate": d.passed,
            }
            for d in diffs
        ]
        reasons = (
            [f"the gate ({bounds.describe()}): {verdict(diffs, bounds)}"] if not all(d.passed for d in diffs) else []
        )
        return Evaluation(values, display, {"|Δ| (all output values)": [float(v) for v in flat]}, rows, reasons)


class _FeedsOf(Sequence[dict[str, np.ndarray]]):
    """The samples' input sets, each read from its file when asked for where a sample does not hold it: the
    evidence checks read them one at a time, so a folder of many is never held whole."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    @overload
    def __getitem__(self, index: int) -> dict[str, np.ndarray]: ...
    @overload
    def __getitem__(self, index: slice) -> _FeedsOf: ...
    def __getitem__(self, index: int | slice) -> dict[str, np.ndarray] | _FeedsOf:
        if isinstance(index, slice):
            return _FeedsOf(self.samples[index])
        sample = self.samples[index]
        if sample.ref is None:
            return sample.feeds
        return read_npz(*sample.ref)
