"""After the gate refused a candidate: which converted tensors to keep fp32, measured (bounded work).

The precision engine decides from ranges (what overflows, what underflows) and from op
policy; it does not predict how much a model amplifies ordinary rounding. Some models
amplify it far beyond the gate's bounds: a dynamically quantised int8 model re-rounds every
activation to 8 bits at run time (DynamicQuantizeLinear), so fp16 rounding upstream of it
flips about one int8 rounding in ten and the outputs move by int8 noise, not fp16 noise;
a saturated sigmoid turns an absolute error of its logits into a relative one.

So when the gate refuses an fp16 candidate, :func:`choose_exact` attributes the error to
the tensors the conversion made low, by measurement: the tensors (in graph order) are split
into at most :data:`MAX_GROUPS` contiguous groups; a probe (:mod:`onnxsmith.probes.rounding`)
measures the gate's severity (how far outside its bounds, 1 = at the bound) with every group
rounded, then with each group alone; the groups are kept exact in decreasing order of their
own severity, and a binary search finds the fewest that bring the rest within
:data:`TARGET` of the bound. At most 1 + MAX_GROUPS + log2(MAX_GROUPS) runs (21). The
engine then converts again with those tensors fp32 and the gate judges the new candidate
as it judges any. What was kept, and why, goes in the report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxsmith.core.transform import Judge
from onnxsmith.io.load import load_model, release_weights
from onnxsmith.irutil.types import infer_types
from onnxsmith.probes.rounding import RoundingProbe

#: At most this many groups are measured one by one (the work is bounded by it).
MAX_GROUPS = 16
#: The tensors left low must measure within this share of the gate's bounds: the probe rounds what
#: the candidate stores (Constant nodes' weights included) but not its initializers, so the choice
#: keeps a margin for them.
TARGET = 0.5


@dataclass
class Choice:
    """What the measurement chose: the groups kept exact and the severities measured."""

    groups: list[list[str]]
    kept: list[int] = field(default_factory=list)  # group indices, in the order they were chosen
    before: float = 0.0  # severity with every group rounded
    after: float = 0.0  # with the kept groups exact
    solo: dict[int, float] = field(default_factory=dict)  # group -> severity with only it rounded
    runs: int = 0
    #: only every group kept exact measures within the target: nothing is kept (the refusal stands)
    everything: bool = False

    @property
    def tensors(self) -> list[str]:
        return [name for g in sorted(self.kept) for name in self.groups[g]]

    @property
    def repaired(self) -> bool:
        return bool(self.kept) and self.after <= TARGET


def split(tensors: Sequence[str], groups: int = MAX_GROUPS) -> list[list[str]]:
    """``tensors`` (in graph order) in at most ``groups`` contiguous groups of near-equal size."""
    n = min(groups, len(tensors))
    return [list(tensors[i * len(tensors) // n : (i + 1) * len(tensors) // n]) for i in range(n)]


def choose_exact(groups: list[list[str]], severity: Callable[[set[int]], float]) -> Choice:
    """The fewest groups to keep exact so that rounding the others measures within :data:`TARGET`.

    ``severity(rounded)``: the gate's severity of the outputs with the groups ``rounded`` rounded
    and the rest exact (inf for NaN/inf). Nothing is kept when rounding every group is within
    the bounds already (the refusal then came from elsewhere: the weights, other inputs), nor
    when only keeping every group exact would do (that is the source again, not an fp16 variant).
    """
    choice = Choice(groups)
    everything = set(range(len(groups)))

    def measure(rounded: set[int]) -> float:
        choice.runs += 1
        return severity(rounded)

    choice.before = choice.after = measure(everything)
    if choice.before <= 1 or not groups:
        return choice
    choice.solo = {g: measure({g}) for g in sorted(everything)}
    order = sorted(everything, key=lambda g: (-choice.solo[g], g))
    measured = {len(order): 0.0}  # every group exact: the measured model itself
    low, high = 1, len(order)
    while low < high:
        middle = (low + high) // 2
        measured[middle] = measure(everything - set(order[:middle]))
        if measured[middle] <= TARGET:
            high = middle
        else:
            low = middle + 1
    if low == len(order):  # the model converted back to what it was: not a variant worth making
        choice.everything = True
        return choice
    if low not in measured:
        measured[low] = measure(everything - set(order[:low]))
    choice.kept = order[:low]
    choice.after = measured[low]
    return choice


def describe(choice: Choice, total: int) -> str:
    """One line for the report: what was kept fp32 after verification, and why."""
    kept = len(choice.tensors)
    return (
        f"kept fp32 after verification: {kept} of {total} tensors the conversion made low "
        f"({len(choice.kept)} of {len(choice.groups)} groups in graph order), because rounding them moved the "
        f"outputs beyond the gate: {choice.before:.3g}x its bound with every tensor rounded, {choice.after:.2g}x "
        f"with these exact ({choice.runs} measured runs)"
    )


@dataclass
class Repair:
    """What :func:`keep_exact` measured and decided."""

    choice: Choice
    low: int  # tensors the first conversion made low
    keep_fp32: dict[str, str]  # tensor -> why (for the conversion)

    def lines(self) -> list[str]:
        choice = self.choice
        if choice.kept:
            return [describe(choice, self.low)]
        found = (
            f"only keeping all {self.low} of them fp32 meets it"
            if choice.everything
            else f"rounding them measured {choice.before:.3g}x its bound: the refusal comes from elsewhere"
        )
        return [
            f"the gate refused the first candidate; measured on the {self.low} tensors it made low "
            f"({choice.runs} runs), {found}: nothing kept fp32 for it"
        ]


def keep_exact(
    path: Path, feeds: list[dict[str, np.ndarray]], dtype: ir.DataType, judge: Judge, convert_copy
) -> Repair:
    """Which tensors to keep fp32 so that the conversion passes the gate, measured on the model at ``path``.

    ``convert_copy(model)`` converts a fresh copy of that model as the engine is about to convert
    it (the tensors it makes low are the ones probed); ``judge``: the gate that refused it.
    """
    low = _made_low(path, dtype, convert_copy)
    groups = split(low)
    probe = RoundingProbe(path, feeds, groups, dtype)
    try:
        reference = probe.run(set())
        choice = choose_exact(groups, lambda rounded: judge(reference, probe.run(rounded)))
    finally:
        probe.close()
    reason = (
        f"kept fp32 after verification: rounding it (with the {len(choice.tensors) - 1} others kept) moved the "
        f"outputs to {choice.before:.3g}x the gate's bound"
    )
    return Repair(choice, len(low), {name: reason for name in choice.tensors})


def _made_low(path: Path, dtype: ir.DataType, convert_copy) -> list[str]:
    """The fp32 tensors of the model at ``path`` (main graph, in graph order) that ``convert_copy`` rounds to
    ``dtype``: those it stores low, and those it keeps but casts for a reader that computes low."""
    copy = load_model(path)
    try:
        infer_types(copy)
        graph = copy.graph
        exact = {v.name for v in graph.inputs if v.dtype == ir.DataType.FLOAT}
        exact |= {v.name for node in graph for v in node.outputs if v.name and v.dtype == ir.DataType.FLOAT}
        convert_copy(copy)
        found: dict[str, None] = {v.name: None for v in graph.inputs if v.name in exact and _read_low(v, dtype)}
        for node in graph:
            for value in node.outputs:
                if value.name in exact and (value.dtype == dtype or _read_low(value, dtype)):
                    found[value.name] = None
        return list(found)
    finally:
        release_weights(copy)


def _read_low(value: ir.Value, dtype: ir.DataType) -> bool:
    """Whether an fp32 value is cast to ``dtype`` for a reader (an island's border)."""
    return any(user.op_type == "Cast" and user.outputs[0].dtype == dtype for user, _ in value.uses())
