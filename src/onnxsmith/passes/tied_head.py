"""Find a language model's head and token embedding, and store them once, quantized.

**Finding them.** The head is the MatMul that computes the logits output (through
an Add of a bias or a Reshape): ``MatMul(hidden, W)`` with W a constant [hidden,
vocab], or ``Transpose(E)`` of a constant E [vocab, hidden] (optimum's tied GPT-2).
The embedding lookups are Gathers (axis 0) of a constant [vocab, hidden] table. The
head is **tied** when it reads that table: through the Transpose, or as a constant
equal to its transpose (the TorchScript exporter folds ``E.T`` into a second copy).

**Storing them.** A tied table is stored once, int8 with one scale per token
(symmetric; or 4-bit blocks along hidden for the ``q4`` ablation), behind one
DequantizeLinear, in one of two layouts (``lookups``):

* ``columns``: the head's [hidden, vocab] layout. The head reads it directly; each
  lookup gathers columns (``Gather(axis=1)``) and transposes them back to [.., hidden].
  After onnxruntime folds the DequantizeLinear at load, it holds one fp32 table, not
  the table and a transposed copy. Gathering columns is slow, though (one strided
  element at a time; docs/quantize.md has the cost in onnxruntime-web).
* ``rows``: the table's own [vocab, hidden] layout (int8 ``q4`` heads are always
  ``columns``). The lookups gather rows, as in the source; the head reads a Transpose
  of it, which onnxruntime folds at load into a second fp32 copy. For a model without
  a KV cache, which looks up the whole sequence at every step, that is the faster trade.

A head already on symmetric 8-bit grids in blocks along hidden (a GGUF Q8_0 table) is stored in
those blocks instead, which restore it exactly (opset 21's blocked DequantizeLinear; ``columns``).

An untied head and table are each stored int8 per token (the head per column, the
table per row) under their own names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.core.errors import InputError
from onnxsmith.irutil.names import FreshNames, node_label
from onnxsmith.irutil.types import infer_types, set_dtype
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes import quantization as qz
from onnxsmith.settings.quantize import HEAD_MODES, LOOKUPS


@dataclass
class LMHead:
    """Where a model's logits come from."""

    logits: ir.Value  # the graph output
    matmul: ir.Node  # hidden @ weight
    weight: ir.Value  # the MatMul's B: [hidden, vocab]
    weight_array: np.ndarray  # its value
    table: ir.Value | None = None  # the embedding table [vocab, hidden], if lookups were found
    lookups: list[ir.Node] = field(default_factory=list)  # Gather(table, ids)
    tied: bool = False
    how: str = ""  # how the head reads its weight, for the report

    @property
    def tied_table(self) -> ir.Value:
        """The table of a tied head (:func:`find_lm_head` sets it with ``tied``)."""
        assert self.tied and self.table is not None
        return self.table

    @property
    def hidden(self) -> int:
        return int(self.weight_array.shape[0])

    @property
    def vocab(self) -> int:
        return int(self.weight_array.shape[1])


def logits_output(model: ir.Model) -> ir.Value:
    """The output named ``logits``, else the first output."""
    outputs = list(model.graph.outputs)
    if not outputs:
        raise InputError("the model has no outputs")
    return next((o for o in outputs if o.name == "logits"), outputs[0])


