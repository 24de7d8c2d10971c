"""Calibration statistics that add up over input sets, measured in shards on an execution engine.

Three of int8's measurements are reductions over the input sets: each Linear input's per-channel max |x|
(:func:`measure_inputs`), each Conv's input and output min and max (:func:`measure_ranges`) and each Linear
input's ``XᵀX`` (:func:`input_grams`). Each is a worker (a :class:`Statistic`) holding one session on an
instrumented copy of the model; the input sets go to it in shards of :data:`SHARD`, here or on a Ray cluster's
workers (``TransformContext.engine``), and the shards' partial results are merged in shard order. Maxima and
minima are the same in any order; the Gram matrices are float64 sums, added shard by shard in the same order on
every engine, so the variant's bytes do not depend on where its calibration ran. A shard's partial is merged as
soon as every earlier one has been: memory holds one partial (and those that arrived early), not one per shard.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.core.transform import JobEngine, Progress
from onnxsmith.execution.engine import LocalEngine
from onnxsmith.int8_engine.measure import InputStats, ProbeBuilder, ValueRange, load_probed
from onnxsmith.io.load import release_weights
from onnxsmith.passes.quantize_linears import by_input, find_linears
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import adapt_feeds

#: Input sets per shard: the unit a statistic is summed in, on every engine alike.
SHARD = 16


def _quiet(_: str) -> None:
    pass


def announced(progress: Progress, what: str) -> Progress:
    """``what`` said on ``progress``, and a callback that says each shard done after it."""
    progress(what)
    return lambda done: progress(f"{what}: {done}")


Feeds = dict[str, np.ndarray]


@dataclass
class Statistic:
    """A worker: one instrumented session on ``model_path`` (opened on its first shard), a partial per shard."""

    model_path: str
    threads: int | None = None
    _open: tuple[ir.Model, runner.Session] | None = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": None}  # a session stays where it was opened

    def with_threads(self, threads: int) -> Statistic:
        return dataclasses.replace(self, threads=threads, _open=None)

    def instrument(self, model: ir.Model, build: ProbeBuilder) -> None:
        """Add the probe's nodes and outputs to ``model``."""
        raise NotImplementedError

    def outputs(self) -> list[str]:
        raise NotImplementedError

    def partial(self, results: list[dict[str, np.ndarray]]) -> Any:
        """One shard's statistic from its runs' results."""
        raise NotImplementedError

    @staticmethod
    def merge(total: Any, partial: Any) -> Any:
        raise NotImplementedError

    def __call__(self, shard: list[Feeds]) -> Any:
        if self._open is None:
            model = load_probed(self.model_path)
            self.instrument(model, ProbeBuilder(model))
            options = runner.session_options(optimize=False, threads=self.threads)
            self._open = model, runner.open_session(model, options=options, label=self.model_path)
        model, session = self._open
        names = self.outputs()
        return self.partial([runner.run(session, adapt_feeds(f, model), names, label=self.model_path) for f in shard])

    def close(self) -> None:
        if self._open is not None:
            model, session = self._open
            self._open = None
            del session  # it reads the weights' maps: free it before unmapping them
            release_weights(model)


def gather(
    engine: JobEngine | None, statistic: Statistic, feeds_list: Sequence[Feeds], progress: Progress = _quiet
) -> Any:
    """``statistic`` over every input set: shards of :data:`SHARD` run on ``engine`` (None: this process),
    their partials merged in shard order as they become mergeable; ``progress`` hears of each shard done."""
    engine = engine or LocalEngine()
    shards = [list(feeds_list[i : i + SHARD]) for i in range(0, len(feeds_list), SHARD)]
    early: dict[int, Any] = {}
    merged: list[Any] = []  # [the merge of shards 0 .. next - 1]
    state = {"next": 0, "done": 0}

    def arrived(index: int, partial: Any) -> None:
        early[index] = partial
        state["done"] += 1
        progress(f"{state['done']}/{len(shards)} shards of {SHARD} input sets")
        while state["next"] in early:
            part = early.pop(state["next"])
            merged[:] = [part if not merged else statistic.merge(merged[0], part)]
            state["next"] += 1

    try:
        engine.map(statistic, shards, on_result=arrived)
    finally:
        engine.release(statistic)
    return merged[0] if merged else None


