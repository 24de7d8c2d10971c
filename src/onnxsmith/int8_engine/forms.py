"""How each int8 Linear may be made, measured: plain, smoothed per alpha, outlier channels apart, and its weights' error-compensated rounding."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from onnxsmith.int8_engine.measure import measure_layer_errors
from onnxsmith.int8_engine.parts import (
    ALPHAS,
    COMPENSATION_ROWS,
    OUTLIERS,
    WIDE,
    WIDE_GAIN,
    WIDE_PREFERRED,
    Part,
    Parts,
    replaced,
)
from onnxsmith.int8_engine.statistics import announced, input_grams
from onnxsmith.passes import quantization as qz
from onnxsmith.passes.quantize_linears import (
    LinearPlan,
    by_input,
    outlier_channels,
    rounding_key,
    smoothing_factors,
    smoothing_folds,
)


def folding_linears(candidates) -> set[str]:
    """The candidates whose input's smoothing folds into a LayerNorm when every candidate reading it goes int8."""
    return {
        r.name
        for x, readers in by_input(candidates).items()
        if smoothing_folds(x, [r.node for r in readers])
        for r in readers
    }


def offer_forms(
    path, context, candidates, shared: set, stats, parts: Parts, gain: float, two_pass: bool = False
) -> tuple[dict, dict[str, Part]]:
    """(per candidate: form label -> :class:`LinearPlan`, the parts with what was measured of the forms).

    The forms: plain (int8 weights within pairs), its weights in all 8 bits (WIDE: where the weights' half bit is
    most of the error, at the cost of a slower kernel), smoothed per alpha, and where the input has outlier
    channels, those apart. Measured: the per-layer ``errors``, the ``outliers``, the form ``offered`` (the one that
    cuts the input's Linears' mean error most, if by ``gain``; WIDE if it cuts it by WIDE_GAIN and nearly as much)
    and ``offered_smoothing`` (the same among the smoothing alphas). With ``two_pass`` activations (measured so):
    plain and WIDE only (they leave almost no activation rounding error for other forms to trade away); the
    readers of a weight in ``shared`` (:func:`shared_weights`: its one int8 copy cannot change for one input)
    plain only."""
    forms: dict[str, dict] = {}
    outliers_of: dict[str, tuple[int, ...]] = {}
    for readers in by_input(candidates).values():
        weights = [r.weight_array() for r in readers]
        absmax = stats[readers[0].name].channel_absmax
        per_input: dict = {None: LinearPlan()}
        one_copy = any(r.weight in shared for r in readers)
        if not one_copy:
            per_input[WIDE] = LinearPlan(wide=True)
        if one_copy or two_pass:
            for r in readers:
                forms[r.name] = per_input
            continue
        per_input.update({a: LinearPlan(smoothing_factors(absmax, weights, a)) for a in ALPHAS})
        # Outliers apart where their fp32 product is small next to the input it reads: an output projection's
        # [rows, N] with N <= K. (The product and its Add are two passes over [rows, N]: on MiniLM's FFN input
        # projection, N = 4 K, they measured as slow as the int8 product itself.)
        outliers = outlier_channels(absmax) if all(r.kn()[1] <= r.kn()[0] for r in readers) else ()
        if outliers:
            per_input[OUTLIERS] = LinearPlan(outliers=outliers)
        for r in readers:
            forms[r.name] = per_input
            outliers_of[r.name] = outliers
    if not forms:
        return forms, dict(parts)
    context.progress(f"int8: measuring the int8 error of {len(forms)} Linears (plain, 8-bit weights, smoothed, ...)")
    errors = measure_layer_errors(path, context.feeds, forms, two_pass)
    changed: dict[str, Part] = {}
    for readers in by_input(candidates).values():
        measured = {r.name: errors.get(r.name, {}) for r in readers}
        labels = [label for label in forms[readers[0].name] if label is not None]
        offered = smoothing = None
        if labels:
            mean = {a: np.mean([measured[r.name].get(a, np.inf) for r in readers]) for a in (None, *labels)}
            others = [a for a in labels if a != WIDE and mean[a] < (1.0 - gain) * mean[None]]
            best = min(others, key=lambda a: (mean[a], str(a)), default=None)
            # 8-bit weights where they cut the error by WIDE_GAIN and nearly as much as the best other form: they
            # cost no Mul and fit nothing to the calibration inputs (smoothing factors fitted to made-up inputs
            # measured well on them and put fsmn-vad's decisions at 59 % on speech-level ones)
            wide = WIDE in mean and mean[WIDE] < (1.0 - WIDE_GAIN) * mean[None]
            offered = WIDE if wide and (best is None or mean[WIDE] <= WIDE_PREFERRED * mean[best]) else best
            alphas = [a for a in ALPHAS if a in mean]
            if alphas:
                alpha = min(alphas, key=lambda a: (mean[a], a))
                smoothing = alpha if mean[alpha] < (1.0 - gain) * mean[None] else None
        for r in readers:
            changed[r.name] = parts[r.name].measured(
                errors=MappingProxyType(dict(measured[r.name])),
                outliers=outliers_of.get(r.name, ()),
                offered=offered,
                offered_smoothing=smoothing,
            )
    return forms, replaced(parts, changed)


