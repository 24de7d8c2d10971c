"""Identical constants stored once: initializers and Constant nodes alike.

Exporters repeat constants (the same mask, table or scale per layer; PP-OCR keeps
every weight in a Constant node). onnx-ir's ``DeduplicateHashedInitializersPass``
covers initializers only, and hashes every one of them, reading all the weights
of a multi-GB model even when no two tensors share a shape. This pass keys each
constant by (dtype, shape) first and reads only the ones that share a key with
another, streaming each through sha256 (a weight on disk is read in chunks, never
mapped whole); tensors in memory are also compared byte for byte before merging.

Within each graph the first constant (initializers before Constant nodes, then
graph order) is kept and every reader of a duplicate reads it instead.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.walk import const_tensor, rewritable_constants


@dataclass
class Duplicate:
    name: str  # the constant removed
    kept: str  # the one its readers now read
    nbytes: int


class _Sha256Writer:
    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return len(data)


@dataclass
class DedupResult(ir.passes.PassResult):
    """What :class:`DeduplicateConstantsPass` did: the constants it replaced."""

    removed: list[Duplicate] = field(default_factory=list)


class DeduplicateConstantsPass(ir.passes.InPlacePass):
    """Replace constants that equal an earlier one (same dtype, shape and bytes) by it."""

    def call(self, model: ir.Model) -> DedupResult:
        removed = [duplicate for graph in model.graphs() for duplicate in _deduplicate(graph)]
        return DedupResult(model, bool(removed), removed)


def _deduplicate(graph: ir.Graph) -> list[Duplicate]:
    """Each constant of ``graph`` that equals an earlier one replaced by it; what was removed."""
    removed = []
    by_shape: dict[tuple[ir.DataType, tuple[int | ir.SymbolicDimProtocol, ...]], list[ir.Value]] = defaultdict(list)
    for value in rewritable_constants(graph):
        tensor = const_tensor(value)
        by_shape[(tensor.dtype, tuple(tensor.shape))].append(value)
    for candidates in by_shape.values():
        if len(candidates) < 2:
            continue  # unique shape: never read
        kept: dict[str, list[ir.Value]] = {}
        for value in candidates:
            digest = _sha256(const_tensor(value))
            twin = next((k for k in kept.get(digest, []) if _same_bytes(k, value)), None)
            if twin is None:
                kept.setdefault(digest, []).append(value)
                continue
            removed.append(_replace(graph, value, twin))
    return removed


def _replace(graph: ir.Graph, duplicate: ir.Value, kept: ir.Value) -> Duplicate:
    nbytes = const_tensor(duplicate).nbytes
    name = duplicate.name or "?"
    producer = duplicate.producer()
    duplicate.replace_all_uses_with(kept)
    if producer is None:
        assert duplicate.name is not None  # an initializer is named
        graph.initializers.pop(duplicate.name)
    else:
        name = node_label(producer)
        graph.remove(producer, safe=True)
    return Duplicate(name, kept.name or "?", nbytes)


def _sha256(tensor: ir.TensorProtocol) -> str:
    if isinstance(tensor, ir.ExternalTensor):
        sink = _Sha256Writer()
        tensor.tofile(sink)  # chunked reads, no map of the whole weight
        return sink.digest.hexdigest()
    if tensor.dtype == ir.DataType.STRING:
        strings = tensor.string_data()  # type: ignore[attr-defined]  # onnx-ir's string tensors have it; its protocol does not
        return hashlib.sha256(b"\0".join(strings)).hexdigest()
    return hashlib.sha256(tensor.tobytes()).hexdigest()


def _same_bytes(a: ir.Value, b: ir.Value) -> bool:
    ta, tb = const_tensor(a), const_tensor(b)
    if ta.dtype == ir.DataType.STRING:
        return list(ta.string_data()) == list(tb.string_data())  # type: ignore[attr-defined]  # as in _sha256
    if isinstance(ta, ir.ExternalTensor) or isinstance(tb, ir.ExternalTensor):
        return True  # their sha256 matched; reading both weights again would cost more than it proves
    return np.array_equal(np.frombuffer(ta.tobytes(), np.uint8), np.frombuffer(tb.tobytes(), np.uint8))
