"""Quantize every MatMul's constant [K, N] weight in blocks along K.

``format="qdq"``: the weight's initializer is replaced by UINT4 (or INT4/[U]INT8) data,
a scale and a zero point per block, behind one blocked DequantizeLinear (opset 21)
whose output carries the weight's original name, so every reader is unchanged. What
onnxruntime does with it depends on the session (see quantize_engine/engine.py).

``format="nbits"``: each MatMul reading the weight becomes one com.microsoft
MatMulNBits over the packed weight (what onnxruntime's native CPU and WebGPU
kernels run); a weight also read by something else keeps the DequantizeLinear.

A weight already on a grid of 2^bits evenly spaced values in each block (a model dequantized
from a GGUF Q4_1 file: each block of 32 is ``min + d * q``; :func:`~onnxsmith.passes.quantization.on_grid`)
is stored exactly, as its levels and one float offset per block, in either format: MatMulNBits runs
the levels at its integer kernels' speed and adds the input's block sums times the offsets
(:func:`~onnxsmith.passes.quantization.grid_matmul_nodes`); ``qdq`` restores the levels with a
DequantizeLinear and adds the offsets, constants that onnxruntime folds at load
(:func:`~onnxsmith.passes.quantization.grid_dequantize_nodes`). Round-to-nearest with an integer
zero point would move each block by up to half a step (SmolLM2's: ~9 % weight error).

A weight whose K is not a multiple of the block is not block-quantized: it is
stored int8 with one scale per output column (a per-axis DequantizeLinear,
onnxruntime everywhere), or kept as it was with ``uneven="keep"``. The pass says
which weights those were in ``self._result.notes`` / ``self._result.rows``.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.types import infer_types, set_dtype
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes import quantization as qz
from onnxsmith.settings.quantize import FORMATS, UNEVEN


def quantizable_weights(
    model: ir.Model, exclude: AbstractSet[ir.Node] = frozenset()
) -> list[tuple[ir.Value, list[ir.Node]]]:
    """(weight, MatMuls reading it) for every float 2-D initializer that is some MatMul's B, in graph order."""
    found: dict[ir.Value, list[ir.Node]] = {}
    graph = model.graph
    for node in graph:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node in exclude:
            continue
        w = node.inputs[1]
        if w is None or not w.is_initializer() or w in graph.inputs or w.const_value is None:
            continue
        if w.const_value.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16) or len(w.const_value.shape) != 2:
            continue
        found.setdefault(w, []).append(node)
    return list(found.items())


@dataclass
class QuantizeWeightsResult(ir.passes.PassResult):
    """What :class:`QuantizeWeightsPass` did: notes, one row per weight, how many it quantized."""

    notes: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    quantized: int = 0


