"""The int8 policy: which Linears and tables go int8, decided from measured end-to-end errors.

What is measured (int8/measure.py) is the model's output error with a *set* of
candidates in int8; each measurement is a run of the calibration inputs. Measuring every
candidate alone (a ViT-L has 147 Linears) costs too much, and the sum of per-layer errors
does not predict the outputs' error (an attention projection's error is amplified by the
softmax after it). So the search measures where the decisions are made:

1. Everything int8 at once. Within the budget: done (MiniLM: one run).
2. Otherwise each *role* alone: candidates that play the same part in repeated blocks
   (:func:`role`: what their input comes from, what their output goes into, their shape —
   the query projections of all 24 blocks are one role). Then, while runs are left, the
   most valuable role that does not fit is split in two halves by depth and each half
   measured: sensitive layers are found where it matters, in a logarithmic number of runs.
3. Pieces go int8 from the most multiply-adds per error energy up while the errors'
   energies (squares, independent errors add so) sum within the budget; the chosen set is
   measured together and trimmed (the tables last) until it is within the budget, then pieces left out are
   tried one at a time while runs are left (the sum over-estimates when errors cancel).

The roles only group what is measured; every decision is a measured error.

Then speed (:func:`keep_fast`): the chosen variant is timed against fp32 on the calibration
inputs; where it is not clearly faster, the groups of int8 parts (the Convs, the Linears of one
role, the tables) that cost as much time as they save are found by timing and kept fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir

#: Ops a role walks through: they move data, or scale it by a constant.
_THROUGH = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "Split", "Slice", "Expand"}
)
_SCALING = frozenset({"Mul", "Div"})


def _passes_through(node: ir.Node) -> bool:
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in _THROUGH:
        return True
    # x * constant (a layer scale, attention's 1/sqrt(d)): the same role
    return node.op_type in _SCALING and sum(v is not None and v.const_value is None for v in node.inputs) == 1


def _source(value: ir.Value, depth: int = 0) -> str:
    """The op that computes ``value``, looking through data movement and constant scaling."""
    node = value.producer()
    if node is None:
        return "input" if value.const_value is None else "constant"
    if depth < 8 and _passes_through(node):
        live = [v for v in node.inputs if v is not None and v.const_value is None]
        if live:
            return _source(live[0], depth + 1)
    return node.op_type


def _consumers(value: ir.Value, depth: int = 0) -> list[str]:
    """Where ``value`` goes: each consumer as ``Op:index``, a MatMul with what its other operand comes from."""
    found = []
    for user, index in value.uses():
        if depth < 8 and _passes_through(user):
            for out in user.outputs:
                found.extend(_consumers(out, depth + 1))
            continue
        label = f"{user.op_type}:{index}"
        if user.op_type == "MatMul" and len(user.inputs) == 2 and user.inputs[1 - index] is not None:
            label += f"({_source(user.inputs[1 - index])})"
        found.append(label)
    if value.is_graph_output():
        found.append("output")
    return sorted(set(found))


def role(x: ir.Value, y: ir.Value, shape: tuple[int, ...]) -> str:
    """The part a Linear ``x -> y`` plays: where ``x`` comes from, where ``y`` goes, its shape."""
    return f"{_source(x)} -> {'|'.join(_consumers(y))} {'x'.join(map(str, shape))}"


def roles(linears: list[tuple[str, ir.Value, ir.Value, tuple[int, ...]]]) -> dict[str, str]:
    """Name -> :func:`role` for Linears ``(name, x, y, shape)`` in graph order. Linears of one input
    with the same role (a rotary query and key projection) are told apart by their order."""
    found = {name: role(x, y, shape) for name, x, y, shape in linears}
    seen: dict[tuple, int] = {}
    alike = {}
    for name, x, _, _ in linears:
        alike[name] = seen.get((x, found[name]), 0)
        seen[(x, found[name])] = alike[name] + 1
    return {
        name: found[name] + (f" #{alike[name] + 1}" if seen[(x, found[name])] > 1 else "") for name, x, _, _ in linears
    }


@dataclass
class Piece:
    """Candidates measured together: their output error in int8 alone, and their value."""

    names: tuple[str, ...]
    label: str
    error: float
    value: float  # multiply-adds moved to int8 (tables: bytes saved)
    first: bool = False  # taken before any Linear (the tables: size, not speed)

    @property
    def energy(self) -> float:
        return self.error**2


@dataclass
class Selection:
    chosen: set[str]
    measured: float  # the chosen set's output error, measured
    pieces: list[Piece]  # the finest pieces measured (each candidate is in one)
    runs: int
    steps: list[str] = field(default_factory=list)  # what the search did, for the report

    def piece_of(self, name: str) -> Piece | None:
        return next((p for p in self.pieces if name in p.names), None)


def search(
    groups: list[tuple[str, list[str]]],
    value: dict[str, float],
    error: Callable[[set[str]], float],
    budget: float,
    max_runs: int,
    first: set[str] = frozenset(),
    everything: float | None = None,
) -> Selection:
    """Choose candidates (``value``: name -> what int8 gains) within ``budget`` of output error; see the module doc.

    ``groups``: (label, names in graph order) — the roles; ``error``: one measured run;
    ``first``: names taken before the Linears (tables), when they fit; ``everything``: the
    error of all of them together if it was measured already.
    """
    runs = 0

    def measure(names) -> float:
        nonlocal runs
        runs += 1
        return error(set(names))

    every = {n for _, names in groups for n in names}
    total = measure(every) if everything is None else everything
    if total <= budget:
        return Selection(every, total, [], runs, [f"all {len(every)} int8 together: {total:.2e}"])
    steps = [f"all {len(every)} int8 together: {total:.2e} > budget {budget:g}"]

    def piece(label: str, names) -> Piece:
        names = tuple(names)
        return Piece(names, label, measure(names), sum(value[n] for n in names), bool(set(names) & first))

    pieces = [piece(label, names) for label, names in groups]
    reserve = 3  # runs kept for confirming and trimming
    while True:
        chosen = _greedy(pieces, budget)
        left_out = [p for p in pieces if p not in chosen and len(p.names) > 1]
        if not left_out or runs + 2 > max_runs - reserve:
            break
        worst = max(left_out, key=lambda p: p.value)
        half = (len(worst.names) + 1) // 2
        i = pieces.index(worst)
        pieces[i : i + 1] = [
            piece(f"{worst.label} [{part}]", names)
            for part, names in (("first half", worst.names[:half]), ("second half", worst.names[half:]))
        ]
    chosen = _greedy(pieces, budget)
    names = {n for p in chosen for n in p.names}
    measured = measure(names) if names else 0.0
    while chosen and measured > budget:
        # the sum under-estimated: drop the piece with the most error per value, measure again
        # (the ``first`` ones last: their value is size, not multiply-adds, and not comparable)
        drop = max(chosen, key=lambda p: (not p.first, p.energy / max(p.value, 1e-30), p.error))
        chosen.remove(drop)
        steps.append(f"together {measured:.2e} > budget: left out {drop.label}")
        names = {n for p in chosen for n in p.names}
        measured = measure(names) if names else 0.0
    for candidate in sorted((p for p in pieces if p not in chosen), key=lambda p: -p.value / max(p.energy, 1e-30)):
        if runs >= max_runs:
            break
        trial = measure(names | set(candidate.names))
        if trial <= budget:
            chosen.append(candidate)
            names |= set(candidate.names)
            measured = trial
            steps.append(f"added {candidate.label}: together {trial:.2e}")
    return Selection(names, measured, pieces, runs, steps)


def _greedy(pieces: list[Piece], budget: float) -> list[Piece]:
    """Pieces in order of value per error energy (``first`` ones first) while their energies fit the budget."""
    order = sorted(pieces, key=lambda p: (not p.first, -p.value / max(p.energy, 1e-30)))
    chosen, spent = [], 0.0
    for p in order:
        if spent + p.energy <= budget**2:
            chosen.append(p)
            spent += p.energy
    return chosen


#: The chosen int8 variant measured at least this much faster than fp32 is kept as it is: below it, the groups
#: of int8 parts are timed (a variant within the timing noise of fp32 is checked, not trusted), and a group
#: is kept fp32 when the variant without it is faster by as much.
SPEED_MARGIN = 0.05


@dataclass
class SpeedCheck:
    """What timing the int8 variant against fp32 decided: the speed-up measured and what stays fp32 for speed."""

    speedup: float  # fp32 seconds / the final variant's, timed together
    first: float  # the same for the variant the error search chose, before any group was kept fp32
    kept: list[tuple[str, list[str], float]] = field(default_factory=list)  # (group, names, speed-up without it)
    runs: int = 0  # timing calls
    with_all: float = 0.0  # the chosen variant's speed-up in the call that timed the groups
    int8: set[str] = field(default_factory=set)  # what stays int8
    trimmed: bool = False  # whether the groups were timed (the variant was not faster, and trimming was asked for)

    @property
    def kept_names(self) -> set[str]:
        return {n for _, names, _ in self.kept for n in names}


def keep_fast(
    chosen: set[str],
    groups: list[tuple[str, list[str]]],
    timer: Callable[[list[set[str]]], tuple[float, list[float]]],
    margin: float = SPEED_MARGIN,
    trim: bool = True,
) -> SpeedCheck:
    """The int8 parts in ``chosen`` that do not make the variant faster, found by timing, to be kept fp32.

    ``groups``: (label, names): what is kept fp32 together (the Convs, the Linears of one role, the tables);
    ``timer(variants)``: (fp32 seconds, seconds of each variant: a set of names int8), timed together.

    1. The chosen variant against fp32: faster by ``margin``, it stays as it is (one call).
    2. Otherwise the variant without each group, timed beside the chosen variant: a group without which the
       variant is faster by ``margin`` is kept fp32 (it costs more than it saves; within the margin, timing noise
       would decide, and the same model would give different variants from run to run).
    3. What is left, timed against fp32 again: the speed-up measured.

    Without ``trim``: step 1 only (the speed-up measured, nothing kept fp32 for it: the variant does not depend
    on the machine's timing).
    """
    if not chosen:
        return SpeedCheck(1.0, 1.0)
    fp32, (seconds,) = timer([chosen])
    first = fp32 / seconds
    if first >= 1.0 + margin or not trim:
        return SpeedCheck(first, first, runs=1, int8=set(chosen))
    present = [(label, [n for n in names if n in chosen]) for label, names in groups]
    present = [(label, names) for label, names in present if names]
    fp32, (seconds, *without) = timer([chosen, *(chosen - set(names) for _, names in present)])
    kept = [(label, names, fp32 / t) for (label, names), t in zip(present, without) if t < (1.0 - margin) * seconds]
    check = SpeedCheck(fp32 / seconds, first, kept, runs=2, with_all=fp32 / seconds, trimmed=True)
    check.int8 = chosen - check.kept_names
    if kept:
        fp32, (seconds,) = timer([check.int8])
        check.speedup, check.runs = fp32 / seconds, 3
    return check