# ---- the three statistics -------------------------------------------------------------------------------------


@dataclass
class _InputPeaks(Statistic):
    """Per Linear input: the per-channel max |x| and the element count."""

    _names: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)

    def instrument(self, model: ir.Model, build: ProbeBuilder) -> None:
        self._names = {}
        for linear in find_linears(model):
            x = linear.input
            if x.name in self._names:
                continue
            block: list = []
            rows = build.matrix(block, build.node(block, "Abs", [x]), linear.kn()[0])
            absmax = build.reduce(block, "ReduceMax", rows, [0])
            size = build.node(block, "Size", [x])
            build.place_after(x, block)
            model.graph.outputs.extend([absmax, size])
            self._names[x.name] = (absmax.name, size.name)

    def outputs(self) -> list[str]:
        return [n for pair in self._names.values() for n in pair]

    def partial(self, results: list[dict[str, np.ndarray]]) -> dict[str, tuple[np.ndarray, int]]:
        found: dict[str, tuple[np.ndarray, int]] = {}
        for result in results:
            for x, (absmax, size) in self._names.items():
                value = np.nan_to_num(np.asarray(result[absmax], dtype=np.float32), nan=0.0, posinf=0.0)
                seen = found.get(x)
                found[x] = (
                    (value, int(result[size]))
                    if seen is None
                    else (
                        np.maximum(seen[0], value),
                        max(seen[1], int(result[size])),
                    )
                )
        return found

    @staticmethod
    def merge(total: dict, partial: dict) -> dict:
        return {x: (np.maximum(total[x][0], p[0]), max(total[x][1], p[1])) for x, p in partial.items()}


