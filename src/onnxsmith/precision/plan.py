"""The precision engine's decisions: measured ranges in, a :class:`Plan` out; nothing is changed here.

Every low-precision conversion onnxsmith makes (``fp16``, ``fuse --precision fp16``) is
decided by the functions of this module, from data: the model (read, never written) and
the ranges measured on it (:mod:`onnxsmith.probes.ranges`). What they decide:

* **Residual streams** (:func:`decide_streams`): a pre-LN transformer's stream that
  overflows the low type either stays one fp32 path end to end, with the branches that
  write its over-range values (``residual_fp32``), or is carried scaled by a power of two
  so that it and its writers fit (``rescale``); see :mod:`onnxsmith.passes.residual_rescale`.
* **Islands** (:func:`decide`): the tensors that stay fp32 (measured over range or
  underflowing, the stream kept fp32, a fused graph's skip stream) and the nodes that
  compute in fp32 whatever the ranges (the op policy, the cost rule, a fused graph's
  normalisations and per-sample tail), each with its reason.
* **Weights stored low though read in fp32** (:class:`StoreLow` groups, from :func:`decide`):
  a recurrent cell's, and those of nodes kept fp32 for their tensors (small, or out of
  range), widened by a Cast at load; each group kept only if rounding it is measured not to
  matter (:func:`check_store_low`, the engine measuring).

The rules themselves live in :mod:`onnxsmith.analysis.precision_policy`; :mod:`.apply`
carries a plan out and :mod:`.report` shows it. What differs between ``fp16`` and ``fuse``
is data: a :class:`Settings`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.measurements import TensorRange
from onnxsmith.analysis.precision_policy import (
    RECURRENT_OPS,
    Limits,
    SmallNodes,
    Unsafe,
    computed_from_constants,
    constant_names,
    policy_reason,
    unsafe_activations,
    unsafe_constant,
    weights_read,
)
from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.types import FLOAT_TYPES
from onnxsmith.irutil.walk import const_array, constant_tensors
from onnxsmith.passes.residual_rescale import ResidualStream, choose_scale, find_residual_streams
from onnxsmith.settings.fp16 import DEFAULT_HEADROOM

#: How a node computing a massive activation is kept (the islands table groups on it).
WRITER_REASON = "computes what writes into the residual stream"
#: Normalisations a fused graph computes in fp32 (they read the fp32 residual stream and reduce over it).
FUSED_NORM_OPS = frozenset({"LayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})
NORM_REASON = "normalisation (fuse keeps LayerNorms fp32)"
TAIL_REASON = "after the token row is selected: one vector per sample, fp32 costs nothing"
SKIP_STREAM_REASON = "residual stream"


@dataclass(frozen=True)
class Settings:
    """What a conversion may do: ``fp16``'s options, or the fixed choices of ``fuse --precision fp16``."""

    dtype: ir.DataType = ir.DataType.FLOAT16
    headroom: float = DEFAULT_HEADROOM
    #: Keep an overflowing residual stream, and the branches writing its over-range values, fp32.
    residual_fp32: bool = True
    #: Rescale every rescalable stream (True), none (False), or where the stream is carried low (None).
    rescale: bool | None = None
    #: The cost rule: nodes whose tensors are tiny next to the largest activation stay fp32.
    small_fp32: bool = True
    keep_io_types: bool = True
    #: A fused graph: its normalisations and SkipLayerNormalization's skip stream stay fp32.
    fused: bool = False
    #: A fused graph: what follows the selection of one token row (a CLS head) stays fp32.
    tail_fp32: bool = False

    @classmethod
    def for_fused_graph(cls) -> Settings:
        """``fuse --precision fp16``: an overflowing stream rescaled so the fp16 projections writing it fit
        (the fused graph's SkipLayerNormalizations keep it fp32); no cost rule; the per-sample tail fp32."""
        return cls(residual_fp32=False, small_fp32=False, fused=True, tail_fp32=True)

    @property
    def limits(self) -> Limits:
        return Limits.for_dtype(self.dtype, self.headroom)


