"""Weights a rewrite makes: new initializers with fresh names, and existing weights converted lazily."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """``array`` as an initializer of ``graph`` named ``name`` (give it a fresh one: :class:`FreshNames`)."""
    array = _contiguous(array)
    value = ir.Value(
        name=name,
        shape=ir.Shape(array.shape),
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        const_value=ir.tensor(array, name=name),
    )
    graph.register_initializer(value)
    return value


def weight_bytes(model: ir.Model) -> int:
    """The bytes of every initializer's value, subgraphs' included."""
    return sum(
        v.const_value.nbytes for g in model.graphs() for v in g.initializers.values() if v.const_value is not None
    )


def tensor_dims(tensor: ir.TensorProtocol) -> tuple[int, ...]:
    """A tensor's dims as ints: its shape is concrete (onnx-ir's protocol types them as any shape's dims)."""
    return tuple(int(d) for d in tensor.shape)  # type: ignore[arg-type]  # ints: a tensor has no symbolic dims


def _contiguous(given: Any) -> np.ndarray:
    """C-contiguous, its shape kept (``np.ascontiguousarray`` makes a scalar one-dimensional)."""
    array: np.ndarray = np.asarray(given)
    return array if array.flags.c_contiguous else array.copy(order="C")


class ConstantPool:
    """One initializer per distinct array, named after the first value it stands for (deterministic)."""

    def __init__(self, graph: ir.Graph, names: FreshNames) -> None:
        self.graph = graph
        self.names = names
        self._by_content: dict[tuple[Any, ...], ir.Value] = {}

    def get(self, array: np.ndarray, name: str) -> ir.Value:
        """The initializer holding ``array``; a new one named ``name`` (made fresh) the first time."""
        array = _contiguous(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._by_content:
            self._by_content[key] = add_initializer(self.graph, self.names(name), array)
        return self._by_content[key]


def lazy_tensor(
    tensor: ir.TensorProtocol, convert: Callable[[np.ndarray], np.ndarray], *, dtype: ir.DataType, name: str | None
) -> ir.TensorProtocol:
    """``convert(tensor.numpy())`` as a ``dtype`` tensor, computed when read.

    A weight still in a memory map is converted when the model is written, one tensor at a
    time, and its pages are unmapped once read: converting a big model never holds two copies.
    """

    def compute() -> ir.TensorProtocol:
        source = tensor.numpy()
        result = convert(source)
        del source
        if isinstance(tensor, ir.ExternalTensor):
            with contextlib.suppress(BufferError):
                tensor.release()
        return ir.tensor(result, dtype=dtype, name=name)

    return ir.LazyTensor(compute, dtype=dtype, shape=ir.Shape(tensor.shape), name=name)  # type: ignore[arg-type]
