"""Latency, throughput and memory of models, each measured in its own process.

Each model runs in a fresh Python process (``python -m onnxsmith.runtime.latency``)
so that one model's memory and caches do not pollute the next one's numbers: the
process times the session's creation, runs every batch size (warm-up runs, then
timed runs) and reports its peak resident memory. Inputs are seeded random
values made here, from the model's input spec, with the first symbolic dim of
each input (the batch) set to the batch size — or, in a build, the task's own
samples stacked to the batch size (real faces, real token windows).

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

    def to_json(self) -> dict:
        data = asdict(self)
        data["batches"] = [b.to_json() for b in self.batches]
        return data


@dataclass
class BenchSettings:
    batches: list[int]
    provider: str = "cpu"
    runs: int = 20
    warmup: int = 3
    threads: int | None = None
    shape: list[str] = field(default_factory=list)  # NAME:D0,D1 / DIM=N for other symbolic dims


def bench_models(
    models: list[tuple[str, str | os.PathLike, dict[str, str]]],
    settings: BenchSettings,
    *,
    inputs: dict[int, dict] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[BenchResult]:
    """Benchmark each (name, path, session config entries) in its own process, one after another.

    ``inputs``: the feeds for each batch size (default: seeded random values from the input spec).
    """
    from onnxsmith.core.errors import UsageError

    if settings.provider not in PROVIDERS:
        raise UsageError(f"unknown provider '{settings.provider}' (choose from {', '.join(PROVIDERS)})")
    for _, path, _ in models:
        try:
            os.fspath(path).encode("utf-8")
        except UnicodeEncodeError:  # a session on a file is what is timed, and onnxruntime takes UTF-8 paths only
            raise UsageError(
                "onnxruntime opens only files whose names are UTF-8; rename it to benchmark it", path
            ) from None
    results = []
    with tempfile.TemporaryDirectory(prefix="onnxsmith-bench-") as tmp:
        for i, (name, path, config) in enumerate(models):
            progress(f"benchmarking {name}: batch {', '.join(map(str, settings.batches))}")
            files = _write_inputs(Path(path), settings, Path(tmp) / f"model{i}", inputs)
            job = {
                "path": os.fspath(path),
                "inputs": files,
                "provider": settings.provider,
                "runs": settings.runs,
                "warmup": settings.warmup,
                "threads": settings.threads,
                "config": config,
            }
            results.append(_run_worker(name, Path(path), job, settings))
    return results


def _write_inputs(path: Path, settings: BenchSettings, folder: Path, given: dict[int, dict] | None) -> dict[str, str]:
    """One .npz of inputs per batch size; returns batch -> file."""
    import numpy as np

    from onnxsmith.core.errors import UsageError
    from onnxsmith.io.load import load_model
    from onnxsmith.runtime.inputs import adapt_feeds, input_specs, parse_shape_options, random_inputs

    model = load_model(path)
    folder.mkdir(parents=True, exist_ok=True)
    if given is not None:
        files = {}
        for batch in settings.batches:
            target = folder / f"batch{batch}.npz"
            np.savez(target, **adapt_feeds(given[batch], model))  # in the model's own input types
            files[str(batch)] = os.fspath(target)
        return files
    shapes, dims = parse_shape_options(settings.shape)
    specs = input_specs(model)
    batch_dims = {s.dims[0] for s in specs if s.dims and isinstance(s.dims[0], str) and s.name not in shapes}
    fixed = {s.dims[0] for s in specs if s.dims and isinstance(s.dims[0], int) and s.name not in shapes}
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for batch in settings.batches:
        if not batch_dims and fixed and batch not in fixed:
            raise UsageError(f"the model's inputs have a fixed batch of {min(fixed)}; cannot run batch {batch}", path)
        feeds = random_inputs(model, shapes=shapes, dims={**dims, **{d: batch for d in batch_dims}}, seed=batch)
        target = folder / f"batch{batch}.npz"
        np.savez(target, **feeds)
        files[str(batch)] = os.fspath(target)
    return files


def _run_worker(name: str, path: Path, job: dict, settings: BenchSettings) -> BenchResult:
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
    return BenchResult(
        name=name,
        file=path.name,
        provider=settings.provider,
        load_ms=report["load_ms"],
        rss_before_load_bytes=report["rss_before"],
        peak_rss_bytes=report["peak_rss"],
        batches=[BatchTiming(**b) for b in report["batches"]],
        threads=settings.threads,
        session_config=dict(job["config"]),
    )
