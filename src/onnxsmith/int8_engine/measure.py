"""What int8 does to a model, measured in onnxruntime with the kernels that will run it.

Five measurements, each one session on an instrumented copy of the model (the copy is
never written; its Linears, tables and Convs are found by passes/quantize_linears.py,
quantize_tables.py and quantize_convs.py, their int8 nodes made by the builders the passes use):

1. ``statistics.measure_inputs``: per input channel, the max |x| of every Linear's input, and the
   input's element count (is it one vector per sample, or a token matrix?).
2. :func:`measure_layer_errors`: beside every Linear, its int8 forms (unsmoothed, smoothed
   with each candidate alpha) on the *same* fp32 input; the error is the RMS over output
   channels of ``||Δy_j|| / ||y_j||``. Per channel, because a massive output channel (the
   face-age net's 1.5e5) would otherwise hide what happens to all the others.
3. ``statistics.measure_ranges``: min and max of values (a Conv's input and output: the static
   activation scales of its QLinearConv form).
4. :class:`SensitivityProbe`: every candidate Linear, table and Conv computes both forms and a
   boolean input picks one (``Where``), so one session answers "how far do the model's
   outputs move when *these* are int8", for any set. A per-layer error does not see what
   follows a layer (softmax amplifies an attention projection's error); this does.
5. ``statistics.input_grams``: ``XᵀX`` of every Linear's input, what error-compensating rounding
   (passes/quantization.quantize_columns_compensated) weighs the weights' rounding errors by.

1, 3 and 5 add up over input sets: int8_engine/statistics.py measures them in shards, on any engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.io.load import discard_weights, load_model, release_weights
from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.types import ensure_types
from onnxsmith.passes.quantize_convs import ConvBuilder, ConvPlan, find_convs
from onnxsmith.passes.quantize_linears import MS_DOMAIN, Int8Builder, Int8Form, LinearPlan, find_linears
from onnxsmith.passes.quantize_tables import TableBuilder, find_tables
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import adapt_feeds

#: Output channels whose energy is below this share of the mean channel's do not dominate the error.
_QUIET_CHANNEL = 1e-3


@dataclass
class InputStats:
    channel_absmax: np.ndarray  # [K]
    elements: int  # largest element count seen
    rows: int  # elements / K: vectors the Linear multiplies per run


class ProbeBuilder:
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

    def matrix(self, block: list, x: ir.Value, width: int) -> ir.Value:
        """``x`` as [rows, width] (its last dim is ``width``): reductions over rows need no known rank."""
        shape = self.constant("onnxsmith::int8::rows", np.array([-1, width], dtype=np.int64))
        return self.node(block, "Reshape", [x, shape])

    def constant(self, name: str, array: np.ndarray) -> ir.Value:
        return add_initializer(self.graph, self.names(name), array)

    def place_after(self, value: ir.Value, block: list) -> None:
        producer = value.producer()
        if producer is not None and producer.graph is self.graph:
            self.graph.insert_after(producer, block)
        else:
            self.graph.insert_before(next(iter(self.graph)), block)


def load_probed(model_path: str | os.PathLike) -> ir.Model:
    model = load_model(model_path)
    ensure_types(model)
    model.opset_imports.setdefault(MS_DOMAIN, 1)
    return model


@dataclass
class ValueRange:
    low: float
    high: float
    elements: int  # largest element count seen


def measure_layer_errors(
    model_path: str | os.PathLike,
    feeds_list: list[dict[str, np.ndarray]],
    forms: dict[str, dict[object, LinearPlan]],
    two_pass: bool = False,
) -> dict[str, dict[object, float]]:
    """Per Linear (by name) in ``forms``: its int8 error for each form (label -> :class:`LinearPlan`), its
    activations quantized in one pass or ``two_pass`` (weights rounded to nearest)."""
    model = load_probed(model_path)
    build = ProbeBuilder(model)
    graph = model.graph
    int8 = Int8Builder(graph, build.names, Int8Form(two_pass=two_pass))
    wanted: dict[str, dict[float | None, str]] = {}
    for linear in find_linears(model):
        if linear.name not in forms:
            continue
        n = linear.kn()[1]
        block: list = []
        y = build.matrix(block, linear.output, n)
        energy = build.reduce(block, "ReduceSumSquare", y, [0])
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
        for label, plan in forms[linear.name].items():
            made = int8.linear(linear, plan)
            if made.prepare:
                build.place_after(linear.input, made.prepare)
            block.extend(made.nodes)
            y_int8 = build.matrix(block, made.output, n)
            delta = build.reduce(block, "ReduceSumSquare", build.node(block, "Sub", [y_int8, y]), [0])
            error = build.node(block, "ReduceMean", [build.node(block, "Div", [delta, energy])], {"keepdims": 0})
            model.graph.outputs.append(error)
            wanted[linear.name][label] = error.name
        build.place_after(linear.output, block)
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
        linear: {label: float(np.sqrt(max(sums[out], 0.0) / count)) for label, out in per.items()}
        for linear, per in wanted.items()
    }


def relative_output_error(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]]) -> float:
    """The largest over float outputs of ||Δ|| / ||reference|| (every input set together); integer outputs (labels)
    have no relative error: the gate counts them (:meth:`SensitivityProbe.structured`)."""
    worst = 0.0
    for name in reference[0]:
        if np.asarray(reference[0][name]).dtype.kind not in "fc":
            continue
        ref = np.concatenate([np.asarray(r[name], dtype=np.float64).reshape(-1) for r in reference])
        if not ref.size:
            continue
        cand = np.concatenate([np.asarray(c[name], dtype=np.float64).reshape(-1) for c in candidate])
        ok = np.isfinite(ref)
        if not np.isfinite(cand[ok]).all():
            return float("inf")
        norm = float(np.linalg.norm(ref[ok]))
        if norm > 0:
            worst = max(worst, float(np.linalg.norm(cand[ok] - ref[ok])) / norm)
    return worst


def _stacked(outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Outputs per input set as a judge reads them: each output stacked over the input sets."""
    return {name: np.stack([o[name] for o in outputs]) for name in outputs[0]}