@dataclass
class StreamDecision:
    """One residual stream: how it is carried, with what was measured on it."""

    stream: ResidualStream
    peak: float  # measured max |x| over the stream (source scale)
    peak_tensor: str = ""
    overflows: bool = False  # peak over the low type's safe limit
    scale: float = 1.0  # carried scaled by this (1.0: not rescaled)
    kept_fp32: bool = False
    note: str = ""  # why it was not rescaled although asked
    #: (writer, its measured max |x|, nodes kept fp32 to compute it) for over-range writers
    writers: list[tuple[str, float, int]] = field(default_factory=list)
    #: tensor -> why, for the stream values and writer branches kept fp32
    keep_fp32: dict[str, str] = field(default_factory=dict)


@dataclass
class Plan:
    """Everything decided for one graph, as data: what :func:`onnxsmith.precision.apply.apply_plan` carries out."""

    settings: Settings
    streams: list[StreamDecision] = field(default_factory=list)
    #: measured tensors over the safe limit or underflowing
    unsafe: dict[str, Unsafe] = field(default_factory=dict)
    #: tensor -> why it stays fp32 (with the node that writes it and the nodes that read it)
    keep_fp32: dict[str, str] = field(default_factory=dict)
    #: node -> why it computes in fp32 whatever the ranges (op policy, cost, fused norms, tail)
    node_reasons: dict[ir.Node, str] = field(default_factory=dict)
    #: tensors the cost rule found small, with the numbers (the islands table shows them)
    small: dict[str, str] = field(default_factory=dict)
    #: weights read in fp32 that may be stored in the low type, widened by a Cast at load, in groups
    #: each measured on its own (:func:`check_store_low`)
    store_low_groups: list[StoreLow] = field(default_factory=list)
    #: what measuring those weights rounded showed, one line each (why some are kept fp32 after all)
    store_low_checked: list[str] = field(default_factory=list)

    @property
    def scaled(self) -> dict[str, float]:
        """Measured tensors the plan carries scaled, with the factor."""
        return {v.name: d.scale for d in self.streams if d.scale != 1.0 for v in d.stream.scaled}

    @property
    def store_low(self) -> dict[str, str]:
        """Weights stored in the low type although read in fp32 (no measurement refused them) -> why."""
        return {
            name: why for group in self.store_low_groups if not group.refused for name, why in group.weights.items()
        }


@dataclass
class StoreLow:
    """Weights read in fp32 that may be stored in the low type and widened by a Cast as the model loads.

    onnxruntime folds ``Cast(weight)`` into an fp32 weight when it loads the model: the node computes
    exactly as before, from the weight rounded once, as every converted weight is; the file keeps
    the low type. Measured before it is done (:func:`check_store_low`).
    """

    what: str  # how the report counts them: "recurrent weights", ...
    weights: dict[str, str]  # weight -> the node that reads it in fp32
    #: Also accepted when rounding them moves the outputs by at most a quarter of what rounding the weights
    #: converted anyway does (:data:`STORE_LOW_SHARE`), not only within the fixed budget.
    compared: bool = False
    refused: str = ""  # why measuring them refused them ("" while they are stored low)


def decide_streams(model: ir.Model, ranges: list[TensorRange], settings: Settings) -> list[StreamDecision]:
    """How each residual stream of ``model`` (types inferred) is carried, from its measured peaks."""
    limit = settings.limits.max_abs
    measured = {r.name: r.absmax for r in ranges}
    decisions = []
    for stream in find_residual_streams(model):
        peak_value = max(stream.values, key=lambda v: measured.get(v.name, 0.0))
        peak = measured.get(peak_value.name, 0.0)
        decision = StreamDecision(stream, peak, peak_value.name, overflows=peak > limit)
        decisions.append(decision)
        wanted = (
            settings.rescale if settings.rescale is not None else (decision.overflows and not settings.residual_fp32)
        )
        if wanted and stream.problem is not None:
            decision.note = f"not rescaled: {stream.problem}"
        elif wanted:
            writers_peak = max((measured.get(v.name, 0.0) for v in stream.scaled), default=0.0)
            decision.scale = choose_scale(max(peak, writers_peak), limit)
        if decision.overflows and settings.residual_fp32:
            decision.kept_fp32 = True
            reason = f"residual stream, max |x| {peak:.3g} in the source"
            decision.keep_fp32.update({v.name: reason for v in stream.values})
            if decision.scale == 1.0:
                _keep_massive_writers(decision, measured, limit)
    return decisions