def measure_inputs(
    model_path: str | os.PathLike,
    feeds_list: Sequence[Feeds],
    engine: JobEngine | None = None,
    progress: Progress = _quiet,
) -> dict[str, InputStats]:
    """Per Linear (by name): its input's per-channel max |x| and size, over every input set."""
    model = load_probed(model_path)
    users = {linear.name: linear.input.name for linear in find_linears(model)}
    release_weights(model)
    if not users:
        return {}
    peaks = gather(engine, _InputPeaks(os.fspath(model_path)), feeds_list, progress) or {}
    found = {}
    for name, x in users.items():
        if x in peaks:
            peak, size = peaks[x]
            found[name] = InputStats(peak, size, size // max(int(peak.size), 1))
    return found


@dataclass
class _Ranges(Statistic):
    """Per named value: its min, max and element count."""

    names: frozenset[str] = frozenset()
    _outputs: dict[str, tuple[str, str, str]] = field(default_factory=dict, repr=False)

    def instrument(self, model: ir.Model, build: ProbeBuilder) -> None:
        self._outputs = {}
        values = {v.name: v for node in model.graph for v in node.outputs} | {v.name: v for v in model.graph.inputs}
        for name in sorted(self.names & set(values)):
            x = values[name]
            block: list = []
            low = build.node(block, "ReduceMin", [x], {"keepdims": 0})
            high = build.node(block, "ReduceMax", [x], {"keepdims": 0})
            size = build.node(block, "Size", [x])
            build.place_after(x, block)
            model.graph.outputs.extend([low, high, size])
            self._outputs[name] = (low.name, high.name, size.name)

    def outputs(self) -> list[str]:
        return [n for t in self._outputs.values() for n in t]

    def partial(self, results: list[dict[str, np.ndarray]]) -> dict[str, ValueRange]:
        found: dict[str, ValueRange] = {}
        for result in results:
            for name, (low, high, size) in self._outputs.items():
                seen = ValueRange(float(result[low]), float(result[high]), int(result[size]))
                found[name] = seen if name not in found else self.merge({name: found[name]}, {name: seen})[name]
        return found

    @staticmethod
    def merge(total: dict, partial: dict) -> dict:
        merged = dict(total)
        for name, p in partial.items():
            t = merged.get(name, p)
            merged[name] = ValueRange(min(t.low, p.low), max(t.high, p.high), max(t.elements, p.elements))
        return merged


def measure_ranges(
    model_path: str | os.PathLike,
    feeds_list: Sequence[Feeds],
    names: set[str],
    engine: JobEngine | None = None,
    progress: Progress = _quiet,
) -> dict[str, ValueRange]:
    """Per value (by name): its min and max over every input set (the static activation scales' source)."""
    if not names:
        return {}
    return gather(engine, _Ranges(os.fspath(model_path), names=frozenset(names)), feeds_list, progress) or {}


@dataclass
class _Grams(Statistic):
    """``XᵀX`` (float64) of each of ``inputs`` ((value name, K) pairs)."""

    inputs: tuple[tuple[str, int], ...] = ()
    _outputs: list[str] = field(default_factory=list, repr=False)

    def instrument(self, model: ir.Model, build: ProbeBuilder) -> None:
        self._outputs = []
        values = {v.name: v for node in model.graph for v in node.outputs} | {v.name: v for v in model.graph.inputs}
        for x_name, k in self.inputs:
            x = values[x_name]
            block: list = []
            rows = build.matrix(block, x, k)
            gram = build.node(block, "MatMul", [build.node(block, "Transpose", [rows], {"perm": [1, 0]}), rows])
            build.place_after(x, block)
            model.graph.outputs.append(gram)
            self._outputs.append(gram.name)

    def outputs(self) -> list[str]:
        return list(self._outputs)

    def partial(self, results: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        sums = [np.zeros((k, k), np.float64) for _, k in self.inputs]
        for result in results:
            for total, name in zip(sums, self._outputs):
                total += np.nan_to_num(np.asarray(result[name], dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        return sums

    @staticmethod
    def merge(total: list, partial: list) -> list:
        return [t + p for t, p in zip(total, partial)]  # new arrays: a partial from Ray's object store is read-only


def input_grams(
    model_path: str | os.PathLike,
    feeds_list: Sequence[Feeds],
    linears: set[str],
    max_bytes: int = 512 << 20,
    engine: JobEngine | None = None,
    progress: Progress = _quiet,
) -> Iterator[tuple[list[str], np.ndarray]]:
    """``XᵀX`` [K, K] of the input of the Linears named in ``linears`` (rows: every vector they multiply, over
    every input set), one input at a time: (the Linears reading it, its Gram matrix). What error-compensating
    rounding weighs a weight's rounding errors by. Inputs are measured in groups of at most ``max_bytes`` of
    Gram matrices, a session each (a ViT-L's 97 inputs hold 1.8 GB of them)."""
    model = load_probed(model_path)
    groups = [
        (x.name, readers[0].kn()[0], [r.name for r in readers])
        for x, readers in by_input(r for r in find_linears(model) if r.name in linears).items()
    ]
    release_weights(model)
    start = 0
    while start < len(groups):
        stop, size = start, 0
        while stop < len(groups) and (stop == start or size + 4 * groups[stop][1] ** 2 <= max_bytes):
            size += 4 * groups[stop][1] ** 2
            stop += 1
        chosen = groups[start:stop]
        statistic = _Grams(os.fspath(model_path), inputs=tuple((x, k) for x, k, _ in chosen))
        sums = gather(engine, statistic, feeds_list, progress) or [np.zeros((k, k)) for _, k, _ in chosen]
        for (_, _, readers), total in zip(chosen, sums):
            yield readers, total
        start = stop
