"""Activation ranges: the largest |x| of every float tensor, measured by running the model.

Exposing every intermediate tensor as an output would copy all of them out of
onnxruntime (gigabytes for a ViT-L). Instead the model is instrumented: each
float tensor gets a few reductions (max |x|, count of NaN/inf, fraction of
values too small for fp16) whose scalar results are the only extra outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.measurements import TensorRange
from onnxsmith.analysis.precision_policy import MOVEMENT_OPS
from onnxsmith.core.limits import FP16_MIN_NORMAL
from onnxsmith.core.transform import JobEngine
from onnxsmith.io.load import load_model, release_weights
from onnxsmith.irutil.casts import insert_after_producer
from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.types import FLOAT_TYPES, ensure_types
from onnxsmith.runtime import runner
from onnxsmith.runtime.fp16_storage import ROUNDING_MARK, emulate_fp16_storage, has_fp16
from onnxsmith.runtime.inputs import adapt_feeds

_SUFFIXES = ("absmax", "nonfinite", "tiny", "elements")


def instrument(model: ir.Model, values: list[ir.Value]) -> list[str]:
    """Add reduction outputs for ``values`` (main graph); return the output names added.

    Each value's reductions go right after the node that makes it, so onnxruntime (in
    priority order) runs them while the value is fresh and frees it as it would have:
    measuring a big model holds no more activations than running it. Twelve passes over
    each tensor give all the statistics (counts are derived from one another).
    """
    graph = model.graph
    added = []
    # The three numbers every measurement compares with: one Constant each, first in the graph.
    shared = [
        _const(np.float32(number), f"onnxsmith::const_{name}")
        for name, number in (("inf", np.inf), ("zero", 0.0), ("fp16_min_normal", FP16_MIN_NORMAL))
    ]
    if len(graph):
        graph.insert_before(next(iter(graph)), [v.producer() for v in shared])
    else:
        graph.extend([v.producer() for v in shared])
    infinity, zero, min_normal = shared
    for value in values:
        block: list[ir.Node] = []

        def add(op, inputs, attributes=None, *, name=None, block=block):
            node = ir.node(op, inputs, attributes=attributes or {}, num_outputs=1)
            block.append(node)  # placed right after the value's producer
            node.outputs[0].name = name or f"onnxsmith::{op}_{len(graph) + len(block)}"
            return node.outputs[0]

        def count(mask):
            return add("ReduceSum", [add("Cast", [mask], {"to": int(ir.DataType.FLOAT)})], {"keepdims": 0})

        x = value
        if value.dtype != ir.DataType.FLOAT:
            x = add("Cast", [x], {"to": int(ir.DataType.FLOAT)})
        absolute = add("Abs", [x])
        finite = add("Less", [absolute, infinity])  # false for NaN and inf alike
        # max |x| over the finite values (NaN/inf counted separately)
        clean = add("Where", [finite, absolute, zero])
        absmax = add("ReduceMax", [clean], {"keepdims": 0}, name=f"{value.name}::absmax")
        elements = add("Size", [x], name=f"{value.name}::elements")
        size = add("Cast", [elements], {"to": int(ir.DataType.FLOAT)})
        nonfinite = add("Sub", [size, count(finite)], name=f"{value.name}::nonfinite")
        nonzero_count = add("Identity", [count(add("Greater", [clean, zero]))], name=f"{value.name}::nonzero")
        below = count(add("Less", [clean, min_normal]))  # zeros (and NaN/inf) included
        # tiny = below - zeros = below - (size - nonzero)
        tiny_count = add("Add", [add("Sub", [below, size]), nonzero_count], name=f"{value.name}::tiny")
        insert_after_producer(graph, value, block)
        for out in (absmax, nonfinite, tiny_count, nonzero_count, elements):
            graph.outputs.append(out)
            added.append(out.name)
    return added


#: Input sets per shard where an engine runs them.
SHARD = 16


def _session_options(threads: int | None = None):
    """Unoptimised (the same arithmetic; the instrumented graph is large and fusions would skip the measured
    tensors anyway), and in priority order, so each measured tensor is reduced and freed as soon as it is made
    rather than held until the whole graph has run."""
    return runner.session_options(optimize=False, priority_order=True, threads=threads)


def _measured(model: ir.Model, fp16_storage: bool, derive_movement: bool):
    """``model`` made what is measured (fp16 storage emulated, or typed), and (its measured tensors with node and
    order, those tensors in one group per session): the same in every process that measures it."""
    # Instrumenting adds outputs and emulation keeps the interface: the inputs stay the model's own.
    if fp16_storage:
        emulate_fp16_storage(model)
    else:
        ensure_types(model)
    targets = measurable_values(model, skip_movement=derive_movement)
    return targets, _chunks([v for v, _, _ in targets], len(model.graph))


def _add_up(each_set, own: list[str], stats: dict[str, dict[str, float]], collected: dict[str, list]) -> None:
    """Each input set's results into ``stats`` (maxima and sums: the same in any order) and ``collected``."""
    for results in each_set:
        results = dict(results)
        for name in own:
            collected.setdefault(name, []).append(results.pop(name))
        for name, array in results.items():
            tensor, _, suffix = name.rpartition("::")
            entry = stats.setdefault(
                tensor, {"absmax": 0.0, "nonfinite": 0.0, "tiny": 0.0, "nonzero": 0.0, "elements": 0.0}
            )
            value = float(array)
            entry[suffix] = max(entry[suffix], value) if suffix in ("absmax", "elements") else entry[suffix] + value