def find_lm_head(model: ir.Model) -> LMHead:
    """The head computing the logits and the embedding it may share; InputError naming what is missing."""
    logits = logits_output(model)
    value: ir.Value | None = logits
    matmul = None
    for _ in range(8):  # walk back through a bias Add, Reshape, Identity
        assert value is not None  # an Add's computed operand, a Reshape's data: read as before
        producer = value.producer()
        if producer is None:
            break
        if producer.op_type == "MatMul":
            matmul = producer
            break
        if producer.op_type == "Add":
            constant = [v for v in producer.inputs if const_array(v) is not None]
            computed = [v for v in producer.inputs if const_array(v) is None]
            if len(constant) == 1 and len(computed) == 1:
                value = computed[0]
                continue
        if producer.op_type in ("Reshape", "Identity"):
            value = producer.inputs[0]
            continue
        break
    if matmul is None:
        origin = logits.producer()
        raise InputError(
            f"cannot find the LM head: output '{logits.name}' is not computed by a MatMul "
            f"(it comes from {origin.op_type if origin else 'nowhere'}{' ' + node_label(origin) if origin else ''})"
        )
    b = matmul.inputs[1]
    assert b is not None  # a MatMul reads two operands
    array = const_array(b)
    how = f"MatMul '{node_label(matmul)}' reads constant '{b.name}'"
    transposed_from: ir.Value | None = None
    transpose = b.producer()
    if array is None and transpose is not None and transpose.op_type == "Transpose":
        source = transpose.inputs[0]
        perm = transpose.attributes.get_ints("perm", [1, 0])
        source_array = const_array(source)
        if source is not None and source_array is not None and source_array.ndim == 2 and list(perm) == [1, 0]:
            array = source_array.T
            transposed_from = source
            how = f"MatMul '{node_label(matmul)}' reads Transpose('{source.name}')"
    if array is None or array.ndim != 2:
        raise InputError(
            f"cannot find the LM head: MatMul '{node_label(matmul)}' computing '{logits.name}' does not read "
            "a constant [hidden, vocab] weight"
        )
    head = LMHead(logits, matmul, b, array, how=how)
    _find_lookups(model, head, transposed_from)
    return head


def _find_lookups(model: ir.Model, head: LMHead, transposed_from: ir.Value | None) -> None:
    candidates: dict[ir.Value, list[ir.Node]] = {}
    for node in model.graph:
        if node.op_type != "Gather" or node.attributes.get_int("axis", 0) != 0:
            continue
        table = node.inputs[0]
        if table is None or not table.is_initializer() or table.shape is None or len(table.shape) != 2:
            continue
        if table.shape[0] != head.vocab or table.shape[1] != head.hidden:
            continue
        candidates.setdefault(table, []).append(node)
    if transposed_from is not None and transposed_from in candidates:
        head.table, head.lookups, head.tied = transposed_from, candidates[transposed_from], True
        return
    for table, lookups in candidates.items():
        if np.array_equal(const_array(table), head.weight_array.T):
            head.table, head.lookups, head.tied = table, lookups, True
            return
    if len(candidates) == 1:
        head.table, head.lookups = next(iter(candidates.items()))


@dataclass
class StoreHeadResult(ir.passes.PassResult):
    """What :class:`StoreHeadPass` did: notes for the report and one row per weight."""

    notes: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)


