"""Carry a pre-LN transformer's residual stream scaled by a power of two S.

In a pre-LN transformer the residual stream is a chain of Adds,
``s[i+1] = s[i] + branch[i]``, and every stream value is read by a normalisation
(LayerNormalization, or RMSNorm as SimplifiedLayerNormalization) — the next
block's or the final one. Normalisation is scale-invariant up to its epsilon::

    LN(S*x; eps*S**2) = LN(x; eps)

so the whole stream can be carried as ``S*s`` if everything that writes into it
is scaled by S (the embedding that starts it, every branch that is added to it)
and every norm reading it gets ``eps*S**2``. S is folded into the writers'
weights: the deepest linear op of each writer (an output projection's weight
and bias, a patch-embedding Conv, CLS/register/position tokens), passing through
layer-scale Muls, bias Adds and pure data movement. With S a power of two the
rewrite is exact in fp32 (barring subnormals); it is verified numerically by the
tests. Massive activations (DINOv3's ~1.5e5 channel) then fit fp16 — in the
stream and in the projections that write them.

The stream must be read only by norms (directly, or through Gather/Slice/
Reshape-like ops that lead only to norms); otherwise the rescaling would leak,
and the stream is reported as not rescalable with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames, node_label
from onnxsmith.irutil.tensors import lazy_tensor
from onnxsmith.irutil.walk import const_tensor

#: Normalisations that are scale-invariant with eps scaled by S**2.
NORM_OPS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization"})
#: Ops that move data without changing it: scaling their input scales their output.
_THROUGH = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Tile", "Slice", "Gather"}
)
_DEFAULT_EPS = 1e-5


class NotScalable(Exception):
    """Why a stream cannot be rescaled exactly."""


@dataclass
class _Action:
    """Multiply one input of a node (a constant) by the scale, or a Gemm's alpha/beta."""

    node: ir.Node
    index: int | None  # input index of the constant; None: Gemm alpha and beta


@dataclass
class ResidualStream:
    """One residual stream of the main graph."""

    values: list[ir.Value]  # s[0], s[1], ...
    adds: list[ir.Node]  # the Adds making s[1:]
    norms: list[ir.Node]  # the norms reading it
    via: list[ir.Value] = field(default_factory=list)  # values between the stream and its norms
    #: Every value whose contents scaling multiplies by S (stream, writers' paths, ``via``).
    scaled: list[ir.Value] = field(default_factory=list)
    problem: str | None = None  # why it cannot be rescaled (None: it can)
    _actions: list[_Action] = field(default_factory=list)

    @property
    def names(self) -> list[str | None]:
        return [v.name for v in self.values]

    def describe(self) -> str:
        return (
            f"{len(self.adds)} Adds from '{self.values[0].name}' to '{self.values[-1].name}', {len(self.norms)} norms"
        )

    def writers(self) -> list[ir.Value]:
        """What is written into the stream: its first value, then each Add's branch."""
        writers = [self.values[0]]
        for add, value in zip(self.adds, self.values):
            branch = add.inputs[1] if add.inputs[0] is value else add.inputs[0]
            assert branch is not None  # an Add reads two values (a reader of writers reads their names)
            writers.append(branch)
        return writers

    def writer_nodes(self, value: ir.Value) -> list[ir.Node]:
        """The nodes that compute ``value`` (a writer) and nothing else: every node all of whose
        readers are among them, back from the writer (never a stream value; a RoPE table that
        every block reads stays out). For a block's MLP: its norm, up-projection, GELU, down-projection."""
        producer = value.producer()
        if producer is None or (value in self.values[:1] and producer.op_type == "Constant"):
            return []
        stream = set(self.values)
        region = {producer}
        assert producer.graph is not None  # it computes a value of the graph
        nodes = list(producer.graph)
        for node in reversed(nodes[: nodes.index(producer)]):  # readers before producers
            if node.op_type == "Constant" or any(out in stream for out in node.outputs):
                continue
            readers = [user for out in node.outputs for user, _ in out.uses()]
            if readers and all(user in region for user in readers):
                region.add(node)
        return [node for node in nodes if node in region]


def is_norm(node: ir.Node) -> bool:
    return node.op_type in NORM_OPS and node.domain in ("", "ai.onnx", "com.microsoft")


def _value_uses(value: ir.Value) -> list[tuple[ir.Node, int]]:
    """Uses that see the values (Shape and Size read only the dims, which scaling keeps)."""
    return [(user, i) for user, i in value.uses() if user.op_type not in ("Shape", "Size")]


def _is_add(node: ir.Node) -> bool:
    return node.op_type == "Add" and node.domain in ("", "ai.onnx")


def _is_const(value: ir.Value) -> bool:
    if value.const_value is not None and value.is_initializer():
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and not producer.inputs