@dataclass
class RangeWorker:
    """What a worker holds: the session on the model instrumented for group ``chunk`` of its tensors; a shard of
    input sets in, each set's results out (scalars per tensor, and the model's outputs where ``own``)."""

    model_path: str
    fp16_storage: bool
    derive_movement: bool
    chunk: int
    own: bool
    threads: int | None = None
    _open: tuple[ir.Model, runner.Session, list[str]] | None = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": None}  # a session stays where it was opened

    def with_threads(self, threads: int) -> RangeWorker:
        return dataclasses.replace(self, threads=threads, _open=None)

    def __call__(self, shard: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        if self._open is None:
            model = load_model(self.model_path)
            _, chunks = _measured(model, self.fp16_storage, self.derive_movement)
            own = [v.name for v in model.graph.outputs] if self.own else []
            names = instrument(model, chunks[self.chunk])
            session = runner.open_session(model, options=_session_options(self.threads), label=self.model_path)
            self._open = model, session, own + names
        model, session, names = self._open
        return [runner.run(session, adapt_feeds(f, model), names, label=self.model_path) for f in shard]

    def close(self) -> None:
        if self._open is not None:
            model, session, _ = self._open
            self._open = None
            del session
            release_weights(model)


def _const(value: np.generic, name: str) -> ir.Value:
    node = ir.node("Constant", [], attributes={"value": ir.tensor(np.asarray(value))}, num_outputs=1)
    node.outputs[0].name = name
    return node.outputs[0]


#: Ops whose output holds only values of their data inputs (all inputs for Concat, else the first):
#: the precision policy's movement ops but those that bring values of their own (Pad's fill,
#: Scatter's updates, Dropout's scaling in training).
DATA_MOVEMENT_OPS = MOVEMENT_OPS - {"Pad", "ScatterND", "ScatterElements", "Dropout"}


def _moves_data(node: ir.Node) -> bool:
    """Data movement whose inputs are measured (not constants): its range can be derived."""
    if node.op_type not in DATA_MOVEMENT_OPS or node.domain not in ("", "ai.onnx"):
        return False
    sources = [v for v in (node.inputs if node.op_type == "Concat" else node.inputs[:1]) if v is not None]
    return bool(sources) and not any(
        v.is_initializer() or (v.producer() is not None and v.producer().op_type == "Constant") for v in sources
    )


def measurable_values(model: ir.Model, *, skip_movement: bool = False) -> list[tuple[ir.Value, ir.Node | None, int]]:
    """Float tensors of the main graph worth measuring, with the node to blame and its order.

    In a storage-faithful model each fp16 tensor appears once, under its own
    name, as the Cast that rounds it; it is blamed on the node that computed it.
    ``skip_movement``: leave out the outputs of :data:`DATA_MOVEMENT_OPS` (their range
    is their input's, or within it).
    """
    found = [(v, None, -1) for v in model.graph.inputs if v.dtype in FLOAT_TYPES]
    order_of: dict[ir.Node, int] = {}
    for order, node in enumerate(model.graph):
        order_of[node] = order
        if node.op_type == "Constant":
            continue
        blamed, position = node, order
        if node.meta.get(ROUNDING_MARK):
            if node.attributes.get_int("to") != ir.DataType.FLOAT16:
                continue  # the widening back to fp32 carries the same values
            blamed = node.inputs[0].producer()
            position = order_of.get(blamed, -1) if blamed is not None else -1
        elif any(out.uses() and all(u.meta.get(ROUNDING_MARK) for u, _ in out.uses()) for out in node.outputs):
            continue  # an fp32 result that exists only to be rounded: measured after rounding
        elif skip_movement and _moves_data(node):
            continue
        for out in node.outputs:
            if out.dtype in FLOAT_TYPES and out.name:
                found.append((out, blamed, position))
    return found


def measure_ranges(
    model_path: str | os.PathLike,
    feeds_list: list[dict[str, np.ndarray]],
    *,
    fp16_storage: bool | None = None,
    outputs: dict[str, np.ndarray] | None = None,
    derive_movement: bool = False,
    engine: JobEngine | None = None,
) -> list[TensorRange]:
    """Run ``model_path`` on every input set and return each float tensor's range, in graph order.

    ``fp16_storage``: emulate fp16 storage (default: when the model has fp16 tensors),
    so the ranges are those a GPU would see, overflow included. ``outputs``: a dict to
    fill with the model's own outputs on the same inputs (stacked on a leading axis, as
    :func:`onnxsmith.verify.compare.run_all` gives them), saving a second run of a big model.
    ``derive_movement``: do not measure what pure data movement (Reshape, Transpose, Slice,
    Concat, ...) makes; give it its inputs' range instead, an upper bound (``elements`` 0).
    A third of a transformer's tensors are such copies: measuring is that much faster.
    ``engine``: where the input sets run, in shards of :data:`SHARD` (None: here, one after another); each
    set's results are added up here in the sets' order, so the ranges are the same on every engine.
    """
    model = load_model(model_path)
    if fp16_storage is None:
        fp16_storage = has_fp16(model)
    targets, chunks = _measured(model, fp16_storage, derive_movement)
    own = [v.name for v in model.graph.outputs] if outputs is not None else []
    stats: dict[str, dict[str, float]] = {}
    collected: dict[str, list[np.ndarray]] = {}
    for index, chunk in enumerate(chunks):
        if engine is None:
            with _instrumented(model, chunk) as names:
                session = runner.open_session(model, options=_session_options(), label=model_path)
            each = (runner.run(session, adapt_feeds(f, model), own + names, label=model_path) for f in feeds_list)
            _add_up(each, own, stats, collected)
            del session  # it reads the weights' maps: free it before unmapping them (and before the next one)
        else:
            worker = RangeWorker(os.fspath(model_path), fp16_storage, derive_movement, index, bool(own))
            shards = [list(feeds_list[i : i + SHARD]) for i in range(0, len(feeds_list), SHARD)]
            try:
                results = engine.map(worker, shards)
            finally:
                engine.release(worker)
            _add_up((r for shard in results for r in shard), own, stats, collected)
        own = []  # the model's own outputs: from the first session
    release_weights(model)
    if outputs is not None:
        outputs.update({name: np.stack(values) for name, values in collected.items()})
    if derive_movement:
        targets = _derive_movement(model, targets, stats)
    ranges = []
    for value, node, order in targets:
        entry = stats[value.name]
        ranges.append(
            TensorRange(
                name=value.name,
                node=node_label(node) if node is not None else "",
                op_type=node.op_type if node is not None else "input",
                order=order,
                absmax=entry["absmax"],
                nonfinite=int(entry["nonfinite"]),
                tiny_fraction=entry["tiny"] / entry["nonzero"] if entry["nonzero"] else 0.0,
                dtype=value.dtype.name if value.dtype else "?",
                elements=int(entry["elements"]),
            )
        )
    return ranges


#: Nodes :func:`instrument` adds per measured value (at most).
NODES_PER_VALUE = 18
#: Nodes one measuring session may add to a model, at least (see :func:`_chunks`).
SESSION_ADDED_NODES = 100_000


def _chunks(values: list[ir.Value], nodes: int) -> list[list[ir.Value]]:
    """``values`` in groups measured one session each, a session adding at most as many nodes as the model
    has (or :data:`SESSION_ADDED_NODES`).

    Instrumenting every value at once adds ~18 nodes per value: a 100,000-node chain becomes 1.8 M nodes,
    and onnxruntime's memory for a graph grows faster than its node count (gigabytes here, where the
    chain alone runs in 0.4 GB). In groups, memory stays proportional to the model; an ordinary model
    (a U-Net, a ViT) is measured in one session, as before.
    """
    size = max(1, max(nodes, SESSION_ADDED_NODES) // NODES_PER_VALUE)
    return [values[i : i + size] for i in range(0, len(values), size)] or [[]]


@contextlib.contextmanager
def _instrumented(model: ir.Model, values: list[ir.Value]):
    """``model`` :func:`instrument`-ed for ``values`` (the output names added), as it was afterwards."""
    graph = model.graph
    before, outputs = set(graph), len(graph.outputs)
    names = instrument(model, values)
    try:
        yield names
    finally:
        while len(graph.outputs) > outputs:
            graph.outputs.pop()
        graph.remove([node for node in graph if node not in before], safe=True)


def _derive_movement(model: ir.Model, targets, stats: dict[str, dict[str, float]]):
    """Add the outputs of data movement to ``targets`` and ``stats`` from their inputs' (graph order)."""
    measured = {value for value, _, _ in targets}
    found = list(targets)
    for order, node in enumerate(model.graph):
        if not _moves_data(node):
            continue
        sources = node.inputs if node.op_type == "Concat" else node.inputs[:1]
        known = [stats[v.name] for v in sources if v is not None and v.name in stats]
        if not known:
            continue
        for out in node.outputs:
            if out.dtype in FLOAT_TYPES and out.name and out not in measured and out.name not in stats:
                stats[out.name] = {
                    "absmax": max(k["absmax"] for k in known),
                    "nonfinite": max(k["nonfinite"] for k in known),
                    "tiny": max(k["tiny"] for k in known),
                    "nonzero": max(k["nonzero"] for k in known),
                    "elements": 0.0,
                }
                found.append((out, node, order))
    found.sort(key=lambda t: t[2])
    return found
