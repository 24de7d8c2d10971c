"""Rules whose rewrite adds weights: fresh names for them, one generator per graph rewritten."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxsmith.irutil.names import FreshNames


class WeightAddingRule(pattern.RewriteRuleClassBase):
    """Subclasses call :meth:`remember_graph` in ``check`` and :meth:`new_weight` in ``rewrite``."""

    def setup(self):
        self._graph: ir.Graph | ir.Function | None = None
        self._names: FreshNames | None = None

    def remember_graph(self, context) -> None:
        self._graph = context.graph_or_function

    def new_weight(self, op, array: np.ndarray, base: str) -> ir.Value:
        """``array`` as a new initializer named ``base`` (made fresh in the graph being rewritten)."""
        if self._names is None:
            self._names = FreshNames(self._graph)
        name = self._names(base)
        return op.initializer(ir.tensor(array, name=name), name=name)