def _norm_source(norm: ir.Node) -> tuple[ir.Value, list[ir.Value]]:
    """The value a norm normalises, looking back through pure data movement, and the values passed."""
    value = norm.inputs[0]
    via: list[ir.Value] = []
    while True:
        assert value is not None  # a norm and the data movement before it read their first input
        producer = value.producer()
        if producer is None or producer.op_type not in _THROUGH or len(_value_uses(value)) != 1:
            return value, via
        via.append(value)
        value = producer.inputs[0]


def find_residual_streams(model: ir.Model) -> list[ResidualStream]:
    """Pre-LN residual streams of the main graph (at least two Adds each), with their rescaling plan."""
    graph = model.graph
    normed: dict[ir.Value, list[tuple[ir.Node, list[ir.Value]]]] = {}
    for node in graph:
        if is_norm(node):
            source, via = _norm_source(node)
            normed.setdefault(source, []).append((node, via))

    def link(value: ir.Value) -> ir.Node | None:
        """The Add continuing the stream from ``value``: its result is normalised too."""
        adds = [user for user, _ in value.uses() if _is_add(user) and user.outputs[0] in normed]
        return adds[0] if len(adds) == 1 else None

    in_chain: set[ir.Value] = set()
    streams = []
    for start in normed:  # graph order of the norms
        if start in in_chain:
            continue
        values, adds = [start], []
        while (add := link(values[-1])) is not None and add.outputs[0] not in in_chain:
            adds.append(add)
            values.append(add.outputs[0])
        if len(adds) < 2:
            continue
        in_chain.update(values)
        norms, via = [], []
        for value in values:
            for norm, passed in normed[value]:
                norms.append(norm)
                via.extend(passed)
        stream = ResidualStream(values=values, adds=adds, norms=norms, via=via)
        _plan(stream)
        streams.append(stream)
    return streams


def _plan(stream: ResidualStream) -> None:
    """Check the stream is read only by its Adds and norms; find what to scale in each writer."""
    norm_inputs = {n.inputs[0] for n in stream.norms}
    readers_ok = set(stream.adds) | set(stream.norms)
    via_ok = set(stream.via)
    try:
        for value in [*stream.values, *stream.via]:
            if value.is_graph_output():
                raise NotScalable(f"'{value.name}' is a graph output")
            for user, _ in _value_uses(value):
                passes = user.op_type in _THROUGH and user.outputs[0] in via_ok | norm_inputs
                if user not in readers_ok and not passes:
                    raise NotScalable(
                        f"'{value.name}' is read by {user.op_type} '{node_label(user)}', not only by norms"
                    )
        actions: list[_Action] = []
        scaled: list[ir.Value] = [*stream.values[1:], *stream.via]
        first = stream.values[0]
        if _is_const(first):
            raise NotScalable(f"the stream starts at constant '{first.name}'")
        _plan_value(first, actions, scaled)
        for add, value in zip(stream.adds, stream.values):
            branch = 1 if add.inputs[0] is value else 0
            _plan_input(add, branch, actions, scaled)
    except NotScalable as why:
        stream.problem = str(why)
        return
    stream._actions = actions
    stream.scaled = scaled


def _plan_input(node: ir.Node, index: int, actions: list[_Action], scaled: list[ir.Value]) -> None:
    value = node.inputs[index]
    if value is None:
        raise NotScalable(f"{node.op_type} '{node_label(node)}' has an empty input")
    if _is_const(value):
        actions.append(_Action(node, index))
        return
    if len(_value_uses(value)) != 1:
        raise NotScalable(f"'{value.name}' is written into the stream and also read elsewhere")
    _plan_value(value, actions, scaled)


def _plan_value(value: ir.Value, actions: list[_Action], scaled: list[ir.Value]) -> None:
    """Plan scaling ``value`` (read only inside the scaled region) at its deepest linear op."""
    node = value.producer()
    if node is None:
        raise NotScalable(f"'{value.name}' is a graph input")
    scaled.append(value)
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    consts = [i for i, v in enumerate(node.inputs) if v is not None and _is_const(v)]
    if op in ("Add", "Sub"):
        for i in (0, 1):
            _plan_input(node, i, actions, scaled)
    elif op in ("Mul", "Div"):
        # x * c (a layer scale) or x / c: scale x deeper if possible, else the constant (not a divisor).
        data = [i for i in (0, 1) if i not in consts]
        if len(data) == 1:
            trial_actions: list[_Action] = []
            trial_scaled: list[ir.Value] = []
            try:
                _plan_input(node, data[0], trial_actions, trial_scaled)
            except NotScalable:
                if op == "Div":
                    raise
                actions.append(_Action(node, consts[0]))
            else:
                actions.extend(trial_actions)
                scaled.extend(trial_scaled)
        elif data and op == "Mul":
            _plan_input(node, data[0], actions, scaled)
        elif consts and op == "Mul":
            actions.append(_Action(node, consts[0]))
        else:
            raise NotScalable(f"Div '{node_label(node)}' writes into the stream")
    elif op == "MatMul":
        if not consts:
            raise NotScalable(f"MatMul '{node_label(node)}' writing into the stream has no constant weight")
        actions.append(_Action(node, consts[-1]))
    elif op == "Gemm":
        actions.append(_Action(node, None))
    elif op == "Conv":
        if 1 not in consts or (len(node.inputs) > 2 and node.inputs[2] is not None and 2 not in consts):
            raise NotScalable(f"Conv '{node_label(node)}' writing into the stream has no constant weight")
        actions.extend(_Action(node, i) for i in (1, 2) if i < len(node.inputs) and node.inputs[i] is not None)
    elif op in _THROUGH:
        _plan_input(node, 0, actions, scaled)
    elif op in ("Concat", "Where"):
        for i in range(len(node.inputs)) if op == "Concat" else (1, 2):
            _plan_input(node, i, actions, scaled)
    else:
        raise NotScalable(f"{op} '{node_label(node)}' writes into the stream")


