"""What int8 does to each Linear layer, measured in onnxruntime with the kernel that will run it.

Three measurements, each one session on an instrumented copy of the model (the copy is
never written; its Linears are found by :func:`onnxsmith.passes.quantize_linears.find_linears`):

1. :func:`measure_inputs`: per input channel, the max |x| of every Linear's input, and the
   input's element count (is it one vector per sample, or a token matrix?).
2. :func:`measure_layer_errors`: beside every Linear, its int8 form (DynamicQuantizeMatMul,
   optionally smoothed with each candidate alpha) on the *same* fp32 input; the error is the
   RMS over output channels of ``||Δy_j|| / ||y_j||``. Per channel, because a massive output
   channel (the face-age net's 1.5e5) would otherwise hide what happens to all the others.
3. :class:`SensitivityProbe`: every candidate Linear computes both forms and a boolean input
   picks one (``Where``), so one session answers "how far do the model's outputs move when
   these Linears are int8": each alone (its end-to-end sensitivity), then the chosen set.
   A per-layer error does not see what follows a layer (softmax amplifies an attention
   projection's error); this does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.io.load import load_model, release_weights
from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.types import ensure_types
from onnxsmith.passes.quantize_linears import (
    MS_DOMAIN,
    find_linears,
    int8_linear_nodes,
    smoothing_factors,
)
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import adapt_feeds

#: Output channels whose energy is below this share of the mean channel's do not dominate the error.
_QUIET_CHANNEL = 1e-3


@dataclass
class InputStats:
    channel_absmax: np.ndarray  # [K]
    elements: int  # largest element count seen
    rows: int  # elements / K: vectors the Linear multiplies per run


class _Builder:
    """Appends small node chains after a value's producer and names their outputs."""

    def __init__(self, model: ir.Model) -> None:
        self.graph = model.graph
        self.names = FreshNames(self.graph)
        self.opset = model.opset_imports.get("", 17)

    def node(self, block: list, op: str, inputs, attributes=None, *, domain: str = "", name: str | None = None):
        node = ir.node(op, inputs, attributes=attributes or {}, domain=domain, num_outputs=1)
        node.outputs[0].name = self.names(name or f"onnxsmith::int8::{op}")
        block.append(node)
        return node.outputs[0]

    def reduce(self, block: list, op: str, x: ir.Value, axes: list[int], name: str | None = None) -> ir.Value:
        """ReduceMax/ReduceSumSquare over ``axes``, keepdims 0, in the model's opset's form."""
        if self.opset < 18:
            return self.node(block, op, [x], {"axes": axes, "keepdims": 0}, name=name)
        axes_value = self.constant("onnxsmith::int8::axes", np.array(axes, dtype=np.int64))
        return self.node(block, op, [x, axes_value], {"keepdims": 0}, name=name)

    def constant(self, name: str, array: np.ndarray) -> ir.Value:
        return add_initializer(self.graph, self.names(name), array)

    def place_after(self, value: ir.Value, block: list) -> None:
        producer = value.producer()
        if producer is not None and producer.graph is self.graph:
            self.graph.insert_after(producer, block)
        else:
            self.graph.insert_before(next(iter(self.graph)), block)


def _load(model_path: str | os.PathLike) -> ir.Model:
    model = load_model(model_path)
    ensure_types(model)
    model.opset_imports.setdefault(MS_DOMAIN, 1)
    return model


def _rank(value: ir.Value) -> int | None:
    return len(value.shape) if value.shape is not None else None


