"""Convert fp32 computation and weights to fp16 (or bf16), keeping fp32 where told to.

Which node computes in which precision is decided before anything changes
(:meth:`FloatPrecisionPass.plan`):

* Only what an operator's type rules allow changes (:mod:`onnxsmith.analysis.type_rules`):
  a type parameter bound to fp32 that may also be fp16 is converted, everything
  else keeps its type (Range's T cannot be fp16; Resize's ``scales`` is always
  fp32; SkipLayerNormalization's ``mean`` is always fp32). Integer and bool
  tensors are never touched.
* Shape computations stay as they are: a float value computed from tensor
  shapes and constants only (TorchScript's RoPE positions: Range over
  ``Cast(Shape(x))``) is arithmetic on sizes, not activations. So does float
  arithmetic on constants that ends in an integer (a Cast to int64, a
  comparison) or in an input its reader takes in fp32 only (Resize's
  ``scales``, Range): index arithmetic such as DINOv2's interpolated position
  grid, ``Cast<int64>(Floor(Pow(n, 0.5)))``, must give the same integers.
* ``keep_fp32`` names tensors that must stay fp32 (measured out of range, the
  residual stream): their producer and every node reading them through a
  converted input compute in fp32 — an island. ``policy`` adds nodes by op
  (reductions that accumulate).
* Pure data movement (Reshape, Transpose, Slice, Concat, ...) follows its input,
  so a value never passes through fp16 between two fp32 nodes.
* Control flow (If/Loop/Scan) keeps its interface: its inputs, outputs and
  subgraph inputs/outputs stay fp32; the nodes inside its subgraphs are
  converted like any others, with casts at the subgraph's borders.
* An op with unknown type rules (a custom domain) stays fp32.

Weights (initializers, Constant nodes, in subgraphs too) read only by converted
inputs are stored in the low type — converted lazily, from the memory map, when
the model is written; a weight also read in fp32 stays fp32 and is cast where
read in low precision, unless ``store_low`` names it (stored low, widened where
read in fp32). A Cast is inserted wherever a value's storage and its
reader's type differ, one per value and type, right after the value's producer.
The graph's inputs and outputs keep fp32 unless ``keep_io_types`` is False.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import onnx_ir as ir

from onnxsmith.analysis.precision_policy import MOVEMENT_OPS, Limits, policy_reason, unsafe_constant
from onnxsmith.analysis.type_rules import Signature, opset_of, signature
from onnxsmith.irutil.casts import cast_node, insert_after_producer
from onnxsmith.irutil.names import FreshNames, node_label
from onnxsmith.irutil.tensors import lazy_tensor
from onnxsmith.irutil.types import FLOAT_TYPES, infer_types
from onnxsmith.irutil.walk import captured, subgraphs_of

F32 = ir.DataType.FLOAT
LOW_TYPES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)

#: Ops whose output type comes from an attribute (Cast's ``to`` is handled; these stay as they are).
_ATTRIBUTE_TYPED = frozenset(
    {
        "ConstantOfShape",
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "EyeLike",
        "Bernoulli",
        "Multinomial",
    }
)

# Value categories, ordered: a node's outputs take the highest category among what it reads.
CONST, SHAPE, DATA = 0, 1, 2
#: Ops that read a window of their first input at positions their other inputs give.
_WINDOW_OPS = frozenset({"Slice", "Gather", "GatherElements", "GatherND"})


@dataclass
class NodeSlots:
    """The inputs and outputs of a node whose fp32 type would change with its precision."""

    inputs: set[int] = field(default_factory=set)
    outputs: set[int] = field(default_factory=set)
    free_inputs: set[int] = field(default_factory=set)  # accept any float storage (Cast, Shape)


@dataclass
class PrecisionResult(ir.passes.PassResult):
    """What :class:`FloatPrecisionPass` did (its result)."""

    dtype: ir.DataType = ir.DataType.FLOAT16
    low_nodes: Counter[str] = field(default_factory=Counter)  # op -> nodes computing in the low type
    float_nodes: Counter[str] = field(default_factory=Counter)  # op -> nodes that had fp32 to convert
    kept: dict[str, str] = field(default_factory=dict)  # node label -> why it stays fp32
    kept_nodes: list[ir.Node] = field(default_factory=list)
    #: node -> the keep_fp32 tensor that made it fp32 (None: the op policy or unknown type rules)
    kept_for: dict[ir.Node, str | None] = field(default_factory=dict)
    weights_converted: int = 0
    weight_bytes_saved: int = 0
    weights_kept: dict[str, str] = field(default_factory=dict)  # weight -> why it stays fp32 (read in both)
    #: every float weight left fp32: name -> (bytes, a node reading it in fp32 ("" if none), why)
    weights_fp32: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    #: weights stored low although read in fp32 (``store_low``): name -> bytes saved; a Cast widens them
    weights_cast_at_load: dict[str, int] = field(default_factory=dict)
    casts_added: int = 0
    shape_nodes: int = 0
    unknown_ops: list[str] = field(default_factory=list)  # "domain::Op" left fp32


def _graphs_parent_first(graph: ir.Graph) -> Iterator[ir.Graph]:
    yield graph
    for node in graph:
        for sub in subgraphs_of(node):
            yield from _graphs_parent_first(sub)


def _is_constant_node(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


class FloatPrecisionPass(ir.passes.InPlacePass):
    """Run fp32 computation in ``dtype`` except the islands; see the module docstring.

    ``keep_fp32`` maps tensor names to the reason they stay fp32. ``policy`` returns
    why a node must stay fp32 regardless (default: the accumulating reductions).
    ``store_low`` names weights to store in the low type even where they are read in
    fp32 (a recurrent cell's, or a node's kept fp32 for its arithmetic): a Cast widens
    them as the model loads — where no read of them is exact (shape or index arithmetic,
    an fp32-only input such as Resize's scales).
    Its result (:class:`PrecisionResult`) says what was done.
    """

    def __init__(
        self,
        dtype: ir.DataType = ir.DataType.FLOAT16,
        *,
        keep_fp32: Mapping[str, str] | None = None,
        policy: Callable[[ir.Node], str | None] = policy_reason,
        keep_io_types: bool = True,
        limits: Limits | None = None,
        infer: bool = True,
        store_low: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if dtype not in LOW_TYPES:
            raise ValueError(f"dtype must be FLOAT16 or BFLOAT16, not {dtype}")
        self.dtype = dtype
        self.keep_fp32 = dict(keep_fp32 or {})
        self.policy = policy
        self.keep_io_types = keep_io_types
        self.limits = limits or Limits.for_dtype(dtype)
        self.infer = infer  # False: the caller has just run type inference
        self.store_low = dict(store_low or {})

    # ---------------------------------------------------------------- planning

    def call(self, model: ir.Model) -> PrecisionResult:
        self._result = PrecisionResult(model, False, self.dtype)  # filled while the pass runs
        if self.infer:
            infer_types(model)
        self._model = model
        self._original = {}
        for graph in model.graphs():
            for value in [*graph.inputs, *graph.initializers.values()]:
                self._original[value] = value.dtype
            for node in graph:
                for out in node.outputs:
                    self._original[out] = out.dtype
        self._slots: dict[ir.Node, NodeSlots] = {}
        self._low: set[ir.Node] = set()
        self._category: dict[ir.Value, int] = {}
        self._weight_problem: dict[ir.Value, str | None] = {}
        self._names = FreshNames(taken=(v.name for v in self._original if v.name))
        self._plan()
        self._result.modified = self._apply()
        return self._result

    def _orig(self, value: ir.Value | None) -> ir.DataType | None:
        if value is None:
            return None
        return self._original.get(value, value.dtype)

    def _plan(self) -> None:
        for graph in self._model.graphs():
            for value in graph.inputs:
                self._category[value] = DATA
            for value in graph.initializers.values():
                self._category[value] = CONST
        # A graph is decided whole before its subgraphs: a subgraph reads only values
        # defined before its node, and its node's interface does not depend on it.
        order = [node for graph in _graphs_parent_first(self._model.graph) for node in graph]
        for node in order:
            self._categorize(node)
        self._exact = self._index_arithmetic(order)
        for node in order:
            self._decide(node)
        self._settle_weight_movement(order)

    def _index_arithmetic(self, order: list[ir.Node]) -> set[ir.Value]:
        """Float values computed from shapes and constants only that end up as integers, or where
        only fp32 is read (Resize's scales): they are computed exactly as the source computes them."""
        exact: set[ir.Value] = set()
        pending: list[ir.Value] = []

        def mark(value: ir.Value | None) -> None:
            if value is None or value in exact or self._orig(value) != F32:
                return
            if self._category.get(value, DATA) == DATA:
                return  # activations: their precision is a question of measured ranges
            exact.add(value)
            pending.append(value)

        for node in order:
            if _is_constant_node(node) or subgraphs_of(node) or node.op_type in ("Shape", "Size"):
                continue  # Shape and Size read dims, not values
            if not any(self._orig(out) in FLOAT_TYPES for out in node.outputs if out.name or out.uses()):
                for value in node.inputs:  # floats in, no float out: a Cast to int64, a comparison
                    mark(value)
                continue
            sig = self._signature(node)
            if sig is None:
                continue
            slots = self._slots_of(node, sig)
            for i, value in enumerate(node.inputs):
                if i not in slots.inputs and i not in slots.free_inputs:
                    mark(value)  # read in fp32 only
        while pending:
            producer = pending.pop().producer()
            if producer is not None and not _is_constant_node(producer) and not subgraphs_of(producer):
                for value in producer.inputs:
                    mark(value)
        return exact

    def _settle_weight_movement(self, order: list[ir.Node]) -> None:
        """Data movement on weights (an LSTM's weights sliced and concatenated) is the weight's
        storage: it stays fp32 when something reads it in fp32, like the weight itself would."""
        for node in reversed(order):
            if node not in self._low or node.op_type not in MOVEMENT_OPS:
                continue
            if node.outputs and self._category.get(node.outputs[0]) != CONST:
                continue
            outputs = [node.outputs[j] for j in self._slots[node].outputs]
            if any(
                self._required(user, i, out) != self.dtype
                for out in outputs
                for user, i in out.uses()
                if self._required(user, i, out) is not None
            ) or any(out.is_graph_output() for out in outputs):
                self._low.discard(node)
                self._result.low_nodes[node.op_type] -= 1
                if not self._result.low_nodes[node.op_type]:
                    del self._result.low_nodes[node.op_type]

    def _categorize(self, node: ir.Node) -> None:
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
            category = SHAPE
        else:
            reads = [v for v in node.inputs if v is not None]
            for sub in subgraphs_of(node):
                reads.extend(captured(sub))
            category = max((self._category.get(v, DATA) for v in reads), default=CONST)
            if subgraphs_of(node) and node.op_type != "If":
                category = DATA  # Loop/Scan iterate: treat what they make as data
            elif self._window_of_weight(node):
                # A float weight read at positions known at run time (a position table Sliced to the sequence
                # length) is that weight's data, not arithmetic on sizes, whatever the positions come from.
                category = CONST if category == CONST else DATA
        for out in node.outputs:
            self._category[out] = category
        for sub in subgraphs_of(node):
            for value in sub.inputs:
                self._category[value] = DATA if node.op_type != "If" else category

    def _window_of_weight(self, node: ir.Node) -> bool:
        """Whether ``node`` reads a window of a float weight (Slice, Gather, ... of a constant fp32 tensor)."""
        return (
            node.op_type in _WINDOW_OPS
            and node.domain in ("", "ai.onnx")
            and bool(node.inputs)
            and node.inputs[0] is not None
            and self._category.get(node.inputs[0]) == CONST
            and self._orig(node.inputs[0]) == F32
        )

    def _signature(self, node: ir.Node) -> Signature | None:
        return signature(node, opset_of(self._model, node))

    def _slots_of(self, node: ir.Node, sig: Signature) -> NodeSlots:
        low = self.dtype
        params: dict[str, list[tuple[str, int, ir.Value]]] = {}
        for i, value in enumerate(node.inputs):
            param = sig.input_param(i)
            if value is not None and param in sig.allowed:
                params.setdefault(param, []).append(("in", i, value))
        for j, value in enumerate(node.outputs):
            param = sig.output_param(j)
            if param in sig.allowed and (value.name or value.uses() or value.is_graph_output()):
                params.setdefault(param, []).append(("out", j, value))
        slots = NodeSlots()
        for param, members in params.items():
            bound = {self._orig(v) for _, _, v in members}
            if bound != {F32} or not sig.allows(param, low):
                continue
            if len(members) == 1 and members[0][0] == "in":
                slots.free_inputs.add(members[0][1])  # its own type: reads fp16 as well as fp32
                continue
            for kind, index, _ in members:
                (slots.inputs if kind == "in" else slots.outputs).add(index)
        if node.op_type == "Cast":
            slots.outputs = {0} if self._orig(node.outputs[0]) == F32 else set()
        return slots

    def _decide(self, node: ir.Node) -> None:
        result = self._result
        if _is_constant_node(node):
            return  # a weight: decided from its readers in _apply
        if subgraphs_of(node):
            self._slots[node] = NodeSlots(free_inputs=set())
            return  # control flow keeps its interface; its subgraphs are converted on their own
        sig = self._signature(node)
        if sig is None:
            if node.domain not in ("", "ai.onnx", "ai.onnx.ml") and any(
                self._orig(v) == F32 for v in [*node.inputs, *node.outputs] if v is not None
            ):
                result.unknown_ops.append(f"{node.domain}::{node.op_type}")
                self._keep(node, f"{node.domain}::{node.op_type} has unknown type rules")
            self._slots[node] = NodeSlots()
            return
        slots = self._slots_of(node, sig) if node.op_type not in _ATTRIBUTE_TYPED else NodeSlots()
        self._slots[node] = slots
        if not slots.inputs and not slots.outputs:
            return
        result.float_nodes[node.op_type] += 1
        if node.outputs and self._category.get(node.outputs[0]) == SHAPE:
            result.shape_nodes += 1  # arithmetic on sizes, not activations
            return
        if any(node.outputs[j] in self._exact for j in slots.outputs):
            result.shape_nodes += 1  # index arithmetic on constants
            return
        reason = self.policy(node)
        if reason is not None:
            self._keep(node, reason)
            return
        found = self._range_reason(node, slots)
        if found is not None:
            self._keep(node, *found)
            return
        if node.op_type in MOVEMENT_OPS and not any(self._stored_low(node.inputs[i]) for i in slots.inputs):
            return  # follows its fp32 input
        self._low.add(node)
        result.low_nodes[node.op_type] += 1

    def _keep(self, node: ir.Node, reason: str, tensor: str | None = None) -> None:
        self._result.kept[node_label(node)] = reason
        self._result.kept_nodes.append(node)
        self._result.kept_for[node] = tensor

    def _range_reason(self, node: ir.Node, slots: NodeSlots) -> tuple[str, str | None] | None:
        """(why, the tensor) when ``node`` writes or reads a tensor that must stay fp32."""
        for j in sorted(slots.outputs):
            out = node.outputs[j]
            if out.name is not None and out.name in self.keep_fp32:
                return f"writes '{out.name}': {self.keep_fp32[out.name]}", out.name
        for i in sorted(slots.inputs):
            value = node.inputs[i]
            assert value is not None  # _slots_of: an input slot holds a value
            if value.name is not None and value.name in self.keep_fp32:
                return f"reads '{value.name}': {self.keep_fp32[value.name]}", value.name
            problem = self._constant_problem(value)
            if problem is not None:
                return f"reads constant '{value.name}', which {problem}", value.name
        return None

    def _constant_problem(self, value: ir.Value) -> str | None:
        if value in self._weight_problem:
            return self._weight_problem[value]
        tensor = _weight_tensor(value)
        problem = None
        if tensor is not None and self._orig(value) == F32:
            problem = unsafe_constant(tensor, self.limits)
        self._weight_problem[value] = problem
        return problem

    def _stored_low(self, value: ir.Value | None) -> bool:
        """Whether ``value`` will be held in the low type (decided nodes and weights only)."""
        if value is None or self._orig(value) != F32:
            return False
        producer = value.producer()
        if producer is not None and not _is_constant_node(producer):
            return producer in self._low and value.index() in self._slots[producer].outputs
        if _weight_tensor(value) is not None:
            return self._constant_problem(value) is None and value.name not in self.keep_fp32
        return value.is_graph_input() and value.graph is self._model.graph and not self.keep_io_types

    # ---------------------------------------------------------------- rewriting

    def _required(self, user: ir.Node, index: int, value: ir.Value) -> ir.DataType | None:
        """The type ``user`` needs at input ``index`` (None: any float storage will do)."""
        slots = self._slots.get(user)
        if slots is not None and index in slots.free_inputs:
            return None
        if user in self._low and slots is not None and index in slots.inputs:
            return self.dtype
        return self._orig(value)

    def _apply(self) -> bool:
        low = self.dtype
        for node in self._low:
            for j in self._slots[node].outputs:
                node.outputs[j].dtype = low
            if node.op_type == "Cast":
                node.attributes["to"] = ir.AttrInt64("to", int(low))
        self._convert_weights()
        main = self._model.graph
        if not self.keep_io_types:
            for value in main.inputs:
                if value.dtype == F32 and not value.is_initializer():
                    value.dtype = low
        self._insert_casts()
        for graph in self._model.graphs():
            for i, value in enumerate(list(graph.outputs)):
                want = self._orig(value)
                if graph is main and not self.keep_io_types and want == F32:
                    want = low
                if value.dtype in (F32, low) and want in (F32, low) and value.dtype != want:
                    self._cast_output(graph, i, value, want)
        return bool(self._low or self._result.weights_converted or self._result.casts_added)

    def _convert_weights(self) -> None:
        low = self.dtype
        for graph in self._model.graphs():
            candidates = [v for v in graph.initializers.values() if not v.is_graph_input()]
            candidates += [n.outputs[0] for n in graph if _is_constant_node(n)]
            for value in candidates:
                if self._orig(value) != F32:
                    continue
                tensor = _weight_tensor(value)
                if tensor is None:
                    continue
                assert value.name is not None  # an initializer, or a value of a graph: named
                needs = {self._required(user, i, value) for user, i in value.uses()} - {None}
                if value.is_graph_output():
                    needs.add(F32)
                if not needs:
                    continue  # read for its shape only, or not at all
                safe = self._constant_problem(value) is None and value.name not in self.keep_fp32
                if needs == {low}:
                    if safe:  # else its readers were kept fp32, and needs would not be {low}
                        self._store_low(value)
                    continue
                if (
                    safe
                    and value.name in self.store_low
                    and not value.is_graph_output()
                    and self._widened_only_for_kept_nodes(value)
                ):
                    saved = self._store_low(value)
                    self._result.weights_cast_at_load[value.name] = saved
                    continue
                if low in needs:
                    self._result.weights_kept[value.name] = "also read in fp32"
                if safe:
                    reader, why = self._why_fp32(value)
                else:
                    reader, why = "", self._constant_problem(value) or self.keep_fp32[value.name]
                self._result.weights_fp32[value.name] = (tensor.nbytes, reader, why)

    def _store_low(self, value: ir.Value) -> int:
        low = self.dtype
        tensor = _weight_tensor(value)
        assert tensor is not None  # a weight (_convert_weights)
        producer = value.producer()
        converted = lazy_tensor(tensor, lambda a: a.astype(low.numpy()), dtype=low, name=value.name)
        if producer is not None:  # a Constant node: rewrite its attribute
            for key in list(producer.attributes):
                del producer.attributes[key]
            producer.attributes["value"] = ir.AttrTensor("value", ir.tensor(converted.numpy(), name=tensor.name))
        else:
            value.const_value = converted
        value.dtype = low
        self._result.weights_converted += 1
        self._result.weight_bytes_saved += tensor.nbytes - converted.nbytes
        return tensor.nbytes - converted.nbytes

    def _why_fp32(self, value: ir.Value) -> tuple[str, str]:
        """(node, why) for a weight read in fp32: the first fp32 node that reads it and its reason
        (through data movement and arithmetic on weights, which follow their readers)."""
        for label, why, _ in self._fp32_reads(value):
            return label, why
        return "", "a graph output" if value.is_graph_output() else "read in fp32"

    def _widened_only_for_kept_nodes(self, value: ir.Value) -> bool:
        """Whether weight ``value`` may be stored low and widened by a Cast where it is read in fp32: no
        read of it is exact (shape or index arithmetic, an input that takes fp32 only such as Resize's
        scales), so its fp32 readers compute from it rounded once, as from any converted weight."""
        return all(widenable for _, _, widenable in self._fp32_reads(value))

    def _fp32_reads(self, value: ir.Value) -> Iterator[tuple[str, str, bool]]:
        """(node, why, widenable) for each node reading weight ``value`` in fp32, through data movement
        and arithmetic on weights (which follow their readers); ``widenable``: what it reads is not
        computed exactly (sizes, indices, an fp32-only input)."""
        pending, seen = [value], set()
        while pending:
            current = pending.pop(0)
            for user, index in current.uses():
                if user in seen or self._required(user, index, current) != F32:
                    continue
                seen.add(user)
                label = node_label(user)
                if label in self._result.kept:
                    yield label, self._result.kept[label], current not in self._exact
                    continue
                category = self._category.get(user.outputs[0]) if user.outputs else None
                if category == SHAPE or any(out in self._exact for out in user.outputs):
                    yield label, "shape or index arithmetic", False
                elif category == CONST or (user.op_type in MOVEMENT_OPS and user.domain in ("", "ai.onnx")):
                    pending.extend(out for out in user.outputs if self._orig(out) == F32)
                else:
                    yield label, f"{user.op_type} reads it in fp32 (type rules)", current not in self._exact

    def _insert_casts(self) -> None:
        pending: dict[tuple[ir.Value, ir.DataType], list[tuple[ir.Node, int]]] = {}
        for graph in self._model.graphs():
            values = [*graph.inputs, *graph.initializers.values()]
            values += [out for node in graph for out in node.outputs]
            for value in values:
                if self._orig(value) != F32:
                    continue
                for user, index in value.uses():
                    want = self._required(user, index, value)
                    if want is not None and want != value.dtype:
                        pending.setdefault((value, want), []).append((user, index))
        front: dict[ir.Graph, list[ir.Node]] = {}
        for (value, want), uses in pending.items():
            cast = self._new_cast(value, want)
            producer = value.producer()
            if producer is not None:
                assert producer.graph is not None  # a node of the model is in a graph
                insert_after_producer(producer.graph, value, cast)
            else:  # first in the graph, all together in the order they were made
                assert value.graph is not None  # an input or initializer of a graph
                front.setdefault(value.graph, []).append(cast)
            for user, index in uses:
                user.replace_input_with(index, cast.outputs[0])
        for graph, casts in front.items():
            if len(graph):
                graph.insert_before(next(iter(graph)), casts)
            else:
                graph.extend(casts)

    def _new_cast(self, value: ir.Value, to: ir.DataType) -> ir.Node:
        name = self._names(f"{value.name}/{_suffix(to)}")
        cast = cast_node(value, to, name=name, node_name=f"{name}/cast")
        self._result.casts_added += 1
        return cast

    def _cast_output(self, graph: ir.Graph, index: int, value: ir.Value, want: ir.DataType) -> None:
        """Cast a graph output to ``want`` keeping its name (the interface)."""
        name = value.name
        value.name = self._names(f"{name}/{_suffix(value.dtype)}")
        cast = self._new_cast(value, want)
        cast.outputs[0].name = name
        producer = value.producer()
        target = graph if producer is None else producer.graph
        assert target is not None  # a node of the model is in a graph
        insert_after_producer(target, value, cast)
        graph.outputs[index] = cast.outputs[0]


def _suffix(dtype: ir.DataType | None) -> str:
    # "as_": storage-faithful emulation names its own values "<name>/fp32"
    names: dict[ir.DataType | None, str] = {ir.DataType.FLOAT16: "fp16", ir.DataType.BFLOAT16: "bf16"}
    return "as_" + names.get(dtype, "fp32")


def _weight_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The tensor of an initializer or a Constant node's output, else None."""
    if value is None:
        return None
    if value.const_value is not None and value.is_initializer():
        return value.const_value
    producer = value.producer()
    if producer is not None and _is_constant_node(producer):
        return ir.convenience.get_const_tensor(value)
    return None