def choose_scale(peak: float, limit: float) -> float:
    """The power of two S <= 1 that brings ``peak`` to at most ``limit``."""
    if not math.isfinite(peak) or peak <= limit or limit <= 0:
        return 1.0
    return 2.0 ** -math.ceil(math.log2(peak / limit))


@dataclass
class RescaleResult:
    scale: float
    constants: int = 0  # constant tensors multiplied by S
    gemms: int = 0  # Gemms whose alpha/beta were multiplied by S
    norms: int = 0  # norms whose epsilon was multiplied by S**2
    scaled_names: list[str | None] = field(default_factory=list)


def rescale_residual(model: ir.Model, stream: ResidualStream, scale: float) -> RescaleResult:
    """Carry ``stream`` (from :func:`find_residual_streams` on this model) scaled by ``scale``."""
    if stream.problem is not None:
        raise ValueError(f"the stream cannot be rescaled: {stream.problem}")
    exponent = math.log2(scale)
    if scale <= 0 or exponent != round(exponent):
        raise ValueError(f"the scale must be a power of two, not {scale}")
    result = RescaleResult(scale, scaled_names=[v.name for v in stream.scaled])
    names = FreshNames(
        taken={v.name for g in model.graphs() for n in g for v in n.outputs if v.name is not None}
        | set(model.graph.initializers)
    )
    for action in stream._actions:
        node = action.node
        if action.index is None:
            for name in ("alpha", "beta"):
                node.attributes[name] = ir.AttrFloat32(name, node.attributes.get_float(name, 1.0) * scale)
            result.gemms += 1
            continue
        _scale_constant_input(model, node, action.index, scale, names)
        result.constants += 1
    for norm in stream.norms:
        eps = norm.attributes.get_float("epsilon", _DEFAULT_EPS)
        norm.attributes["epsilon"] = ir.AttrFloat32("epsilon", eps * scale * scale)
        result.norms += 1
    return result


def _scale_constant_input(model: ir.Model, node: ir.Node, index: int, scale: float, names: FreshNames) -> None:
    value = node.inputs[index]
    assert value is not None  # the plan scales constant inputs only (_plan_input, _plan_value)
    tensor = const_tensor(value)
    scaled = lazy_tensor(tensor, lambda a: a * np.asarray(scale, dtype=a.dtype), dtype=tensor.dtype, name=value.name)
    if len(value.uses()) == 1 and value.is_initializer():
        value.const_value = scaled
        return
    producer = value.producer()
    if len(value.uses()) == 1 and producer is not None:  # a Constant node read only here
        for key in list(producer.attributes):
            del producer.attributes[key]
        producer.attributes["value"] = ir.AttrTensor("value", ir.tensor(scaled.numpy(), name=value.name))
        return
    # Shared with readers outside the stream: a scaled copy for this reader.
    name = names(f"{value.name}/rescaled")
    shape = ir.Shape(tensor.shape)  # type: ignore[arg-type]  # an ir.Shape: onnx-ir types it as its protocol
    copy = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=shape, const_value=scaled)
    model.graph.register_initializer(copy)
    node.replace_input_with(index, copy)


@dataclass
class ResidualRescalePassResult(ir.passes.PassResult):
    """The streams found, and what rescaling did to each rescalable one."""

    streams: list[ResidualStream] = field(default_factory=list)
    results: list[RescaleResult] = field(default_factory=list)


class ResidualRescalePass(ir.passes.InPlacePass):
    """Rescale every rescalable residual stream of the model by ``scale`` (see the module docstring)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def call(self, model: ir.Model) -> ResidualRescalePassResult:
        streams = find_residual_streams(model)
        results = [rescale_residual(model, s, self.scale) for s in streams if s.problem is None]
        return ResidualRescalePassResult(model, bool(results) and self.scale != 1.0, streams, results)