class StoreHeadPass(ir.passes.InPlacePass):
    """Store the head (and the embedding it shares, or its own) quantized; see the module doc.

    ``mode``: ``int8`` (per token), ``q4`` (4-bit blocks along hidden; the table, if untied,
    stays int8 per token) or ``keep``. ``lookups``: the layout of a tied table, ``columns``
    or ``rows`` (int8 only). Its result's ``notes`` and ``rows`` say what was done.
    """

    def __init__(
        self,
        head: LMHead,
        mode: str = "int8",
        *,
        block_size: int = 32,
        symmetric: bool = False,
        lookups: str = "columns",
    ) -> None:
        super().__init__()
        if mode not in HEAD_MODES:
            raise ValueError(f"head mode must be one of {', '.join(HEAD_MODES)}")
        if lookups not in LOOKUPS:
            raise ValueError(f"lookups must be one of {', '.join(LOOKUPS)}")
        self.head = head
        self.mode = mode
        self.lookups = lookups
        self.block_size = block_size
        self.symmetric = symmetric

    def call(self, model: ir.Model) -> StoreHeadResult:
        self._result = StoreHeadResult(model, False)  # filled while the pass runs
        head = self.head
        graph = model.graph
        if self.mode == "keep":
            self._result.notes.append(f"LM head kept as it was ({head.how})")
            self._result.modified = False
            return self._result
        if head.tied and self.lookups == "rows" and self.mode == "int8":
            self._store_tied_rows(graph)
            self._result.modified = True
            return self._result
        name = head.weight.name or "lm_head.weight"
        names = FreshNames(graph)
        w = head.weight_array
        if self.mode == "q4" and w.shape[0] % self.block_size == 0:
            b = qz.quantize_blocked(w, 4, self.block_size, self.symmetric)
            dq = qz.blocked_dequantize_node(graph, names, name, b)
            stored = f"4-bit blocks of {self.block_size} along hidden"
            error = qz.relative_error(w, qz.dequantize_blocked(b))
        elif (grid := self._symmetric_grid(model, w)) is not None:
            dq = qz.blocked_dequantize_node(graph, names, name, grid)
            stored = f"int8 blocks of {self.block_size} along hidden, on its grid (exact: as a GGUF Q8_0 file holds it)"
            error = qz.relative_error(w, qz.dequantize_blocked(grid))
        else:
            if self.mode == "q4":
                self._result.notes.append(
                    f"head: hidden {w.shape[0]} is not a multiple of block {self.block_size}; stored int8"
                )
            p = qz.quantize_per_channel_int8(w, axis=1)
            dq = qz.per_channel_dequantize_node(graph, names, name, p)
            stored = "int8, one scale per token"
            error = qz.relative_error(w, qz.dequantize_per_channel(p))
        graph.insert_before(graph.node(0), dq)
        restored = dq.outputs[0]
        head.matmul.replace_input_with(1, restored)
        release(graph, head.weight)
        restored.name = FreshNames(graph)(name)  # the head weight's own name, now that it is gone

        if head.tied:
            if any(lookup_indices(lookup).shape is None for lookup in head.lookups):
                infer_types(model)  # the lookups' rewrite needs the rank of their indices
            for lookup in head.lookups:
                self._lookup_columns(graph, lookup, restored)
            table = head.tied_table
            release(graph, table)  # nothing reads the [vocab, hidden] table any more
            if table.uses():
                self._result.notes.append(
                    f"'{table.name}' is still read by something other than the lookups; its fp32 copy stays"
                )
            self._result.notes.append(
                f"tied embedding/LM head '{table.name}' [{head.vocab}, {head.hidden}] stored once as "
                f"'{restored.name}' [{head.hidden}, {head.vocab}] ({stored}); the head reads it directly, "
                f"{len(head.lookups)} lookup(s) gather its columns (Gather axis 1, then Transpose)"
            )
            self._result.rows.append(
                {
                    "weight": table.name,
                    "shape": f"{head.vocab}x{head.hidden}",
                    "stored as": f"{stored} (tied head)",
                    "rel. error": error,
                }
            )
        else:
            self._result.notes.append(f"LM head '{name}' [{head.hidden}, {head.vocab}] stored {stored} (untied)")
            self._result.rows.append(
                {
                    "weight": name,
                    "shape": f"{head.hidden}x{head.vocab}",
                    "stored as": f"{stored} (head)",
                    "rel. error": error,
                }
            )
            if head.table is not None:
                self._store_untied_table(graph, head.table)
        self._result.modified = True
        return self._result

    def _symmetric_grid(self, model: ir.Model, w: np.ndarray) -> qz.Blocked | None:
        """An int8 head already on symmetric 8-bit grids in blocks along hidden (a GGUF Q8_0 table), where a
        blocked DequantizeLinear (opset 21) can hold it: its blocks, which restore it exactly (one scale per
        token would move it: SmolLM2's by 1.2 %, for 3 % more bytes for the blocks' scales)."""
        if self.mode != "int8" or model.opset_imports.get("", 0) < qz.BLOCKED_DQ_OPSET:
            return None
        return qz.on_symmetric_grid(w, 8, self.block_size)

    def _store_tied_rows(self, graph: ir.Graph) -> None:
        """The tied table int8 per token in its [vocab, hidden] layout; the head reads its Transpose."""
        head, table = self.head, self.head.tied_table
        assert table.name is not None  # an initializer (find_lm_head)
        array = np.ascontiguousarray(head.weight_array.T)
        p = qz.quantize_per_channel_int8(array, axis=0)
        dq = qz.per_channel_dequantize_node(graph, FreshNames(graph), table.name, p)
        graph.insert_before(graph.node(0), dq)
        stored = dq.outputs[0]
        ir.convenience.replace_all_uses_with(table, stored)  # the lookups (and optimum's Transpose) read it
        name = table.name
        graph.initializers.pop(name)
        stored.name = name
        weight = head.matmul.inputs[1]
        assert weight is not None  # the head's weight (find_lm_head)
        transpose = weight.producer()
        if transpose is None or transpose.op_type != "Transpose" or transpose.inputs[0] is not stored:
            transpose = ir.node("Transpose", [stored], {"perm": [1, 0]}, name=f"{name}/transposed")
            graph.insert_after(dq, transpose)
            head.matmul.replace_input_with(1, transpose.outputs[0])
            release(graph, weight)
            transpose.outputs[0].name = FreshNames(graph)(f"{name}_transposed")
            set_dtype(transpose.outputs[0], stored.dtype)
            transpose.outputs[0].shape = ir.Shape([head.hidden, head.vocab])
        self._result.notes.append(
            f"tied embedding/LM head '{name}' [{head.vocab}, {head.hidden}] stored once (int8, one scale per token) "
            f"in its own layout: {len(head.lookups)} lookup(s) gather rows, the head reads its transpose "
            "(onnxruntime folds it at load into a second fp32 copy)"
        )
        self._result.rows.append(
            {
                "weight": name,
                "shape": f"{head.vocab}x{head.hidden}",
                "stored as": "int8, one scale per token (tied head, rows)",
                "rel. error": qz.relative_error(array, qz.dequantize_per_channel(p)),
            }
        )

    def _lookup_columns(self, graph: ir.Graph, lookup: ir.Node, table_t: ir.Value) -> None:
        ids, rank = lookup.inputs[1], lookup_rank(lookup)
        label = lookup.name or "embedding"
        gather = ir.node("Gather", [table_t, ids], {"axis": 1}, name=f"{label}/columns")
        transpose = ir.node("Transpose", gather.outputs, {"perm": [*range(1, rank + 1), 0]}, name=f"{label}/rows")
        ir.convenience.replace_nodes_and_values(
            graph, lookup, [lookup], [gather, transpose], [lookup.outputs[0]], [transpose.outputs[0]]
        )

    def _store_untied_table(self, graph: ir.Graph, table: ir.Value) -> None:
        assert table.name is not None  # an initializer (find_lm_head)
        array = const_array(table)
        p = qz.quantize_per_channel_int8(array, axis=0)
        row = table_row(table.name, array, p)
        dq = qz.per_channel_dequantize_node(graph, FreshNames(graph), table.name, p)
        graph.insert_before(graph.node(0), dq)
        ir.convenience.replace_all_uses_with(table, dq.outputs[0])
        old_name = table.name
        graph.initializers.pop(old_name)
        dq.outputs[0].name = old_name
        self._result.notes.append(
            f"embedding table '{old_name}' [{array.shape[0]}, {array.shape[1]}] stored int8, one scale per token"
        )
        self._result.rows.append(row)