def _keep_massive_writers(decision: StreamDecision, measured: dict[str, float], limit: float) -> None:
    """Keep fp32 every branch that writes an over-range value into the (fp32) stream."""
    stream = decision.stream
    for writer in stream.writers():
        peak = measured.get(writer.name, 0.0)
        if peak <= limit:
            continue
        reason = f"{WRITER_REASON} '{writer.name}' (max |x| {peak:.3g})"
        nodes = stream.writer_nodes(writer)
        decision.writers.append((writer.name, peak, len(nodes)))
        for node in nodes:
            for out in node.outputs:
                if out.dtype in FLOAT_TYPES and out.name:
                    decision.keep_fp32.setdefault(out.name, reason)


def decide(
    model: ir.Model,
    ranges: list[TensorRange],
    settings: Settings,
    streams: list[StreamDecision] = (),
    *,
    keep_fp32: dict[str, str] | None = None,
) -> Plan:
    """The islands of ``model`` (types inferred) from its measured ``ranges``, given the stream decisions.

    ``keep_fp32`` adds tensors a caller wants kept fp32 (name -> reason).
    """
    plan = Plan(settings, streams=list(streams))
    keep = dict(keep_fp32 or {})
    for decision in plan.streams:
        for name, reason in decision.keep_fp32.items():
            keep.setdefault(name, reason)
    plan.unsafe = unsafe_activations(ranges, settings.limits, scale=plan.scaled)
    for name, unsafe in plan.unsafe.items():
        keep.setdefault(name, unsafe.reason)
    plan.keep_fp32 = keep
    tail = _per_sample_tail(model) if settings.tail_fp32 else set()
    # A fused graph's residual stream is computed and stored fp32 by the nodes that write it; the
    # projections that read it (a post-LN block's QKV and FFN) read it in fp16 when it fits.
    stream_writers = _skip_stream_writers(model) if settings.fused else set()
    rest = []
    for graph in model.graphs():
        for node in graph:
            reason = _node_reason(node, settings, tail)
            if reason is None and node in stream_writers:
                reason = SKIP_STREAM_REASON
            if reason is not None:
                plan.node_reasons[node] = reason
            else:
                rest.append(node)
    small_nodes: dict[ir.Node, str] = {}
    if settings.small_fp32:
        small = SmallNodes(model, ranges)
        plan.small = small.tensors
        small_nodes = small.decide(rest)
        plan.node_reasons.update(small_nodes)
    recurrent = _recurrent_weights(model)
    kept_for_tensors = _weights_of_nodes_kept_for_tensors(model, plan, small_nodes, exclude=recurrent)
    for group in (
        StoreLow(RECURRENT_WEIGHTS, recurrent),
        StoreLow(KEPT_FOR_TENSORS, kept_for_tensors, compared=True),
    ):
        if group.weights:
            plan.store_low_groups.append(group)
    return plan


#: How the report counts the weights stored low, by the group they were measured in.
RECURRENT_WEIGHTS = "recurrent weights"
KEPT_FOR_TENSORS = "weights of nodes kept fp32 for their tensors (small or out of range)"
#: A weight smaller than this is not worth a Cast (one node, about 100 bytes of the file).
STORE_LOW_MIN_BYTES = 512
#: ... and the group, at least this share of the model's fp32 weight bytes (else it is not measured).
STORE_LOW_MIN_SHARE = 1 / 100


def _weights_of_nodes_kept_for_tensors(
    model: ir.Model, plan: Plan, small_nodes: dict[ir.Node, str], exclude: Collection[str]
) -> dict[str, str]:
    """The weights of nodes kept fp32 for their tensors, not their weights: by the cost rule (tiny
    tensors) or because they write or read a tensor measured out of the low type's range. fp32
    keeps their arithmetic from rounding; their weights are rounded once, like every converted one.

    Nodes kept for a residual stream (its writers' accuracy) or by the caller keep their weights.
    """
    nodes = dict(small_nodes)
    for node in model.graph:
        for value in [*node.inputs, *node.outputs]:
            if value is not None and value.name in plan.unsafe:
                nodes.setdefault(node, f"{'writes' if value.producer() is node else 'reads'} '{value.name}'")
                break
    stream = {name for d in plan.streams for name in d.keep_fp32}
    computed = computed_from_constants(model.graph)
    found: dict[str, str] = {}
    size = 0
    for node, why in nodes.items():
        if any(v is not None and v.name in stream for v in [*node.inputs, *node.outputs]):
            continue
        for weight in sorted(weights_read(node, computed), key=lambda v: v.name):
            tensor = weight.const_value if weight.is_initializer() else ir.convenience.get_const_tensor(weight)
            if (
                tensor is None
                or tensor.dtype != ir.DataType.FLOAT
                or tensor.nbytes < STORE_LOW_MIN_BYTES
                or weight.name in exclude
                or weight.name in plan.keep_fp32
            ):
                continue
            if weight.name not in found:
                found[weight.name] = f"a weight of {node.op_type} '{node_label(node)}' ({why})"
                size += tensor.nbytes
    # Under 1 % of the weights they cannot change the file's size: not worth measuring (a run of the model).
    total = sum(c.tensor.nbytes for c in constant_tensors(model) if c.tensor.dtype == ir.DataType.FLOAT)
    return found if size >= STORE_LOW_MIN_SHARE * total else {}


