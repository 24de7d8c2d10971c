"""A task's model run on its samples in shards, on an execution engine: the same outputs wherever they run.

The driver holds each sample's id and where its data is (:meth:`Task.sample_refs`), never the data: a worker
reads a shard's samples (:meth:`Task.load`), runs the model on them in the task's batches and sends back only
the outputs. A shard is a whole number of batches, so every sample is run in the same batch as in one process,
and the outputs come back in sample order: the metrics computed from them are the same, digit for digit, on
every engine. With a shard folder each shard's outputs are kept as they arrive and a rerun reads them back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxsmith.core.options import to_json
from onnxsmith.core.transform import Progress as Report
from onnxsmith.core.version import __version__
from onnxsmith.execution.engine import Engine, Progress
from onnxsmith.execution.store import ShardOutputs, ShardStore, map_kept, store_key, whole_batches
from onnxsmith.io.files import sha256_file
from onnxsmith.io.load import load_model, source_files
from onnxsmith.runtime.runner import prepare_session
from onnxsmith.tasks.base import Sample, Task

Outputs = list[dict[str, np.ndarray]]


@dataclass
class SampleRunner:
    """What every worker holds: the task, its options and the session of the model it runs, warm across that
    run's shards (released when the run ends: :func:`run_sharded`)."""

    task: Task
    options: Any
    fp16_mode: str
    batch_size: int
    #: onnxruntime's threads per session (None: one per core, for the one process that runs every shard).
    threads: int | None = None
    _sessions: dict[str, tuple[Any, Any, str]] = field(default_factory=dict, repr=False)

    def with_threads(self, threads: int) -> SampleRunner:
        """This runner for a worker given ``threads`` CPUs: workers sharing a machine do not each take every core."""
        return dataclasses.replace(self, threads=threads, _sessions={})

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sessions": {}}  # sessions stay where they were opened

    def close(self) -> None:
        """Let the sessions go (a build goes on to make the next variant: a ViT-L's sessions are gigabytes)."""
        self._sessions.clear()

    def __call__(self, job: tuple[str, list[Sample]]) -> ShardOutputs:
        path, shard = job
        if path not in self._sessions:
            self._sessions.clear()  # one model at a time
            self._sessions[path] = prepare_session(path, self.fp16_mode, threads=self.threads)
        session, model, _ = self._sessions[path]
        loaded = self.task.load(model, shard, self.options)
        return self.task.run(session, model, loaded, self.options, label=path, batch_size=self.batch_size)


def shards_of(samples: list[Sample], shard_size: int, batch_size: int) -> list[list[Sample]]:
    """``samples`` in shards of ``shard_size`` rounded up to whole batches."""
    size = whole_batches(shard_size, batch_size)
    return [samples[i : i + size] for i in range(0, len(samples), size)]


def run_sharded(
    engine: Engine,
    runner: SampleRunner,
    path: str | os.PathLike,
    samples: list[Sample],
    *,
    shard_size: int,
    shard_dir: str | os.PathLike | None,
    report: Report,
) -> Outputs:
    """``path``'s raw outputs on every sample, in sample order; shards kept in ``shard_dir`` are read back."""
    shards = shards_of(samples, shard_size, runner.batch_size)
    store = None
    if shard_dir is not None:
        store = ShardStore(shard_dir, _key(runner, path, samples, shard_size))
    progress = Progress(len(samples), report, f"{runner.task.name}: running {Path(path).name}")
    jobs = [(os.fspath(path), shard) for shard in shards]

    def done(index: int, _: object = None) -> None:
        progress.add(len(shards[index]))

    # The runner's session is released after the run: the reference's outputs are kept, a variant is run once.
    results = map_kept(engine, runner, jobs, store, done, on_kept=done)
    return [sample for shard in results for sample in shard]


def _key(runner: SampleRunner, path: str | os.PathLike, samples: list[Sample], shard_size: int) -> str:
    """What the outputs depend on: the model's bytes, the samples, the task and its options, how it is run."""
    files = source_files(load_model(path), path)
    return store_key(
        files=[sha256_file(f) for f in sorted(files)],
        samples=[_sample_key(s) for s in samples],
        task=runner.task.name,
        options=to_json(runner.options),
        fp16_mode=runner.fp16_mode,
        batch=runner.batch_size,
        shard_size=shard_size,
        onnxsmith=__version__,
    )


def _sample_key(sample: Sample) -> list[Any]:
    """A sample as the key sees it: its id, its feeds' bytes where it holds them, else where its data is (the
    files it names with their size and modification time, so an edited image is run again)."""
    key: list[Any] = [sample.id]
    for name in sorted(sample.feeds):
        array = np.ascontiguousarray(sample.feeds[name])
        key.append([name, str(array.dtype), list(array.shape), hashlib.sha256(array.tobytes()).hexdigest()])
    parts = sample.ref if isinstance(sample.ref, tuple) else (sample.ref,)
    for part in parts:
        if isinstance(part, Path):
            try:
                stat = part.stat()
                key.append([os.fspath(part), stat.st_size, stat.st_mtime_ns])
            except OSError:
                key.append([os.fspath(part), None])
        else:
            key.append(repr(part))
    return key
