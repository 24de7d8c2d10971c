"""What goes int8: the end-to-end search within the error budget, smoothing dropped where it is not needed, and the
parts kept fp32 for speed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxsmith.analysis.int8_policy import Selection, SpeedCheck, keep_fast, search
from onnxsmith.int8_engine.forms import folding_linears
from onnxsmith.int8_engine.measure import SensitivityProbe, unsmoothed_name
from onnxsmith.int8_engine.parts import OUTLIERS, WIDE, Part, Parts, replaced
from onnxsmith.passes.quantize_convs import ConvPlan
from onnxsmith.passes.quantize_linears import Int8Form, Linear, LinearPlan, by_input, smoothing_folds
from onnxsmith.passes.quantize_tables import Table
from onnxsmith.settings.int8 import Int8Options

#: The share of the gate's bounds a choice may use on the calibration inputs once the gate refused a variant:
#: the gate judges other inputs, where the worst element is elsewhere (PP-OCR's detector: a choice at 0.63 of
#: its per-element bound there came to 1.10 on the gate's inputs).
JUDGED_SHARE = 0.5


@dataclass(frozen=True)
class SearchSpace:
    """What the end-to-end search chooses from, as measured on the model at ``path``: the candidate
    Linears (with their int8 forms: smoothed per alpha, outliers apart), tables and Convs, and every part as
    measured and decided so far."""

    path: Path
    candidates: list[Linear]
    tables: dict[str, Table]
    conv_plans: dict[str, ConvPlan]
    forms: dict[str, dict]  # Linear -> form label -> LinearPlan
    parts: Parts
    form: Int8Form  # how the int8 Linears are made (rounded weights, two-pass activations)


def without_search(parts: Parts, candidates, options: Int8Options) -> tuple[set[str], dict[str, Part]]:
    """With ``--no-sensitivity``: (every candidate whose own int8 error is within ``--max-layer-error``, the parts
    saying so)."""
    chosen, changed = set(), {}
    for linear in candidates:
        part = parts[linear.name]
        error = part.facts.errors.get(None, float("inf"))
        if not error <= options.max_layer_error:
            changed[linear.name] = part.decided(
                reason=f"layer error {error:.3f} > {options.max_layer_error:g} "
                f"(input outlier ratio {part.facts.outlier_ratio:.1f})",
                kind="layer error",
            )
            continue
        changed[linear.name] = part.decided(reason="layer error within bound (no end-to-end search)")
        chosen.add(linear.name)
    return chosen, replaced(parts, changed)


def search_parts(space: SearchSpace, context, budget, options, report):
    """(the names int8, form per Linear not plain, the parts saying why) from end-to-end measurements."""
    path, candidates, tables, conv_plans = space.path, space.candidates, space.tables, space.conv_plans
    forms, parts = space.forms, space.parts
    # Smoothing that folds into a LayerNorm costs nothing at run time: used wherever it is offered. The other
    # forms offered (smoothing elsewhere, outlier channels apart: a Mul, and a Gather and MatMul) if need be.
    folding = folding_linears(candidates)
    free = {n: a for n in folding if (a := parts[n].facts.offered_smoothing) is not None}
    linears = {n: p for n, p in parts.items() if p.kind == "linear"}
    offered = {n: a for n, p in linears.items() if (a := p.facts.offered) is not None}  # includes the free ones
    names = [linear.name for linear in candidates]
    every = set(names) | set(tables) | set(conv_plans)

    def open_probe(used: dict) -> SensitivityProbe:
        plans = {n: (forms[n][used[n]] if n in used else LinearPlan()) for n in names}
        return SensitivityProbe(path, context.feeds, plans, set(tables), conv_plans, form=space.form)

    context.progress(
        f"int8: a probe with {len(names)} switchable Linears, {len(tables)} tables and {len(conv_plans)} Convs"
    )
    probe = open_probe(free)
    runs = 0  # of the probes closed before the search's
    try:
        used: dict[str, float | str] = dict(free)
        everything = None
        if free:
            report.notes.append(f"smoothing folded into LayerNorms (no run-time cost) for {len(free)} Linears")
        costly = [n for n in offered if offered[n] != free.get(n)]
        if costly:
            plain = everything = _measured(probe, every, context, budget)
            if plain > budget:
                # Smoothing that costs a Mul, where it was offered: measured in a second probe, kept if it helps.
                probe.close()
                runs += probe.runs
                probe = open_probe(offered)
                smoothed = _measured(probe, every, context, budget)
                report.notes.append(
                    f"another form offered for {len(costly)} more Linears (smoothing or outliers apart: a Mul each "
                    f"input; {WIDE}: a slower kernel): everything int8 {plain:.2e} without, {smoothed:.2e} with it"
                )
                if smoothed < plain:
                    used, everything = dict(offered), smoothed
                else:
                    probe.close()
                    runs += probe.runs
                    probe = open_probe(free)
        groups, value = _groups_and_values(space)

        def error(chosen: set[str]) -> float:
            context.progress(f"int8: end-to-end run {runs + probe.runs + 1}")
            return _measured(probe, chosen, context, budget)

        selection = search(
            list(groups.items()),
            value,
            error,
            budget,
            max(1, options.max_runs - runs - probe.runs),  # the smoothing trials count
            first=set(tables),
            everything=everything,
        )
    finally:
        probe.close()
        runs += probe.runs
    return _settled(space, context, budget, options, report, selection, used, runs)


def _groups_and_values(space: SearchSpace) -> tuple[dict[str, list[str]], dict[str, float]]:
    """The parts the search switches together (the tables; the Linears and Convs of each role) and what each part
    is worth int8 (its multiply-adds; a table's bytes saved)."""
    parts, tables = space.parts, space.tables
    names = [linear.name for linear in space.candidates]
    groups: dict[str, list[str]] = {}
    if tables:
        groups["embedding tables"] = list(tables)
    for n in [*names, *space.conv_plans]:
        groups.setdefault(parts[n].role, []).append(n)
    value = {n: float(parts[n].flops) for n in [*names, *space.conv_plans]}
    value.update({t: 0.75 * tables[t].value.const_value.nbytes for t in tables})
    return groups, value


def _settled(space: SearchSpace, context, budget, options, report, selection: Selection, used: dict, runs: int):
    """The search's result explained in each decision, smoothing dropped where the budget holds without it, and
    the end-to-end measurement in the report: (the names int8, form per Linear not plain, the parts)."""
    path, candidates, tables, conv_plans = space.path, space.candidates, space.tables, space.conv_plans
    forms = space.forms
    names = [linear.name for linear in candidates]
    explained = {n: p for n, p in space.parts.items() if p.kind == "linear" or n in conv_plans}
    parts = replaced(space.parts, _explain(selection, explained, budget))
    chosen = selection.chosen
    used = {n: a for n, a in used.items() if n in chosen}
    measured, steps = selection.measured, list(selection.steps)
    if used and runs < options.max_runs:
        plans = {n: (forms[n][used[n]] if n in used else LinearPlan()) for n in chosen & set(names)}
        probe = SensitivityProbe(
            path,
            context.feeds,
            plans,
            chosen & set(tables),
            {n: conv_plans[n] for n in chosen & set(conv_plans)},
            unsmoothed=set(used),
            form=space.form,
        )
        try:
            dropped, measured = _drop_smoothing(
                probe, context, candidates, chosen, used, parts, budget, options.max_runs - runs, measured
            )
        finally:
            probe.close()
            runs += probe.runs
        for label, n_names, error in dropped:
            steps.append(f"{label} dropped: {error:.2e}")
            for n in n_names:
                del used[n]
    report.notes.append(
        f"end to end on the calibration inputs: relative output error {measured:.2e} "
        f"(budget {budget:g}; {runs} run(s): {'; '.join(steps)})"
    )
    report.stats["measured_output_error"] = measured
    report.stats["end_to_end_runs"] = runs
    return set(chosen), used, parts


def _measured(probe: SensitivityProbe, int8: set[str], context, budget: float) -> float:
    """The outputs' relative error with ``int8`` switched on; told how the gate measures (``context.judge``: it
    refused the first variant), a choice using more than :data:`JUDGED_SHARE` of the gate's bounds counts as over
    ``budget`` by as much. Where a float output is one the gate judges for what it is (a detector's rows, a top-k,
    audio: ``context.structured_judge``), the error is that share of the gate's bounds, in the budget's units:
    rounding reorders near-tied rows, and row by row isbnx's YOLO measured 0.42-0.50 alone with every detection
    matched; lectura's HiFi-GAN's Convs, 0.022 and more alone by their samples, are judged by SNR and spectrum.
    Integer labels are counted so (the share that flip, of the share the gate allows), the floats beside them
    measured as before: taken for numbers, a flip between two class ids measured their distance."""
    structured = probe.structured(context.structured_judge)
    if context.judge is None and structured == "labels":  # the floats by their relative error, the labels counted
        error, severity = probe.judged(int8, context.structured_judge, labels_only=True)
        return max(error, budget * severity / JUDGED_SHARE)
    judge = context.judge or (context.structured_judge if structured else None)
    if judge is None:
        return probe.error(int8)
    error, severity = probe.judged(int8, judge)
    share = severity / JUDGED_SHARE
    if structured == "floats":
        return budget * share
    return error if share <= 1 else max(error, budget * share)


def _drop_smoothing(probe, context, candidates, chosen, used, parts: Parts, budget, runs_left, measured):
    """Smoothing that costs a Mul (its input is not a normalisation's output only the smoothed Linears read),
    outliers apart and 8-bit weights (a slower kernel), dropped where the outputs stay within ``budget``
    without, the least helpful first: one measured run per role of inputs (the query/key/value inputs of every block together). Returns ((label, Linears, error)
    for each drop, the final measured error)."""
    units: dict[tuple, list] = {}
    for x, readers in by_input(candidates).items():
        smoothed = [r for r in readers if r.name in used]
        # outliers apart (the Gather reads the input) and wide weights (a slower kernel) cost where nothing folds
        costs = any(used[r.name] in (OUTLIERS, WIDE) for r in smoothed)
        if not smoothed or (not costs and smoothing_folds(x, [r.node for r in readers if r.name in chosen])):
            continue
        key = tuple(sorted({parts[r.name].role.split(" #")[0] for r in smoothed}))
        units.setdefault(key, []).extend(smoothed)

    def kept_share(linears) -> float:
        shares = []
        for r in linears:
            errors = parts[r.name].facts.errors
            plain, smooth = errors.get(None), errors.get(used[r.name])
            shares.append(smooth / plain if plain and smooth is not None else 0.0)
        return float(np.mean(shares))

    dropped = []
    current = set(chosen)
    for key, linears in sorted(units.items(), key=lambda item: -kept_share(item[1])):
        if probe.runs >= runs_left:
            break
        context.progress(f"int8: without the smoothing of {len(linears)} Linears ({key[0]}, ...)")
        trial = current | {unsmoothed_name(r.name) for r in linears}
        error = _measured(probe, trial, context, budget)
        if error <= budget:
            current, measured = trial, error
            roles = key[0] + (f" and {len(key) - 1} more role(s)" if len(key) > 1 else "")
            what = WIDE if all(used[r.name] == WIDE for r in linears) else "smoothing"
            dropped.append((f"{what} of {len(linears)} Linears ({roles})", [r.name for r in linears], error))
    return dropped, measured


def _explain(selection: Selection, parts: Parts, budget: float) -> dict[str, Part]:
    """The candidates among ``parts`` with what the search measured of them and why it chose them or not."""
    explained = {}
    for name, part in parts.items():
        if not part.candidate:
            continue
        piece = selection.piece_of(name)
        measured = {} if piece is None else {"piece": piece.label, "piece_error": piece.error}
        if name in selection.chosen:
            reason = "measured within budget" if piece is None else f"its part measured {piece.error:.2e}, chosen"
            explained[name] = part.decided(reason=reason, **measured)
        else:
            reason = (
                f"{piece.label}: {piece.error:.2e} alone; with the rest over the budget {budget:g}"
                if piece is not None
                else f"over the budget {budget:g}"
            )
            explained[name] = part.decided(reason=reason, kind="end-to-end error", **measured)
    return explained


#: Seconds each timing of the variant against fp32 takes at most (beyond a few rounds, however long they take).
SPEED_SECONDS = 2.0


def check_speed(timer, context, chosen: set[str], parts: Parts, trim: bool) -> tuple[SpeedCheck, dict[str, Part]]:
    """Times the variant against the model given: (the check, the parts). With ``trim``, the groups of int8 parts
    (the tables, the Convs, the Linears of each role) that do not make it faster are kept fp32, and their parts'
    decisions say so."""
    groups = [
        ("the embedding tables", sorted(n for n in chosen if parts[n].kind == "table")),
        ("the Convs", [n for n, p in parts.items() if p.kind == "conv" and n in chosen]),
    ]
    by_role: dict[str, list[str]] = {}
    for name, part in parts.items():
        if part.kind == "linear" and name in chosen:
            by_role.setdefault(part.role, []).append(name)
    groups += [(f"the Linears {role}", names) for role, names in by_role.items()]
    context.progress("int8: timing the variant against the model given (onnxruntime CPU)")
    check = keep_fast(set(chosen), groups, timer, trim=trim)
    changed = {}
    for label, names, without in check.kept:
        reason = (
            f"kept fp32: not faster, measured {check.with_all:.2f}x the model given with {label} int8, "
            f"{without:.2f}x without"
        )
        for n in names:
            if parts[n].kind != "table":  # a table's row has no reason
                changed[n] = parts[n].decided(reason=reason, kind="not faster")
    return check, replaced(parts, changed)
