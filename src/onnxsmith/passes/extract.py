"""The subgraph between named tensors, as a model of its own.

The cut tensors become graph inputs, the requested tensors graph outputs; only
the nodes between them and the initializers those nodes read are kept (onnx-ir's
``convenience.extract``, which shares tensors with the source: no weight is read
or copied here). Every input and output must end up typed: a tensor static
inference could not type gets its dtype and shape from ``observed`` arrays (the
source run on sample inputs), so the piece never has a value without a type. A
dim inference could not tell becomes the observed number when every sample
agrees and the source has no symbolic dims, else a named symbolic dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedFunctionsPass, RemoveUnusedOpsetsPass


@dataclass
class ExtractResult(ir.passes.PassResult):
    """The piece (``model``), and which of its inputs and outputs only running the source could type."""

    typed_by_running: list[str] = field(default_factory=list)


class ExtractPass(ir.passes.FunctionalPass):
    """A new model computing ``outputs`` from ``inputs`` (tensor names of ``model.graph``)."""

    def __init__(
        self,
        inputs: list[str],
        outputs: list[str],
        observed: dict[str, list[np.ndarray]] | None = None,
        *,
        static_dims: bool = True,
    ) -> None:
        """``observed``: each cut tensor's value on every sample; ``static_dims``: the source has no
        symbolic dims (else unknown dims always get names of their own)."""
        super().__init__()
        self.inputs = inputs
        self.outputs = outputs
        self.observed = observed or {}
        self.static_dims = static_dims

    def call(self, model: ir.Model) -> ExtractResult:
        graph = ir.convenience.extract(model.graph, inputs=self.inputs, outputs=self.outputs)
        graph.name = f"{model.graph.name or 'graph'}_piece"
        piece = ir.Model(
            graph,
            ir_version=model.ir_version,
            producer_name=model.producer_name,
            producer_version=model.producer_version,
            domain=model.domain,
            model_version=model.model_version,
            functions=list(model.functions.values()),
        )
        typed_by_running = [
            value.name
            for value in [*graph.inputs, *graph.outputs]
            if self._complete_type(value) and value.name is not None  # filled ones are named: found by name
        ]
        RemoveUnusedFunctionsPass()(piece)  # type: ignore[no-untyped-call]  # onnx-ir leaves __init__ unannotated
        RemoveUnusedOpsetsPass()(piece)
        return ExtractResult(piece, True, typed_by_running)

    def _complete_type(self, value: ir.Value) -> bool:
        """Fill a missing dtype or unknown dims from the observed arrays; True if anything was filled."""
        complete = value.dtype is not None and value.shape is not None and all(_told(d) for d in value.shape)
        arrays = self.observed.get(value.name) if value.name is not None else None
        if complete or not arrays:
            return False
        if value.dtype is None:
            value.dtype = ir.DataType.from_numpy(arrays[0].dtype)
        rank = arrays[0].ndim
        known: list[int | ir.SymbolicDim | None] = (
            list(value.shape) if value.shape is not None and value.shape.rank() == rank else [None] * rank
        )
        dims: list[int | str] = []
        for i, dim in enumerate(known):
            sizes = {int(a.shape[i]) for a in arrays}
            if isinstance(dim, int):
                dims.append(dim)
            elif dim is not None and dim.value is not None and _told(dim):
                dims.append(dim.value)
            elif self.static_dims and len(sizes) == 1:
                dims.append(sizes.pop())
            else:
                dims.append(f"{value.name}_dim{i}")
        value.shape = ir.Shape(dims)
        return True


def _told(dim: int | ir.SymbolicDim) -> bool:
    """A dim inference really knows: a number or a name from the model (not onnx's made-up ``unk__N``)."""
    return isinstance(dim, int) or bool(dim.value and not dim.value.startswith("unk__"))