def unsmoothed_name(linear: str) -> str:
    """The probe's switch for a smoothed Linear's unsmoothed int8 form."""
    return f"{linear}::unsmoothed"


@dataclass
class SensitivityProbe:
    """One session where each candidate's int8 form is switched on or off by a boolean input.

    Candidates: Linears (name -> :class:`LinearPlan`), tables (initializer names) and
    Convs (name -> :class:`ConvPlan`). A smoothed Linear named in ``unsmoothed`` also has its
    unsmoothed int8 form, switched on as ``unsmoothed_name(name)`` (it wins over the smoothed one):
    what dropping its smoothing costs is measured in the same session. ``form``: the int8 Linears'
    rounded weights and two-pass activations, as the rewrite will make them.
    ``error(names)`` runs the calibration inputs with those int8 and the rest fp32.
    """

    model_path: str | os.PathLike
    feeds_list: list[dict[str, np.ndarray]]
    linears: dict[str, LinearPlan]
    tables: set[str] = field(default_factory=set)
    convs: dict[str, ConvPlan] = field(default_factory=dict)
    unsmoothed: set[str] = field(default_factory=set)
    form: Int8Form = field(default_factory=Int8Form)  # rounded weights, two-pass activations
    runs: int = 0  # measurements made (the reference run not counted)
    _stacked_reference: dict[str, np.ndarray] | None = field(default=None, init=False, repr=False)
    _structured: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        model = load_probed(self.model_path)
        build = ProbeBuilder(model)
        graph = model.graph
        self.switches: dict[str, str] = {}
        int8 = Int8Builder(graph, build.names, self.form)
        for linear in find_linears(model):
            if linear.name not in self.linears:
                continue
            plan = self.linears[linear.name]
            forms = (
                [(unsmoothed_name(linear.name), LinearPlan())]
                if not plan.plain and linear.name in self.unsmoothed
                else []
            )
            # the first switch made is the outermost Where: the unsmoothed form wins when both are on
            for switch, form in [*forms, (linear.name, plan)]:
                made = int8.linear(linear, form)
                if made.prepare:
                    build.place_after(linear.input, made.prepare)
                self._switch(build, switch, linear.output, made.nodes)
        int8_convs = ConvBuilder(graph, build.names, build.opset)
        for conv in find_convs(model):
            if conv.name in self.convs:
                prepare, nodes = int8_convs.conv(conv, self.convs[conv.name])
                if prepare:
                    build.place_after(conv.input, prepare)
                self._switch(build, conv.name, conv.output, nodes)
        lookups = TableBuilder(graph, build.names)
        for table in find_tables(model, min_elements=0):
            if table.name in self.tables:
                for gather in table.lookups:
                    self._switch(build, table.name, gather.outputs[0], lookups.lookup(table, gather))
        self.model = model
        self.outputs = [v.name for v in graph.outputs]
        self.session = runner.open_session(model, label=self.model_path)
        self.reference = self.run(set())

    def _switch(self, build: ProbeBuilder, name: str, y: ir.Value, nodes: list[ir.Node]) -> None:
        """After ``y``'s producer: ``nodes`` (computing y in int8), then Where(switch ``name``, int8, y)."""
        graph = build.graph
        if name not in self.switches:
            switch = ir.Value(
                name=build.names(f"onnxsmith::int8::use::{name}"),
                shape=ir.Shape([]),
                type=ir.TensorType(ir.DataType.BOOL),
            )
            graph.inputs.append(switch)
            self.switches[name] = switch.name
        switch = next(v for v in graph.inputs if v.name == self.switches[name])
        uses = list(y.uses())  # before the Where reads it
        chosen = build.node(nodes, "Where", [switch, nodes[-1].outputs[0], y])
        chosen.shape, chosen.dtype = y.shape, y.dtype
        graph.insert_after(y.producer(), nodes)
        for user, index in uses:
            user.replace_input_with(index, chosen)
        if y.is_graph_output():
            graph.outputs[graph.outputs.index(y)] = chosen
            original = y.name
            y.name = build.names(f"{original}::fp32")
            chosen.name = original

    def run(self, int8: set[str]) -> list[dict[str, np.ndarray]]:
        switches = {name: np.array(unit in int8) for unit, name in self.switches.items()}
        return [
            runner.run(self.session, {**feeds, **switches}, self.outputs, label=self.model_path)
            for feeds in self.feeds_list
        ]

    def error(self, int8: set[str]) -> float:
        """The outputs' relative error (see :func:`relative_output_error`) with ``int8`` switched on."""
        self.runs += 1
        return relative_output_error(self.reference, self.run(set(int8)))

    def judged(
        self, int8: set[str], judge: Callable[[dict, dict], float], *, labels_only: bool = False
    ) -> tuple[float, float]:
        """The outputs' relative error with ``int8`` switched on, and how far the gate ``judge`` puts them from
        the reference (in units of its bounds, <= 1 passes; both stacked over the input sets); with ``labels_only``
        the gate judges the integer outputs alone (the relative error measures the others)."""
        self.runs += 1
        outputs = self.run(set(int8))
        reference, candidate = self._stacked_outputs(), _stacked(outputs)
        if labels_only:
            reference = {k: v for k, v in reference.items() if v.dtype.kind not in "fc"}
            candidate = {k: candidate[k] for k in reference}
        return relative_output_error(self.reference, outputs), judge(reference, candidate)

    def _stacked_outputs(self) -> dict[str, np.ndarray]:
        """The reference outputs stacked over the input sets, once: the same for every judged run."""
        if self._stacked_reference is None:
            self._stacked_reference = _stacked(self.reference)
        return self._stacked_reference

    def structured(self, structured_judge) -> str | None:
        """Which reference outputs ``structured_judge`` (``TransformContext.structured_judge``: None where it judges
        none) judges for what they are: "floats" where some float output is one (a detector's rows, a top-k, audio),
        "labels" where only integer outputs are, else None."""
        if structured_judge is None:
            return None
        if self._structured is None:  # the same reference for every run: asked once
            reference = self._stacked_outputs()
            floats = {k: v for k, v in reference.items() if v.dtype.kind in "fc"}
            if floats and structured_judge(floats, floats) is not None:
                self._structured = "floats"
            elif structured_judge(reference, reference) is not None:
                self._structured = "labels"
            else:
                self._structured = ""
        return self._structured or None

    def close(self) -> None:
        del self.session
        discard_weights(self.model)  # its int8 tables and weights: not when the next probe is already made