def with_few_rows(parts: Parts, candidates, samples: int) -> dict[str, Part]:
    """The parts with each candidate's ``few_rows``: calibrated on fewer rows than :data:`COMPENSATION_ROWS` of
    its input width, so its rounding is not compensated."""
    # Too few calibration rows for the width of an input leave most directions of XᵀX unseen: compensation puts
    # the rounding error there, and other inputs meet it (a T5 encoder calibrated on 8 tokens, K 256-1024:
    # cosine 0.96 on 16 other tokens, 1.0 rounded to nearest). Those Linears are rounded to nearest.
    changed = {}
    for linear in candidates:
        part = parts[linear.name]
        changed[linear.name] = part.measured(few_rows=part.facts.rows * samples < COMPENSATION_ROWS * linear.kn()[0])
    return replaced(parts, changed)


def compensated_weights(path, context, candidates, shared: set, forms, parts: Parts) -> dict:
    """Error-compensated int8 weights of every candidate, for each form it may take (plain, and the forms
    offered), by :func:`rounding_key`: from the Gram matrix of its input on the calibration inputs (as the
    form prepares it: channels divided by the smoothing, outlier channels zero), factored once per input and
    form (the Linears reading an input share its forms); a weight in ``shared`` once, for all its readers;
    none for those with ``few_rows`` (:func:`with_few_rows`)."""
    few = {linear.weight for linear in candidates if parts[linear.name].facts.few_rows}
    by_name = {linear.name: linear for linear in candidates if linear.weight not in few}
    shared_grams: dict = {}  # a weight several inputs' Linears read -> the sum of their inputs' XᵀX
    rounded = {}
    if not by_name:
        return rounded
    shards = announced(
        context.progress, f"int8: error-compensated rounding of {len(by_name)} Linears (XᵀX of their inputs)"
    )
    for readers, gram in input_grams(path, context.feeds, set(by_name), engine=context.engine, progress=shards):
        factors: dict = {}  # input key -> compensation factor of this input as a form prepares it
        for name in readers:
            linear, facts = by_name[name], parts[name].facts
            if linear.weight in shared:
                shared_grams[linear.weight] = shared_grams.get(linear.weight, 0) + gram
                continue
            w = linear.weight_array()
            for label in {None, facts.offered, facts.offered_smoothing}:
                plan = forms[name].get(label)
                if plan is None:
                    continue
                prepared = plan.input_key()
                if prepared not in factors:
                    scaling = plan.input_factor(linear.kn()[0])
                    factors[prepared] = qz.compensation_factor(
                        gram if scaling is None else gram * np.outer(scaling, scaling)
                    )
                rounded[rounding_key(name, plan)] = qz.quantize_columns_compensated(
                    plan.int8_weight(w), factors[prepared], pairs=not plan.wide
                )
    # One rounding for every reader of a shared weight (the same array: stored once), compensated for all their
    # inputs together: what it minimises is the sum of their errors.
    for weight, gram in shared_grams.items():
        readers = [linear for linear in by_name.values() if linear.weight is weight]
        q = qz.quantize_columns_compensated(readers[0].weight_array(), qz.compensation_factor(gram))
        for linear in readers:
            rounded[rounding_key(linear.name, forms[linear.name][None])] = q
    return rounded