def lookup_indices(lookup: ir.Node) -> ir.Value:
    """What an embedding lookup (a Gather) reads its indices from."""
    ids = lookup.inputs[1]
    assert ids is not None  # a Gather reads its indices
    return ids


def lookup_rank(lookup: ir.Node) -> int:
    """The rank of an embedding lookup's indices, which its rewrite needs; InputError when unknown."""
    ids = lookup.inputs[1]
    if ids is None or ids.shape is None:
        raise InputError(f"cannot rewrite embedding lookup '{node_label(lookup)}': the rank of its indices is unknown")
    return len(ids.shape)


def table_row(name: str, array: np.ndarray, p: qz.PerChannel) -> dict[str, Any]:
    """The report's row of an untied embedding table stored int8, one scale per token."""
    return {
        "weight": name,
        "shape": "x".join(map(str, array.shape)),
        "stored as": "int8, one scale per token (embedding)",
        "rel. error": qz.relative_error(array, qz.dequantize_per_channel(p)),
    }


def release(graph: ir.Graph, value: ir.Value) -> None:
    """Drop ``value`` (an initializer, or the output of a node like Transpose) once nothing reads it."""
    if value.uses() or value in graph.outputs:
        return
    if value.is_initializer() and value.name is not None and value.name in graph.initializers:
        graph.initializers.pop(value.name)
    producer = value.producer()
    if producer is not None and not any(out.uses() or out in graph.outputs for out in producer.outputs):
        graph.remove(producer, safe=True)