def measure_inputs(model_path: str | os.PathLike, feeds_list: list[dict[str, np.ndarray]]) -> dict[str, InputStats]:
    """Per Linear (by name): its input's per-channel max |x| and size, over every input set."""
    model = _load(model_path)
    build = _Builder(model)
    outputs: dict[str, tuple[str, str]] = {}  # input value name -> (absmax output, size output)
    users: dict[str, str] = {}
    for linear in find_linears(model):
        x = linear.input
        users[linear.name] = x.name
        rank = _rank(x)
        if x.name in outputs or not rank:
            continue
        block: list = []
        absmax = build.reduce(block, "ReduceMax", build.node(block, "Abs", [x]), list(range(rank - 1)))
        size = build.node(block, "Size", [x])
        build.place_after(x, block)
        model.graph.outputs.extend([absmax, size])
        outputs[x.name] = (absmax.name, size.name)
    if not outputs:
        return {}
    session = runner.open_session(model, options=runner.session_options(optimize=False), label=model_path)
    peaks: dict[str, np.ndarray] = {}
    sizes: dict[str, int] = {}
    names = [n for pair in outputs.values() for n in pair]
    for feeds in feeds_list:
        results = runner.run(session, adapt_feeds(feeds, model), names, label=model_path)
        for x, (absmax, size) in outputs.items():
            value = np.nan_to_num(np.asarray(results[absmax], dtype=np.float32), nan=0.0, posinf=0.0)
            peaks[x] = value if x not in peaks else np.maximum(peaks[x], value)
            sizes[x] = max(sizes.get(x, 0), int(results[size]))
    del session
    release_weights(model)
    found = {}
    for name, x in users.items():
        if x in peaks:
            k = max(int(peaks[x].size), 1)
            found[name] = InputStats(peaks[x], sizes[x], sizes[x] // k)
    return found


def measure_layer_errors(
    model_path: str | os.PathLike,
    feeds_list: list[dict[str, np.ndarray]],
    inputs: dict[str, InputStats],
    alphas: tuple[float | None, ...],
    names: set[str] | None = None,
) -> dict[str, dict[float | None, float]]:
    """Per Linear (by name, those in ``names``): its int8 error for each smoothing alpha (None: unsmoothed)."""
    model = _load(model_path)
    build = _Builder(model)
    graph = model.graph
    wanted: dict[str, dict[float | None, str]] = {}
    for linear in find_linears(model):
        stats = inputs.get(linear.name)
        rank = _rank(linear.output)
        if stats is None or not rank or (names is not None and linear.name not in names):
            continue
        w = linear.weight_array()
        y = linear.output
        axes = list(range(rank - 1))
        block: list = []
        energy = build.reduce(block, "ReduceSumSquare", y, axes)
        floor = build.node(
            block,
            "Mul",
            [
                build.node(block, "ReduceMean", [energy], {"keepdims": 1}),
                build.constant("onnxsmith::int8::quiet", np.array(_QUIET_CHANNEL, np.float32)),
            ],
        )
        energy = build.node(block, "Add", [energy, floor])
        wanted[linear.name] = {}
        for alpha in alphas:
            s = None if alpha is None else smoothing_factors(stats.channel_absmax, w, alpha)
            nodes, y_int8 = int8_linear_nodes(graph, linear, s, weights={}, divisors={}, names=build.names)
            block.extend(nodes)
            delta = build.reduce(block, "ReduceSumSquare", build.node(block, "Sub", [y_int8, y]), axes)
            error = build.node(block, "ReduceMean", [build.node(block, "Div", [delta, energy])], {"keepdims": 0})
            model.graph.outputs.append(error)
            wanted[linear.name][alpha] = error.name
        build.place_after(y, block)
    if not wanted:
        return {}
    session = runner.open_session(model, label=model_path)
    out_names = [n for per in wanted.values() for n in per.values()]
    sums = dict.fromkeys(out_names, 0.0)
    for feeds in feeds_list:
        results = runner.run(session, adapt_feeds(feeds, model), out_names, label=model_path)
        for name in out_names:
            sums[name] += float(results[name])
    del session
    release_weights(model)
    count = len(feeds_list)
    return {
        linear: {alpha: float(np.sqrt(max(sums[out], 0.0) / count)) for alpha, out in per.items()}
        for linear, per in wanted.items()
    }


def relative_output_error(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]]) -> float:
    """The largest over float outputs of ||Δ|| / ||reference|| (every input set together)."""
    worst = 0.0
    for name in reference[0]:
        ref = np.concatenate([np.asarray(r[name], dtype=np.float64).reshape(-1) for r in reference])
        if ref.dtype.kind != "f" or not ref.size:
            continue
        cand = np.concatenate([np.asarray(c[name], dtype=np.float64).reshape(-1) for c in candidate])
        ok = np.isfinite(ref)
        if not np.isfinite(cand[ok]).all():
            return float("inf")
        norm = float(np.linalg.norm(ref[ok]))
        if norm > 0:
            worst = max(worst, float(np.linalg.norm(cand[ok] - ref[ok])) / norm)
    return worst


@dataclass
class SensitivityProbe:
    """One session where each candidate Linear's int8 form is switched on or off by a boolean input."""

    model_path: str | os.PathLike
    feeds_list: list[dict[str, np.ndarray]]
    plans: dict[str, np.ndarray | None]  # candidate Linear -> its smoothing (None: unsmoothed)
    reference: list[dict[str, np.ndarray]] = field(default_factory=list)

    def __post_init__(self) -> None:
        model = _load(self.model_path)
        build = _Builder(model)
        graph = model.graph
        self.switches: dict[str, str] = {}
        weights: dict = {}
        divisors: dict = {}
        for linear in find_linears(model):
            if linear.name not in self.plans:
                continue
            nodes, y_int8 = int8_linear_nodes(
                graph, linear, self.plans[linear.name], weights=weights, divisors=divisors, names=build.names
            )
            switch = ir.Value(
                name=build.names(f"onnxsmith::int8::use::{linear.name}"),
                shape=ir.Shape([]),
                type=ir.TensorType(ir.DataType.BOOL),
            )
            graph.inputs.append(switch)
            self.switches[linear.name] = switch.name
            y = linear.output
            uses = list(y.uses())
            chosen = build.node(nodes, "Where", [switch, y_int8, y])
            chosen.shape, chosen.dtype = y.shape, y.dtype
            graph.insert_after(y.producer(), nodes)
            for user, index in uses:
                user.replace_input_with(index, chosen)
            if y.is_graph_output():
                graph.outputs[graph.outputs.index(y)] = chosen
                name = y.name
                y.name = build.names(f"{name}::fp32")
                chosen.name = name
        self.model = model
        self.outputs = [v.name for v in graph.outputs]
        self.session = runner.open_session(model, label=self.model_path)
        self.reference = self.run(set())

    def run(self, int8: set[str]) -> list[dict[str, np.ndarray]]:
        switches = {name: np.array(linear in int8) for linear, name in self.switches.items()}
        return [
            runner.run(self.session, {**feeds, **switches}, self.outputs, label=self.model_path)
            for feeds in self.feeds_list
        ]

    def error(self, int8: set[str]) -> float:
        """The outputs' relative error (see :func:`relative_output_error`) with ``int8`` switched on."""
        return relative_output_error(self.reference, self.run(int8))

    def close(self) -> None:
        del self.session
        release_weights(self.model)
