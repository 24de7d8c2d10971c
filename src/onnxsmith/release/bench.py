"""Latency, throughput and memory of models, each measured in its own process.

Each model runs in a fresh Python process (``python -m onnxsmith.runtime.latency``)
so that one model's memory and caches do not pollute the next one's numbers: the
process times the session's creation, runs every batch size (warm-up runs, then
timed runs) and reports its peak resident memory. Inputs are seeded random
values made here, from the model's input spec, with the first symbolic dim of
each input (the batch) set to the batch size — or, in a build, the task's own
samples stacked to the batch size (real faces, real token windows). Its other
unsized dims get the sizes the transforms calibrate at, checked to run
(:func:`onnxsmith.runtime.sizing.inputs_that_run`: an image's sides from its metadata
or 224/320/640, an audio window that grows until it runs), so a model is measured
at a size it is meant for, not at a 1x1 image.

What can be measured is measured and what cannot is said: a model that cannot be
loaded or run is a :class:`BenchFailure` (the others are still measured), a batch
size that fails to run is recorded with onnxruntime's error, and a model whose
inputs have a fixed batch is measured at that batch, with a note saying so.

Timings are measurements of this machine at this moment: unlike everything else
a build writes, they differ from run to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from onnxsmith.runtime.latency import PROVIDERS
from onnxsmith.settings.bench import BenchOptions


@dataclass
class BatchTiming:
    batch: int
    runs: int
    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float

    @property
    def throughput(self) -> float:
        """Items per second at the median latency."""
        return self.batch / (self.median_ms / 1000.0) if self.median_ms > 0 else float("inf")

    def to_json(self) -> dict:
        return {**asdict(self), "throughput_per_s": self.throughput}


@dataclass
class BenchResult:
    name: str
    file: str
    provider: str
    load_ms: float  # creating the onnxruntime session
    rss_before_load_bytes: int  # the process after imports, before the session
    peak_rss_bytes: int  # the process's peak, session and runs included
    batches: list[BatchTiming] = field(default_factory=list)
    threads: int | None = None
    session_config: dict[str, str] = field(default_factory=dict)
    #: How the batch sizes measured differ from those asked for (a fixed batch), or "".
    note: str = ""
    #: Batch sizes asked for that failed to run: batch -> onnxruntime's error.
    errors: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        data = asdict(self)
        data["batches"] = [b.to_json() for b in self.batches]
        data["errors"] = {str(b): e for b, e in self.errors.items()}
        return data


@dataclass
class BenchFailure:
    """A model that could not be measured at all, and why (one line)."""

    name: str
    path: str
    reason: str

    def to_json(self) -> dict:
        return {"name": self.name, "file": Path(self.path).name, "reason": self.reason}


@dataclass
class BenchRun:
    """What :func:`bench_models` measured, and what it could not."""

    #: What was asked: batch sizes, provider, runs, ...
    settings: BenchSettings
    results: list[BenchResult] = field(default_factory=list)
    failures: list[BenchFailure] = field(default_factory=list)

    def notes(self) -> list[str]:
        """What a table of the results leaves out: batch sizes a model could not take, models not measured."""
        return notes(self.to_json())

    def to_json(self) -> dict:
        return {"results": [r.to_json() for r in self.results], "failures": [f.to_json() for f in self.failures]}

    def shortfall(self) -> str:
        """What could not be measured, in one line ("" when everything could)."""
        parts = [f"{f.name} ({f.reason})" for f in self.failures]
        parts += [f"{r.name} at batch {b} ({e})" for r in self.results for b, e in r.errors.items()]
        if not parts:
            return ""
        models = len(self.results) + len(self.failures)
        if not self.results:
            return f"none of the {models} models could be benchmarked: " + "; ".join(parts)
        return "not benchmarked: " + "; ".join(parts)


@dataclass
class BenchSettings:
    batches: list[int]
    provider: str = "cpu"
    runs: int = 20
    warmup: int = 3
    threads: int | None = None
    shape: list[str] = field(default_factory=list)  # NAME:D0,D1 / DIM=N for other symbolic dims

    @classmethod
    def of(cls, options: BenchOptions) -> BenchSettings:
        """What a run measures, from the settings a user gave (settings/bench.py)."""
        return cls(list(options.batch), options.provider, options.runs, options.warmup, options.threads, options.shape)


def notes(data: dict) -> list[str]:
    """The notes of a run kept as JSON (a build's measurements["bench"]), one line each."""
    lines = [f"{r['name']}: {r['note']}" for r in data["results"] if r.get("note")]
    lines += [f"{r['name']}: batch {b} failed: {e}" for r in data["results"] for b, e in r.get("errors", {}).items()]
    return lines + [f"{f['name']}: not benchmarked: {f['reason']}" for f in data.get("failures", [])]


#: ``inputs(n)``: the feeds of n samples stacked on axis 0 (a build's: its task's samples), in any
#: float/int types. A batch of n where a sample is one row; a model with a fixed batch gets one sample.
Feeds = Callable[[int], dict]


def bench_models(
    models: list[tuple[str, str | os.PathLike, dict[str, str]]],
    settings: BenchSettings,
    *,
    inputs: Feeds | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> BenchRun:
    """Benchmark each (name, path, session config entries) in its own process, one after another.

    ``inputs``: real feeds (default: seeded random values from the input spec). A model that cannot
    be benchmarked is reported in the run's failures; the others are measured.
    """
    from onnxsmith.core.errors import OnnxsmithError, UsageError
    from onnxsmith.runtime.inputs import parse_shape_options

    if settings.provider not in PROVIDERS:
        raise UsageError(f"unknown provider '{settings.provider}' (choose from {', '.join(PROVIDERS)})")
    parse_shape_options(settings.shape)  # a bad --shape is everyone's problem: said once, before any work
    for _, path, _ in models:
        try:
            os.fspath(path).encode("utf-8")
        except UnicodeEncodeError:  # a session on a file is what is timed, and onnxruntime takes UTF-8 paths only
            raise UsageError(
                "onnxruntime opens only files whose names are UTF-8; rename it to benchmark it", path
            ) from None
    run = BenchRun(settings)
    with tempfile.TemporaryDirectory(prefix="onnxsmith-bench-") as tmp:
        for i, (name, path, config) in enumerate(models):
            progress(f"benchmarking {name}: batch {', '.join(map(str, settings.batches))}")
            try:
                files, note = _write_inputs(Path(path), settings, Path(tmp) / f"model{i}", inputs)
                job = {
                    "path": os.fspath(path),
                    "inputs": files,
                    "provider": settings.provider,
                    "runs": settings.runs,
                    "warmup": settings.warmup,
                    "threads": settings.threads,
                    "config": config,
                }
                run.results.append(_run_worker(name, Path(path), job, settings, note))
            except OnnxsmithError as err:
                run.failures.append(BenchFailure(name, os.fspath(path), " ".join(err.problem.split())))
    return run


def _write_inputs(path: Path, settings: BenchSettings, folder: Path, given: Feeds | None) -> tuple[dict[str, str], str]:
    """One .npz of inputs per batch size the model can take; returns (batch -> file, a note on batch sizes
    it cannot take). The first dim of every input whose first dim is not fixed is the batch; a model
    without one has a fixed batch, measured as it is."""
    import numpy as np

    from onnxsmith.io.load import load_model
    from onnxsmith.runtime.inputs import adapt_feeds, input_specs, parse_shape_options, random_inputs, resolve_shape

    model = load_model(path)
    specs = input_specs(model)
    shapes, dims = parse_shape_options(settings.shape)
    if given is None:
        shapes, dims = _sizes_that_run(model, specs, shapes, dims)
    batched = [s for s in specs if s.dims and not _fixed(s.dims[0])]
    batches, note = list(settings.batches), ""
    if not batched:
        own = next((s.dims[0] for s in specs if s.dims), 1)
        batches = [own]
        if settings.batches != [own]:
            others = ", ".join(str(b) for b in settings.batches if b != own)
            note = f"its inputs have a fixed batch of {own}: measured at batch {own}, not at {others}"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for batch in batches:
        if given is not None:
            feeds = adapt_feeds(given(batch if batched else 1), model)  # in the model's own input types
        else:
            sized = {**dims, **{s.dims[0]: batch for s in batched if isinstance(s.dims[0], str)}}
            whole = {s.name: resolve_shape(s, shapes, sized) for s in specs}
            whole.update({s.name: (batch, *whole[s.name][1:]) for s in batched})
            feeds = random_inputs(model, shapes=whole, dims=sized, seed=batch)
        target = folder / f"batch{batch}.npz"
        np.savez(target, **feeds)
        files[str(batch)] = os.fspath(target)
    return files, note


def _sizes_that_run(model, specs, shapes: dict, dims: dict) -> tuple[dict, dict]:
    """``shapes`` and ``dims`` completed with the sizes the model runs at (what the transforms pick): named
    dims as dims, so a batch shared by several inputs still follows the batch size; an input with an
    unnamed dim as its whole shape."""
    from onnxsmith.runtime.sizing import inputs_that_run

    (feeds,) = inputs_that_run(model, shapes=shapes, dims=dims)
    shapes, dims = dict(shapes), dict(dims)
    for spec in specs:
        ran = feeds[spec.name].shape
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, str):
                dims.setdefault(dim, int(ran[axis]))
        if spec.name not in shapes and any(d is None for d in spec.dims):
            shapes[spec.name] = tuple(int(d) for d in ran)
    return shapes, dims


def _fixed(dim) -> bool:
    return isinstance(dim, int) and dim >= 0


def _run_worker(name: str, path: Path, job: dict, settings: BenchSettings, note: str) -> BenchResult:
    from onnxsmith.core.errors import InputError

    done = subprocess.run(
        [sys.executable, "-m", "onnxsmith.runtime.latency"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"benchmark process failed: {tail}", path)
    report = json.loads(lines[-1])
    if "error" in report:
        raise InputError(report["error"], path)
    errors = {b["batch"]: b["error"] for b in report["batches"] if "error" in b}
    if len(errors) == len(report["batches"]):
        raise InputError("; ".join(f"batch {b}: {e}" for b, e in errors.items()), path)
    return BenchResult(
        name=name,
        file=path.name,
        provider=settings.provider,
        load_ms=report["load_ms"],
        rss_before_load_bytes=report["rss_before"],
        peak_rss_bytes=report["peak_rss"],
        batches=[BatchTiming(**b) for b in report["batches"] if "error" not in b],
        threads=settings.threads,
        session_config=dict(job["config"]),
        note=note,
        errors=errors,
    )
