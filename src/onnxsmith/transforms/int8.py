"""``int8``: Linear layers in int8 for onnxruntime's CPU provider, where measurement says they can be.

Every MatMul/Gemm by a constant weight is a candidate. Each becomes com.microsoft
DynamicQuantizeMatMul (int8 weight per output column, activation quantized per tensor at
run time; passes/quantize_linears.py) or stays fp32, decided from measurements on the
calibration inputs (analysis/int8_measure.py), never from op types:

1. **Cost**: a Linear that multiplies one vector per sample (a CLS readout, a classifier
   head) stays fp32: int8 saves nothing there.
2. **Per-layer error**: the int8 form beside the fp32 one on the same input, error per
   output channel; unsmoothed and SmoothQuant-smoothed with each candidate alpha (the
   per-channel input maxima measured first). Smoothing is kept where it cuts the error by
   ``--smooth-gain`` (an input with outlier channels); a Linear whose best error is over
   ``--max-layer-error`` stays fp32.
3. **End-to-end sensitivity**: each remaining Linear switched to int8 alone, the outputs'
   relative error measured; Linears go int8 from the best FLOPs-per-error up while the
   errors' root sum of squares stays within ``--error-budget``; the chosen set is then
   measured together and trimmed (most sensitive first) until it is within the budget.

The variant is verified against the source: every output's cosine >= ``--min-cosine`` and no
new NaN/inf (a recipe's task gates — faceage |Δage|, lm KL/top-1 — apply on top in build).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import LiftConstantsToInitializersPass, RemoveUnusedNodesPass

from onnxsmith.core.errors import InputError
from onnxsmith.core.options import to_json
from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.passes.quantize_linears import LinearPlan, QuantizeLinearsPass, find_linears, smoothing_factors
from onnxsmith.runtime.int8_measure import InputStats, SensitivityProbe, measure_inputs, measure_layer_errors

#: Smoothing strengths tried per Linear (None: unsmoothed).
ALPHAS: tuple[float | None, ...] = (None, 0.5, 0.75, 0.9)
#: int8 GEMM speed-up over fp32 measured for transformer shapes on AVX-512 VNNI/AMX (docs/int8.md).
KERNEL_SPEEDUP = 4.0
#: Linears smaller than this on either side stay fp32 (nothing to gain).
MIN_SIDE = 16


@dataclass
class Options:
    error_budget: float = field(
        default=0.03,
        metadata={
            "help": "relative output error (||Δ|| / ||source||, worst output) the int8 Linears may cause together "
            "on the calibration inputs; the most sensitive Linears stay fp32 to meet it"
        },
    )
    max_layer_error: float = field(
        default=0.1,
        metadata={"help": "a Linear whose own int8 error (per output channel, RMS) is above this stays fp32"},
    )
    smooth_gain: float = field(
        default=0.25,
        metadata={"help": "smooth a Linear's input (SmoothQuant) when that cuts its measured error by this share"},
    )
    sensitivity: bool = field(
        default=True,
        metadata={"help": "measure each Linear's end-to-end effect and keep the most sensitive fp32 (--error-budget)"},
    )
    min_cosine: float = field(
        default=0.995, metadata={"help": "the gate: every output's cosine to the source's at least this"}
    )

    def validate(self) -> None:
        if not self.error_budget > 0:
            raise ValueError(f"error_budget must be positive, not {self.error_budget}")
        if not 0 < self.min_cosine <= 1:
            raise ValueError(f"min_cosine must be in (0, 1], not {self.min_cosine}")
        if not 0 <= self.smooth_gain < 1:
            raise ValueError(f"smooth_gain must be in [0, 1), not {self.smooth_gain}")


@dataclass
class Decision:
    """What happened to one Linear, and the measurements that decided it."""

    name: str
    k: int
    n: int
    rows: int  # vectors multiplied per run on the calibration input
    outlier_ratio: float  # max / median of the input's per-channel max |x|
    errors: dict = field(default_factory=dict)  # alpha -> measured per-layer error
    alpha: float | None = None
    sensitivity: float | None = None
    int8: bool = False
    reason: str = ""
    kind: str = ""  # the reason's kind, for the summary line

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.k * self.n

    @property
    def error(self) -> float | None:
        return self.errors.get(self.alpha)

    def row(self) -> dict:
        return {
            "linear": self.name,
            "K x N": f"{self.k}x{self.n}",
            "rows": self.rows,
            "input outlier ratio": round(self.outlier_ratio, 1),
            "layer error": "-" if self.error is None else f"{self.error:.4f}",
            "smoothing": "-" if self.alpha is None else f"alpha {self.alpha:g}",
            "sensitivity": "-" if self.sensitivity is None else f"{self.sensitivity:.2e}",
            "int8": "yes" if self.int8 else "no",
            "why": self.reason,
        }


@register
class Int8(Transform):
    name = "int8"
    summary = "Linear layers int8 (DynamicQuantizeMatMul) where measured error allows, for onnxruntime on CPU"
    Options = Options

    gate_task = "generic"  # every output's cosine to the source, no new NaN/inf (tasks/generic.py)

    def gate_settings(self, options: Options) -> dict:
        return {"min_cosine": options.min_cosine}

    def apply(self, model: ir.Model, options: Options, context: TransformContext) -> StepReport:
        report = StepReport(self.name, to_json(options))
        lifted = LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=MIN_SIDE * MIN_SIDE)(model)
        if lifted.modified:  # measure what is converted: Constant-node weights now are initializers
            context.model_is_source = False
        linears = find_linears(model)
        if not linears:
            raise InputError(
                "has no MatMul or Gemm by a constant fp32 weight: nothing to make int8", context.source_path
            )
        batch = _batch(context.feeds[0])
        decisions: dict[str, Decision] = {}
        with context.model_file(model) as path:
            context.progress(f"int8: measuring the inputs of {len(linears)} Linears")
            stats = measure_inputs(path, context.feeds)
            for linear in linears:
                k, n = linear.kn()
                s = stats.get(linear.name)
                d = Decision(linear.name, k, n, s.rows if s else 0, _outlier_ratio(s))
                decisions[linear.name] = d
                if s is None:
                    d.reason = "input not measured (no shape)"
                elif min(k, n) < MIN_SIDE:
                    d.reason, d.kind = f"too small ({k}x{n})", "too small"
                elif s.rows <= batch:
                    d.reason, d.kind = "one vector per sample: int8 saves nothing", "one vector per sample"
            candidates = {name for name, d in decisions.items() if not d.reason}
            context.progress(f"int8: measuring int8 error of {len(candidates)} Linears ({len(ALPHAS)} forms each)")
            errors = measure_layer_errors(path, context.feeds, stats, ALPHAS, candidates)
            plans: dict[str, np.ndarray | None] = {}
            weights = {linear.name: linear for linear in linears}
            for name in sorted(candidates, key=list(decisions).index):
                d = decisions[name]
                d.errors = errors.get(name, {})
                if not d.errors:
                    d.reason = "error not measured"
                    continue
                d.alpha = _choose_alpha(d.errors, options.smooth_gain)
                if d.error > options.max_layer_error or not np.isfinite(d.error):
                    d.reason = f"layer error {d.error:.3f} > {options.max_layer_error:g} (input outlier ratio {d.outlier_ratio:.1f})"
                    d.kind = "layer error"
                    continue
                plans[name] = (
                    None
                    if d.alpha is None
                    else smoothing_factors(stats[name].channel_absmax, weights[name].weight_array(), d.alpha)
                )
            chosen = set(plans)
            if options.sensitivity and plans:
                chosen = _choose_by_sensitivity(path, context, plans, decisions, options.error_budget, report)
        for name in chosen:
            decisions[name].int8 = True
            if not decisions[name].reason:
                decisions[name].reason = "measured within budget" if options.sensitivity else "layer error within bound"
        plan = {name: LinearPlan(plans[name]) for name in chosen}
        context.progress(f"int8: rewriting {len(plan)} Linears")
        QuantizeLinearsPass(plan)(model)
        RemoveUnusedNodesPass()(model)
        _report(report, list(decisions.values()), options)
        return report


def _batch(feeds: dict[str, np.ndarray]) -> int:
    """Vectors per sample: the leading dim of the first input (1 for a scalar)."""
    first = next(iter(feeds.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


def _outlier_ratio(stats: InputStats | None) -> float:
    if stats is None or not stats.channel_absmax.size:
        return 0.0
    median = float(np.median(stats.channel_absmax))
    peak = float(stats.channel_absmax.max())
    return peak / median if median > 0 else (float("inf") if peak > 0 else 1.0)


def _choose_alpha(errors: dict, gain: float) -> float | None:
    """The smoothing with the lowest error when it beats none by ``gain``; else none (a Mul costs time)."""
    plain = errors.get(None, float("inf"))
    best = min(errors, key=lambda a: (errors[a], a is not None, a or 0.0))
    return best if best is not None and errors[best] < (1.0 - gain) * plain else None


def _choose_by_sensitivity(path, context, plans, decisions, budget: float, report: StepReport) -> set[str]:
    """Each Linear alone in int8 -> its output error; the most FLOPs per error first while within budget."""
    context.progress(f"int8: building a probe with {len(plans)} switchable Linears")
    probe = SensitivityProbe(path, context.feeds, plans)
    try:
        names = sorted(plans, key=list(decisions).index)
        for i, name in enumerate(names):
            context.progress(f"int8: end-to-end sensitivity {i + 1}/{len(names)}")
            decisions[name].sensitivity = probe.error({name})
        order = sorted(
            names, key=lambda n: (-decisions[n].flops / max(decisions[n].sensitivity, 1e-12) ** 2, names.index(n))
        )
        chosen, total = [], 0.0
        for name in order:
            s2 = decisions[name].sensitivity ** 2
            if not np.isfinite(s2) or total + s2 > budget**2:
                d = decisions[name]
                d.reason = f"end-to-end sensitivity {d.sensitivity:.2e}: over the error budget {budget:g}"
                d.kind = "end-to-end sensitivity"
                continue
            chosen.append(name)
            total += s2
        measured = probe.error(set(chosen)) if chosen else 0.0
        trims = 0
        while chosen and measured > budget:
            # Trim the most sensitive tenth, then measure again.
            chosen.sort(key=lambda n: decisions[n].sensitivity)
            for name in chosen[-max(1, len(chosen) // 10) :]:
                d = decisions[name]
                d.reason = f"end-to-end sensitivity {d.sensitivity:.2e}: trimmed, together over budget"
                d.kind = "end-to-end sensitivity"
            chosen = chosen[: -max(1, len(chosen) // 10)]
            measured = probe.error(set(chosen)) if chosen else 0.0
            trims += 1
        report.stats["measured_output_error"] = measured
        report.notes.append(
            f"end to end on the calibration inputs: relative output error {measured:.2e} with the chosen int8 Linears "
            f"(budget {budget:g}; predicted {np.sqrt(total):.2e}{f', {trims} trim(s)' if trims else ''})"
        )
        return set(chosen)
    finally:
        probe.close()


def _report(report: StepReport, decisions: list[Decision], options: Options) -> None:
    int8 = [d for d in decisions if d.int8]
    flops = sum(d.flops for d in decisions) or 1
    share = sum(d.flops for d in int8) / flops
    smoothed = [d for d in int8 if d.alpha is not None]
    expected = 1.0 / ((1.0 - share) + share / KERNEL_SPEEDUP)
    kept: dict[str, int] = {}
    for d in decisions:
        if not d.int8:
            kept[d.kind or d.reason] = kept.get(d.kind or d.reason, 0) + 1
    report.notes.insert(
        0,
        f"{len(int8)} of {len(decisions)} Linears int8 (DynamicQuantizeMatMul: int8 weights per output column, "
        f"activations per tensor at run time), {share:.0%} of the Linears' multiply-adds"
        + (f"; {len(smoothed)} with smoothed inputs" if smoothed else "")
        + (f"; fp32: {', '.join(f'{n} ({k})' for k, n in sorted(kept.items()))}" if kept else ""),
    )
    report.notes.append(
        f"expected speed-up if the Linears dominate the run time: {expected:.2f}x "
        f"({share:.0%} of their work at the ~{KERNEL_SPEEDUP:g}x of the int8 kernel)"
    )
    report.why_not_more += [f"{n} Linear(s) stay fp32: {kind}" for kind, n in sorted(kept.items())]
    report.tables["Linears"] = [d.row() for d in decisions]
    report.stats["before_after"] = {
        "Linears in int8": (0, len(int8)),
        "Linears in fp32": (len(decisions), len(decisions) - len(int8)),
    }
    report.stats["int8_flops_share"] = share
    report.stats["expected_speedup"] = expected
