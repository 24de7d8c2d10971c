"""How far a model's outputs move when chosen groups of its tensors are rounded to fp16.

The precision engine converts a model and the gate judges the result; when the gate
refuses, what it measured (the outputs) does not say which conversion caused it. This
probe answers that in one session: on a copy of the model, each probed tensor passes
through ``Where(switch, Cast<fp32>(Cast<fp16>(t)), t)``, one boolean input per group of
tensors, so :meth:`RoundingProbe.run` gives the outputs with any set of groups rounded as
fp16 storage rounds them (the gate's storage-faithful emulation does the same: compute in
fp32, round what is stored) and the rest exact. A weight held in a Constant node is a node's
output and can be probed; initializers are not rounded here.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

import numpy as np
import onnx_ir as ir

from onnxsmith.io.load import load_model, release_weights
from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.types import ensure_types
from onnxsmith.runtime import runner

F32 = ir.DataType.FLOAT


class RoundingProbe:
    """One session on ``model_path`` where each group of ``groups`` (names of fp32 tensors of its main
    graph: node outputs or graph inputs) can be rounded to ``dtype`` by a switch; :meth:`run` takes the
    groups to round."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        feeds_list: list[dict[str, np.ndarray]],
        groups: Sequence[Collection[str]],
        dtype: ir.DataType = ir.DataType.FLOAT16,
    ) -> None:
        self.path = model_path
        self.feeds_list = feeds_list
        self.runs = 0  # runs made, each over every input set
        model = load_model(model_path)
        ensure_types(model)
        graph = model.graph
        names = FreshNames(graph)
        values = {v.name: v for v in graph.inputs}
        values.update({v.name: v for node in graph for v in node.outputs})
        self.switches: list[str] = []
        for index, group in enumerate(groups):
            switch = ir.Value(
                name=names(f"onnxsmith::round::{index}"), shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL)
            )
            graph.inputs.append(switch)
            self.switches.append(switch.name)
            for name in sorted(group):
                value = values.get(name)
                if value is not None and value.dtype == F32:
                    _round_where(graph, names, value, switch, dtype)
        self.outputs = [v.name for v in graph.outputs]
        self.session = runner.open_session(model, label=model_path)
        self.model = model

    def run(self, rounded: Collection[int]) -> dict[str, np.ndarray]:
        """The outputs (stacked over the input sets, as :func:`runner.run_all` gives them) with the
        groups at the indices ``rounded`` rounded and every other tensor exact."""
        self.runs += 1
        switches = {name: np.array(i in rounded) for i, name in enumerate(self.switches)}
        collected: dict[str, list[np.ndarray]] = {}
        for feeds in self.feeds_list:
            got = runner.run(self.session, {**feeds, **switches}, self.outputs, label=self.path)
            for name, value in got.items():
                collected.setdefault(name, []).append(value)
        return {name: np.stack(values) for name, values in collected.items()}

    def close(self) -> None:
        del self.session
        release_weights(self.model)


def _round_where(graph: ir.Graph, names: FreshNames, value: ir.Value, switch: ir.Value, dtype: ir.DataType) -> None:
    """After ``value``'s producer: Where(switch, value rounded to ``dtype`` and back, value), read by every
    user of ``value`` (a graph output keeps its name: the rounded value takes it)."""
    uses = list(value.uses())
    low = ir.node("Cast", [value], attributes={"to": dtype}, num_outputs=1)
    back = ir.node("Cast", [low.outputs[0]], attributes={"to": F32}, num_outputs=1)
    chosen = ir.node("Where", [switch, back.outputs[0], value], num_outputs=1)
    for node, suffix in ((low, "low"), (back, "back"), (chosen, "chosen")):
        node.outputs[0].name = names(f"{value.name}::round::{suffix}")
    low.outputs[0].dtype = dtype
    back.outputs[0].dtype = chosen.outputs[0].dtype = F32
    back.outputs[0].shape = chosen.outputs[0].shape = value.shape
    if value.producer() is not None:
        graph.insert_after(value.producer(), [low, back, chosen])
    else:  # a graph input
        graph.insert_before(next(iter(graph)), [low, back, chosen])
    for user, index in uses:
        user.replace_input_with(index, chosen.outputs[0])
    if value.is_graph_output():
        graph.outputs[graph.outputs.index(value)] = chosen.outputs[0]
        original = value.name
        value.name = names(f"{original}::exact")
        chosen.outputs[0].name = original