class QuantizeWeightsPass(ir.passes.InPlacePass):
    """Quantize MatMul weights (all but the ``exclude``d MatMuls'); see the module doc."""

    def __init__(
        self,
        *,
        bits: int = 4,
        block_size: int = 32,
        symmetric: bool = False,
        format: str = "qdq",
        accuracy_level: int | None = None,
        uneven: str = "int8",
        exclude: AbstractSet[ir.Node] = frozenset(),
    ) -> None:
        super().__init__()
        if bits not in (4, 8):
            raise ValueError("bits must be 4 or 8")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}")
        if uneven not in UNEVEN:
            raise ValueError(f"uneven must be one of {', '.join(UNEVEN)}")
        if block_size < 16 or block_size & (block_size - 1):
            raise ValueError("block_size must be a power of two, at least 16")
        self.bits, self.block_size, self.symmetric = bits, block_size, symmetric
        self.format, self.accuracy_level, self.uneven = format, accuracy_level, uneven
        self.exclude = exclude

    def call(self, model: ir.Model) -> QuantizeWeightsResult:
        self._result = QuantizeWeightsResult(model, False)  # filled while the pass runs
        graph = model.graph
        names = FreshNames(graph)
        order = {node: i for i, node in enumerate(graph)}
        uneven: list[str] = []
        on_grids = 0  # weights already on a grid: stored exactly
        weights = quantizable_weights(model, self.exclude)
        scheme = "symmetric" if self.symmetric else "asymmetric"
        block_sums: dict[ir.Value, ir.Value] = {}  # an input's block sums, shared by the grids that read it
        if self.format == "nbits" and any(_data(m).shape is None for _, matmuls in weights for m in matmuls):
            infer_types(model)  # a grid's block sums reshape the input: its rank
        # grid weights that are their MatMul's only weight, by the input they multiply: packed where several are
        siblings: dict[tuple[ir.Value, int], list[_Sibling]] = {}
        for weight, matmuls in weights:
            w = const_array(weight)
            k, n = w.shape
            name = weight.name
            assert name is not None  # an initializer
            if k % self.block_size:
                uneven.append(f"{name} (K={k})")
                self._store_uneven(graph, names, order, weight, w)
                continue
            only_matmuls = all(user in matmuls and index == 1 for user, index in weight.uses())
            nbits = self.format == "nbits" and only_matmuls and weight not in graph.outputs
            # On a grid, levels and offsets need no zero point: --symmetric stores them exactly too.
            grid = qz.on_grid(w, self.bits, self.block_size)
            b = grid or qz.quantize_blocked(w, self.bits, self.block_size, self.symmetric)
            on_grids += grid is not None
            row: dict[str, Any] = {
                "weight": name,
                "shape": f"{k}x{n}",
                "stored as": "",
                "rel. error": qz.relative_error(w, qz.dequantize_blocked(b)),
            }
            if nbits and grid is not None and len(matmuls) == 1 and matmuls[0].outputs[0] not in graph.outputs:
                siblings.setdefault((_data(matmuls[0]), k), []).append(_Sibling(weight, matmuls[0], b, row))
            elif nbits:
                row["stored as"] = self._store_nbits(model, names, weight, matmuls, b, block_sums)
            else:
                dequantized = (
                    qz.grid_dequantize_nodes(graph, names, name, b)
                    if grid is not None
                    else [qz.blocked_dequantize_node(graph, names, name, b)]
                )
                self._replace_by_dequantize(graph, order, weight, dequantized)
                row["stored as"] = f"{self.bits}-bit blocks of {self.block_size}"
                if grid is not None:
                    row["stored as"] += ", on its grid (exact: levels + block offsets, folded at load)"
            if grid is None:  # a grid's zero is its float offsets, said in "stored as"
                row["stored as"] += f", {scheme}"
            self._result.rows.append(row)
            self._result.quantized += 1
        packed = []  # the groups packed
        for group in siblings.values():
            if len(group) > 1 and self._store_packed(model, names, order, group, block_sums):
                packed.append(group)
                continue
            for sibling in group:
                sibling.row["stored as"] = self._store_nbits(
                    model, names, sibling.weight, [sibling.matmul], sibling.blocked, block_sums
                )
        if packed:
            self._result.notes.append(
                f"{sum(len(g) for g in packed)} grid weights that read the same input as another (a decoder "
                f"layer's q, k and v, say) run as {len(packed)} MatMulNBits, one block-offset product each, split "
                "after: fewer small nodes per call"
            )
        self._result.notes.extend(self._notes(uneven, on_grids))
        self._result.modified = bool(self._result.quantized)
        return self._result

    def _store_uneven(
        self, graph: ir.Graph, names: FreshNames, order: dict[ir.Node, int], weight: ir.Value, w: np.ndarray
    ) -> None:
        """A weight whose K is not a multiple of the block: kept, or int8 per output column."""
        assert weight.name is not None  # an initializer
        k, n = w.shape
        row = {"weight": weight.name, "shape": f"{k}x{n}"}
        if self.uneven == "keep":
            self._result.rows.append(
                {**row, "stored as": "unchanged (K not a multiple of the block)", "rel. error": 0.0}
            )
            return
        p = qz.quantize_per_channel_int8(w, axis=1)
        self._replace_by_dequantize(
            graph, order, weight, [qz.per_channel_dequantize_node(graph, names, weight.name, p)]
        )
        self._result.rows.append(
            {
                **row,
                "stored as": "int8 per column (K not a multiple of the block)",
                "rel. error": qz.relative_error(w, qz.dequantize_per_channel(p)),
            }
        )
        self._result.quantized += 1

    def _store_nbits(
        self,
        model: ir.Model,
        names: FreshNames,
        weight: ir.Value,
        matmuls: list[ir.Node],
        b: qz.Blocked,
        block_sums: dict[ir.Value, ir.Value],
    ) -> str:
        """Every MatMul reading ``weight`` as a MatMulNBits of the blocks ``b`` (on a grid: its levels, plus the
        input's block sums times the offsets); returns how the weight is stored, for the table."""
        graph, name, k = model.graph, weight.name, b.q.shape[0]
        assert name is not None  # an initializer
        on_grid = b.float_zero_point
        for i, matmul in enumerate(matmuls):
            label = name if len(matmuls) == 1 else f"{name}_{i}"
            x = _data(matmul)
            sums = self._block_sums(graph, names, x, k, block_sums) if on_grid else None
            if sums is not None:
                nodes = qz.grid_matmul_nodes(graph, names, label, x, sums, b, self.accuracy_level)
            else:  # the plain product; a grid whose input's width is unknown: float zero points
                nodes = [qz.matmul_nbits_node(graph, names, label, x, b, self.accuracy_level)]
            nodes[-1].outputs[0].shape = matmul.outputs[0].shape
            ir.convenience.replace_nodes_and_values(
                graph, matmul, [matmul], nodes, [matmul.outputs[0]], [nodes[-1].outputs[0]]
            )
        graph.initializers.pop(name)
        model.opset_imports.setdefault("com.microsoft", 1)  # a model must import the domains it uses
        stored = f"MatMulNBits {self.bits}-bit, block {self.block_size}"
        return stored + (", on its grid (exact: levels + block offsets)" if on_grid else "")

    def _store_packed(
        self,
        model: ir.Model,
        names: FreshNames,
        order: dict[ir.Node, int],
        group: list[_Sibling],
        block_sums: dict[ir.Value, ir.Value],
    ) -> bool:
        """The grid weights of ``group``, all read by MatMuls of the same input, as one MatMulNBits of their columns
        side by side (with one block-offset product) and a Split into each MatMul's output. Unpacked, each weight
        pays its own MatMulNBits, offset MatMul and Add: on SmolLM2-135M a decode step ran 9 % faster packed
        (docs/benchmarks.md). Weights not on a grid are not packed: there the Split costs what the merge saves.
        False (nothing changed) where the input's block sums cannot be computed."""
        graph = model.graph
        first = min((s.matmul for s in group), key=order.__getitem__)
        x, k = _data(first), group[0].blocked.q.shape[0]
        sums = self._block_sums(graph, names, x, k, block_sums)
        if sums is None:
            return False
        label = f"{group[0].weight.name}_packed"
        nodes = qz.grid_matmul_nodes(
            graph, names, label, x, sums, qz.side_by_side([s.blocked for s in group]), self.accuracy_level
        )
        widths = [s.blocked.q.shape[1] for s in group]
        split = ir.node(
            "Split",
            [nodes[-1].outputs[0], add_initializer(graph, names(f"{label}_widths"), np.array(widths, np.int64))],
            {"axis": -1},
            num_outputs=len(group),
            name=f"{label}_split",
        )
        graph.insert_before(first, [*nodes, split])
        for sibling, part in zip(group, split.outputs, strict=True):
            product = sibling.matmul.outputs[0]
            set_dtype(part, x.dtype)
            part.shape = product.shape
            ir.convenience.replace_all_uses_with(product, part)
            graph.remove(sibling.matmul, safe=True)
            part.name = product.name
            graph.initializers.pop(sibling.weight.name)  # type: ignore[arg-type]
        model.opset_imports.setdefault("com.microsoft", 1)
        others = ", ".join(str(s.weight.name) for s in group)
        for sibling in group:
            sibling.row["stored as"] = (
                f"MatMulNBits {self.bits}-bit, block {self.block_size}, on its grid (exact: levels + block offsets), "
                f"one MatMulNBits for the weights reading its input ({others})"
            )
        return True

    def _notes(self, uneven: list[str], on_grids: int) -> list[str]:
        notes = []
        if uneven:
            kept = (
                "kept as they were" if self.uneven == "keep" else "stored int8 with one scale per output column instead"
            )
            notes.append(
                f"{len(uneven)} weight(s) not block-quantized because K is not a multiple of the block size "
                f"{self.block_size}, {kept}: {', '.join(uneven)}"
            )
        if on_grids:
            notes.append(
                f"{on_grids} weight(s) already on a {self.bits}-bit grid in each block of {self.block_size} (a model "
                "dequantized from a GGUF file): stored exactly, as their levels and one float offset per block"
            )
        return notes

    def _block_sums(
        self, graph: ir.Graph, names: FreshNames, x: ir.Value, k: int, cache: dict[ir.Value, ir.Value]
    ) -> ir.Value | None:
        """``x``'s sums over each block (:func:`~onnxsmith.passes.quantization.block_sums_nodes`), computed once,
        right after ``x`` is: every grid weight that reads ``x`` (a layer's q, k and v) multiplies them."""
        if x not in cache:
            nodes = qz.block_sums_nodes(graph, names, x, k, self.block_size)
            if nodes is None:
                return None
            producer = x.producer()
            if producer is not None and producer.graph is graph:
                graph.insert_after(producer, nodes)
            else:  # a graph input
                graph.insert_before(graph.node(0), nodes)
            cache[x] = nodes[-1].outputs[0]
        return cache[x]

    @staticmethod
    def _replace_by_dequantize(
        graph: ir.Graph, order: dict[ir.Node, int], weight: ir.Value, nodes: list[ir.Node]
    ) -> None:
        """The last node's output (the restored weight) takes the weight's place and its name; the nodes run
        before its first reader."""
        graph.insert_before(min((user for user, _ in weight.uses()), key=order.__getitem__), nodes)
        restored = nodes[-1].outputs[0]
        ir.convenience.replace_all_uses_with(weight, restored, replace_graph_outputs=True)
        name = weight.name
        assert name is not None  # an initializer
        graph.initializers.pop(name)
        restored.name = name


def _data(matmul: ir.Node) -> ir.Value:
    """What a MatMul multiplies its weight with (its A, which it requires)."""
    x = matmul.inputs[0]
    assert x is not None
    return x


@dataclass
class _Sibling:
    """A grid weight that one MatMul reads, waiting to be packed with the others reading the same input."""

    weight: ir.Value
    matmul: ir.Node
    blocked: qz.Blocked
    row: dict[str, Any]