def _recurrent_weights(model: ir.Model) -> dict[str, str]:
    """The weights of recurrent cells (kept fp32 by policy): they may be stored in the low type.

    The policy keeps an LSTM's arithmetic fp32 (its state compounds rounding step after step;
    onnxruntime's CPU LSTM is fp32 only), not its weights: rounded once, as every converted
    weight is, they halve the file. :func:`check_store_low` decides from the measured effect.
    """
    outer = constant_names(model)  # what a subgraph may read from the graphs around it
    computed: set[str] = set()
    for graph in model.graphs():  # a graph before its subgraphs
        computed |= computed_from_constants(graph, outer | computed)
    found: dict[str, str] = {}
    for graph in model.graphs():
        for node in graph:
            if node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx"):
                for weight in sorted(weights_read(node, computed), key=lambda v: v.name):
                    found.setdefault(weight.name, f"a weight of {node.op_type} '{node_label(node)}'")
    return found


def weights_converted_anyway(model: ir.Model, plan: Plan) -> set[str]:
    """The fp32 weights of :data:`STORE_LOW_MIN_BYTES` or more that the conversion rounds to the low type
    whatever is decided about storing others low: those that no node the plan keeps fp32 reads, not kept
    fp32 themselves, that the low type can hold (what a ``compared`` :class:`StoreLow` group is measured
    against)."""
    kept = set(plan.node_reasons)
    for node in model.graph:
        if any(v is not None and v.name in plan.keep_fp32 for v in [*node.inputs, *node.outputs]):
            kept.add(node)
    computed = computed_from_constants(model.graph)
    excluded = {w.name for node in kept for w in weights_read(node, computed)}
    excluded |= {name for group in plan.store_low_groups for name in group.weights} | set(plan.keep_fp32)
    found = set()
    for const in constant_tensors(model):
        name, tensor = const.value.name, const.tensor
        if tensor.dtype != ir.DataType.FLOAT or tensor.nbytes < STORE_LOW_MIN_BYTES or name in excluded:
            continue
        if unsafe_constant(tensor, plan.settings.limits) is None:
            found.add(name)
    return found


#: Rounding weights to the low type is accepted when it moves no output by more than this share of the
#: output's largest |value|: 0.3 of the relative error the gate allows at that format (64 unit roundoffs,
#: verify/gate.py DIRECTION_UNITS), the share int8 gives its error budget (settings/int8.py GATE_SHARE), the rest
#: left to what the variant converts anyway. The final gate judges the whole variant. At one unit roundoff
#: (storing the output itself low) a GRU tagger's and a diffusion U-Net's time-MLP weights stayed fp32 (1.02x and
#: 0.74x the source), though stored fp16 they pass the gate and an independent judge (0.55x, cosine >= 0.99999).
STORE_LOW_BUDGET = {ir.DataType.FLOAT16: 0.3 * 64 * 2.0**-11, ir.DataType.BFLOAT16: 0.3 * 64 * 2.0**-8}


#: Weights of nodes kept fp32 for their tensors are also stored low when rounding them moves the
#: outputs by at most this share of what rounding the weights converted anyway does: their rounding
#: then adds about 3 % to the weights' own (sqrt(1 + 1/16)).
STORE_LOW_SHARE = 0.25


def check_store_low(
    plan: Plan,
    group: StoreLow,
    reference: dict[str, np.ndarray],
    rounded: dict[str, np.ndarray],
    others: Callable[[], dict[str, np.ndarray]] | None = None,
) -> None:
    """Keep ``group``'s weights stored low only if rounding them moved the outputs little enough.

    ``reference``: the outputs measured on the calibration inputs; ``rounded``: the same with the
    group's weights rounded to the low type (and nothing else changed). ``others``: for a ``compared``
    group over the budget, the outputs with the weights converted anyway rounded instead (measured
    only when called).
    """
    low = low_name(plan.settings.dtype)
    budget = STORE_LOW_BUDGET[plan.settings.dtype]
    share, name, moved, scale = _moved(reference, rounded)
    count = f"{len(group.weights)} {group.what}"
    if share <= budget:
        plan.store_low_checked.append(
            f"{count} stored {low}, widened by a Cast at load "
            f"(rounding them moved no output by more than {budget:.2g} of its range)"
        )
        return
    compared = ""
    if group.compared and others is not None and np.isfinite(share):
        baseline = _moved(reference, others())[0]
        if np.isfinite(baseline) and share <= STORE_LOW_SHARE * baseline:
            plan.store_low_checked.append(
                f"{count} stored {low}, widened by a Cast at load (rounding them moved the outputs by "
                f"{share:.2g} of their range, under a quarter of the {baseline:.2g} that rounding the "
                f"weights converted anyway does)"
            )
            return
        compared = f"; rounding the weights converted anyway moves them by {baseline:.2g} of their range"
    group.refused = (
        f"rounding them to {low} moved output '{name}' by {moved:.3g} "
        f"(> {budget:.2g} x its largest |value| {scale:.3g}){compared}"
    )
    plan.store_low_checked.append(f"{count} kept fp32: {group.refused}")


def _moved(reference: dict[str, np.ndarray], rounded: dict[str, np.ndarray]) -> tuple[float, str, float, float]:
    """The output that moved most as a share of its largest |value|: (share, its name, how far, that
    largest |value|); share and how far are inf where it went non-finite."""
    worst = (0.0, "", 0.0, 0.0)
    for name, ref in reference.items():
        if name not in rounded or ref.dtype.kind != "f":
            continue
        ref64, got64 = ref.astype(np.float64), rounded[name].astype(np.float64)
        finite = np.isfinite(ref64)
        if not finite.any():
            continue
        scale = float(np.abs(ref64[finite]).max())
        if not np.isfinite(got64[finite]).all():
            return float("inf"), name, float("inf"), scale
        moved = float(np.abs(got64 - ref64)[finite].max())
        share = moved / scale if scale else (float("inf") if moved else 0.0)
        if share > worst[0]:
            worst = (share, name, moved, scale)
    return worst


def low_name(dtype: ir.DataType) -> str:
    return {ir.DataType.FLOAT16: "fp16", ir.DataType.BFLOAT16: "bf16"}.get(dtype, dtype.name.lower())


def _node_reason(node: ir.Node, settings: Settings, tail: set[ir.Node]) -> str | None:
    """Why ``node`` computes in fp32 by op (the policy, a fused graph's norms and tail), or None."""
    if settings.fused and node.op_type in FUSED_NORM_OPS and node.domain in ("", "ai.onnx", "com.microsoft"):
        return NORM_REASON
    if node in tail:
        return TAIL_REASON
    return policy_reason(node)


def _skip_stream_writers(model: ir.Model) -> set[ir.Node]:
    """The nodes writing a fused graph's residual stream: what SkipLayerNormalization adds to (its skip)."""
    writers = set()
    for node in model.graph:
        if node.domain == "com.microsoft" and node.op_type in FUSED_NORM_OPS:
            producer = node.inputs[1].producer()
            if producer is not None:
                writers.add(producer)
    return writers


def _per_sample_tail(model: ir.Model) -> set[ir.Node]:
    """Nodes from a Gather that picks one token row on (a CLS head): they see one vector per sample."""
    tail: set[ir.Node] = set()
    for node in model.graph:  # topological: a node's producers come first
        if _picks_a_row(node) or any(v is not None and v.producer() in tail for v in node.inputs):
            tail.add(node)
    return tail


def _picks_a_row(node: ir.Node) -> bool:
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.inputs[0].shape is None:
        return False
    rank = node.inputs[0].shape.rank()
    index = const_array(node.inputs[1])
    return rank >= 3 and index is not None and index.ndim == 0 and node.attributes.get_int("axis", 0) in (rank - 2, -2)
