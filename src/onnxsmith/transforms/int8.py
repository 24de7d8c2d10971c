"""``int8``: Linear layers, embedding tables and Convs in int8 for onnxruntime's CPU provider, where measurement allows.

Every MatMul/Gemm by a constant weight is a candidate Linear; it becomes
DynamicQuantizeLinear + com.microsoft MatMulIntegerToFloat (int8 weight per output column,
activation quantized per tensor at run time; passes/quantize_linears.py) or stays fp32.
Every big table read only by Gathers (token and position embeddings) is a candidate for int8
storage per row (passes/quantize_tables.py). Every 1-D or 2-D Conv by a constant weight (not grouped:
depthwise int8 measured no faster) is a candidate for QDQ that onnxruntime runs as QLinearConv,
activation scales from the ranges measured on the calibration inputs (passes/quantize_convs.py).
Fused ops onnxruntime's CPU kernels run slower than their parts (SkipLayerNormalization, BiasGelu)
are taken apart first, and an Add before a LayerNorm is written so that onnxruntime does not fuse it
back at load time (passes/cpu_unfuse.py); a written-out hard swish becomes x * HardSigmoid(x), two passes
over the activation instead of four (rules/hardswish.py). The choice is made from measurements on the
calibration inputs (runtime/int8_measure.py, analysis/int8_policy.py), never from op types:

1. **Cost**: a Linear that multiplies one vector per sample (a CLS readout, a classifier
   head) stays fp32: int8 saves nothing there.
2. **Per-layer error**: each Linear's int8 form beside its fp32 one on the same input, error
   per output channel; unsmoothed and SmoothQuant-smoothed (per input, shared by the Linears
   reading it) with each candidate alpha. Smoothing is *offered* where it cuts the error by
   ``--smooth-gain``, and used only if the model needs it to meet the budget (a Mul costs time).
3. **End to end**: the outputs' relative error with a set of candidates in int8, measured.
   Everything at once first; if that is over ``--error-budget``, the search of
   analysis/int8_policy.py finds what must stay fp32 (roles, halves) within ``--max-runs``.
4. **Speed** (``--no-speed``: off): the chosen variant timed against the model given on the first
   calibration input (runtime/int8_speed.py); the report gives the measured speed-up, and says first when
   it is no faster. With ``--keep-fast`` (opt-in: the variant then depends on the machine's timing, not the
   same bytes everywhere), a variant not faster by 5% has the groups of int8 parts (the Convs, the Linears of
   a role, the tables) without which it is faster kept fp32 (analysis/int8_policy.keep_fast).

int8 weights are rounded with error compensation (GPTQ, from the Gram matrices of the Linears' inputs on
the calibration inputs; ``--no-compensate-rounding``: to nearest). Opt-in: ``--two-pass-activations`` (each
Linear's activation quantized twice, ``x ≈ Q(x) + Q(x - Q(x))``: ~100x less activation rounding error for a
second int8 GEMM). Both are the forms the search measures and the rewrite makes (docs/int8.md).

The budget defaults to 0.3 of what the gate allows (relative error sqrt(2 (1 - min_cosine)):
0.03 for cosine 0.995): room for inputs the calibration did not see (calibrated on random
inputs, the face-age fixture's ages move ~0.9 years at 0.03 and ~1.4 at 0.05 on real crops). The variant is verified against the source by the one gate
(verify/gate.py) at int8's bounds: every output's cosine >= ``--min-cosine``, no new NaN/inf (a recipe's task gates apply on top in build).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import LiftConstantsToInitializersPass, RemoveUnusedNodesPass

from onnxsmith.analysis.input_roles import describe_inputs
from onnxsmith.analysis.int8_policy import Selection, SpeedCheck, keep_fast, roles, search
from onnxsmith.core.errors import NothingGained
from onnxsmith.core.options import to_json
from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.irutil.tensors import weight_bytes
from onnxsmith.passes import quantization as qz
from onnxsmith.passes.cpu_unfuse import CpuUnfusePass
from onnxsmith.passes.quantize_convs import (
    MIN_OPSET,
    Conv,
    ConvPlan,
    QuantizeConvsPass,
    find_convs,
    int8_rank_problem,
    uint8_params,
)
from onnxsmith.passes.quantize_linears import (
    Int8Form,
    Linear,
    LinearPlan,
    QuantizeLinearsPass,
    by_input,
    find_linears,
    outlier_channels,
    rounding_key,
    shared_weights,
    smoothing_factors,
    smoothing_folds,
)
from onnxsmith.passes.quantize_tables import QuantizeTablesPass, Table, find_tables
from onnxsmith.rules.batchnorm import batchnorm_rules
from onnxsmith.rules.hardswish import hardswish_rules
from onnxsmith.runtime.int8_measure import (
    InputStats,
    SensitivityProbe,
    input_grams,
    measure_inputs,
    measure_layer_errors,
    measure_ranges,
    unsmoothed_name,
)
from onnxsmith.runtime.int8_speed import Int8Timer
from onnxsmith.settings.int8 import INT8, Int8Options

#: Error-compensated rounding needs calibration rows (vectors over all calibration inputs) of at least this
#: share of a Linear's input width K; MiniLM's 128 rows for K 384 helped, a T5's 8 for K 256 hurt.
COMPENSATION_ROWS = 0.25
#: Smoothing strengths tried per input.
ALPHAS: tuple[float, ...] = (0.5, 0.75, 0.9)
#: The form label of an input's outlier channels kept out of the int8 product (passes/quantize_linears.py).
OUTLIERS = "outliers"
#: int8 GEMM speed-up over fp32 measured for transformer shapes on AVX-512 VNNI/AMX (docs/int8.md).
KERNEL_SPEEDUP = 4.0
#: Linears smaller than this on either side stay fp32 (nothing to gain).
MIN_SIDE = 16
#: A variant with less of the Linears' and Convs' multiply-adds int8 than this, and no smaller than MAX_GAIN_SIZE of
#: the source's weight bytes, is not written: it is the source again (at most a few % faster or smaller).
MIN_GAIN_SHARE = 0.10
MAX_GAIN_SIZE = 0.90
#: Convs with fewer multiply-adds per output (input channels per group x kernel) stay fp32: QLinearConv
#: measured about as fast as the fp32 Conv at 16-64, 1.5x at 96-144, 2-3.5x from 256 (docs/int8.md),
#: and each int8 Conv between fp32 ops adds a QuantizeLinear and layout changes.
MIN_CONV_DEPTH = 128
#: A Conv whose output fp32 ops read (not another int8 Conv) and that does less than this share of the
#: multiply-adds int8 could speed up stays fp32: QLinearConv rounds its output to one uint8 scale, and fp32
#: readers get that rounding for at most this share of speed. The ViT's patch embedding (0.25 % of a ViT-L's
#: multiply-adds, output range 65 at RMS 5) moved the face-age fixture's ages 0.06 years by that rounding alone.
MIN_CONV_SHARE = 0.01
#: int8 Convs calibrated on fewer samples get a note: their static input/output ranges are the calibration's,
#: and inputs beyond them are clipped (PP-OCRv4 rec on 8 text lines: unseen lines' Conv inputs reached 0.55
#: where the calibration's stopped at 0.38; argmax agreement 98.8 %, 99.2 % calibrated on 32).
MIN_CONV_SAMPLES = 32
#: Seconds each timing of the variant against fp32 takes at most (beyond a few rounds, however long they take).
SPEED_SECONDS = 2.0


#: The options by their short name.
Options = Int8Options


@dataclass
class Decision:
    """What happened to one Linear, and the measurements that decided it."""

    name: str
    k: int
    n: int
    rows: int  # vectors multiplied per run on the calibration input
    outlier_ratio: float  # max / median of the input's per-channel max |x|
    role: str = ""
    # form (a smoothing alpha, OUTLIERS, None: plain) -> measured per-layer error
    errors: dict = field(default_factory=dict)
    offered: float | str | None = None  # the form offered (it cuts the input's error most, by the gain), if any
    offered_smoothing: float | None = None  # the smoothing alpha offered (what folds into a LayerNorm), if any
    form: float | str | None = None  # the form used: a smoothing alpha, OUTLIERS, or None (plain)
    outliers: tuple[int, ...] = ()  # the input channels the OUTLIERS form keeps in fp32
    piece: str = ""  # the end-to-end measurement that decided it
    piece_error: float | None = None
    int8: bool = False
    reason: str = ""
    kind: str = ""  # the reason's kind, for the summary line
    compensated: bool = False  # its int8 weight rounded with error compensation
    few_rows: bool = False  # too few calibration rows for its width to compensate the rounding (COMPENSATION_ROWS)

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.k * self.n

    def row(self) -> dict:
        plain = self.errors.get(None)
        return {
            "linear": self.name,
            "K x N": f"{self.k}x{self.n}",
            "rows": self.rows,
            "input outlier ratio": round(self.outlier_ratio, 1),
            "layer error": "-" if plain is None else f"{plain:.4f}",
            "smoothing": _form_text(self.form, self.outliers, self.errors),
            "end-to-end error": "-" if self.piece_error is None else f"{self.piece_error:.2e} ({self.piece})",
            "int8": "yes" if self.int8 else "no",
            "rounding": ("error-compensated" if self.compensated else "nearest") if self.int8 else "-",
            "why": self.reason,
        }


def _form_text(form, outliers: tuple[int, ...], errors: dict) -> str:
    if form is None:
        return "-"
    error = f" ({errors[form]:.4f})" if form in errors else ""
    if form == OUTLIERS:
        return f"channel(s) {', '.join(map(str, outliers))} fp32 beside it{error}"
    return f"alpha {form:g}{error}"


@dataclass
class ConvDecision:
    """What happened to one Conv, and the measurements that decided it."""

    name: str
    shape: tuple[int, ...]  # the weight's: out channels, in channels per group, kernel
    group: int
    relu: bool  # its output quantized after the Relu that follows it
    input_range: tuple[float, float] | None = None
    output_range: tuple[float, float] | None = None
    elements: int = 0  # of its output on the calibration input
    plan: ConvPlan | None = None
    role: str = ""
    piece: str = ""
    piece_error: float | None = None
    int8: bool = False
    reason: str = ""
    kind: str = ""

    @property
    def depth(self) -> int:
        """Multiply-adds per output value: input channels per group x kernel size."""
        _, per_group, *kernel = self.shape
        return per_group * int(np.prod(kernel))

    @property
    def flops(self) -> int:
        return 2 * self.elements * self.depth

    def row(self) -> dict:
        def span(r):
            return "-" if r is None else f"{r[0]:.3g}..{r[1]:.3g}"

        return {
            "conv": self.name,
            "weight": "x".join(map(str, self.shape)) + (f" group {self.group}" if self.group > 1 else ""),
            "input range": span(self.input_range),
            "output range": span(self.output_range) + (" (after Relu)" if self.relu else ""),
            "end-to-end error": "-" if self.piece_error is None else f"{self.piece_error:.2e} ({self.piece})",
            "int8": "yes" if self.int8 else "no",
            "why": self.reason,
        }


@dataclass(frozen=True)
class SearchSpace:
    """What the end-to-end search chooses from, as measured on the model at ``path``: the candidate
    Linears (with their int8 forms: smoothed per alpha, outliers apart), tables and Convs, and every decision
    so far."""

    path: Path
    candidates: list[Linear]
    tables: dict[str, Table]
    conv_plans: dict[str, ConvPlan]
    forms: dict[str, dict]  # Linear -> form label -> LinearPlan
    decisions: dict[str, Decision]
    conv_decisions: dict[str, ConvDecision]
    form: Int8Form  # how the int8 Linears are made (rounded weights, two-pass activations)


@register
class Int8(Transform, settings=INT8):
    judged_on_unseen = True  # its Convs' activation scales are the calibration inputs' ranges

    def repairs(self, options: Options) -> bool:
        return not options.two_pass_activations  # two passes leave ~100x less activation rounding error

    def gate_settings(self, options: Options) -> dict:
        # The one gate (verify/gate.py) at int8's bounds, with the direction bound this transform promises.
        return {"min_cosine": options.min_cosine}

    def apply(self, model: ir.Model, options: Options, context: TransformContext) -> StepReport:
        if not options.speed:
            return self._apply(model, options, context, None)
        with context.model_file(model) as given:  # the model as given: what the variant's speed is measured against
            return self._apply(model, options, context, given)

    def _apply(self, model: ir.Model, options: Options, context: TransformContext, given: Path | None) -> StepReport:
        report = StepReport(self.name, to_json(options))
        bytes_before = weight_bytes(model)
        # Convs' activation scales are fixed from the calibration inputs' ranges: real inputs', or made-up ones shaped
        # like the real thing (photo crops, speech) in a value range read from the model or given by the user. In a
        # guessed range (an image "normalized" that is really 0..255) every scale would be off 100-fold.
        with_convs = options.convs if options.convs is not None else _ranges_real(context)
        # Constant-node weights (Paddle's) become initializers: what is measured is what is converted;
        # with Convs, small ones too (BatchNormalization parameters: it folds into its Conv).
        smallest = 1 if with_convs else MIN_SIDE * MIN_SIDE
        lifted = LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=smallest)(model)
        if lifted.modified:
            context.model_is_source = False
        if with_convs and batchnorm_rules.apply_to_model(model):
            context.model_is_source = False  # measure the folded Convs that are quantized
        # What onnxruntime's CPU kernels run slower fused (or would fuse at load time) is taken apart first: the
        # Linears int8 finds then include the biases those ops held.
        unfused = CpuUnfusePass()(model)
        if unfused.modified:
            context.model_is_source = False
        # A written-out hard swish (Add, Clip, Mul, Div: four passes over the activation) as x * HardSigmoid(x), two.
        hard_swishes = hardswish_rules.apply_to_model(model)
        if hard_swishes:
            context.model_is_source = False
        linears = find_linears(model)
        tables = {t.name: t for t in find_tables(model)} if options.tables else {}
        found_convs = find_convs(model)
        convs = found_convs if with_convs else []
        if not linears and not tables and not convs:
            hint = f"; its {len(found_convs)} Convs {_why_convs_fp32(options, context)}" if found_convs else ""
            hint += "".join(f"; {why}" for why in _why_none_taken(model))
            raise NothingGained(
                "has no MatMul or Gemm by a constant fp32 weight and no embedding table: nothing to make int8" + hint,
                context.source_path,
            )
        batch = _batch(context.feeds[0])
        budget = options.budget()
        # Told how the gate measures after it refused a variant (release/: the one gate, or build's task gates),
        # int8 makes the more exact form: the activation rounding is most of what one pass loses (docs/int8.md).
        two_pass = options.two_pass_activations or context.judge is not None
        if two_pass and not options.two_pass_activations:
            report.notes.append(
                "activations in two passes, and every choice measured with the gate: it refused the variant made "
                "with one pass and without it"
            )
        decisions: dict[str, Decision] = {}
        with context.model_file(model) as path:
            context.progress(f"int8: measuring the inputs of {len(linears)} Linears")
            stats = measure_inputs(path, context.feeds) if linears else {}
            role = roles(
                [(linear.name, linear.input, linear.output, linear.kn()) for linear in linears]
                + [(conv.name, conv.input, conv.output, conv.shape) for conv in convs]
            )
            for linear in linears:
                k, n = linear.kn()
                s = stats.get(linear.name)
                d = Decision(linear.name, k, n, s.rows if s else 0, _outlier_ratio(s))
                d.role = role[linear.name]
                decisions[linear.name] = d
                if s is None:
                    d.reason, d.kind = "input not measured (no shape)", "not measured"
                elif min(k, n) < MIN_SIDE:
                    d.reason, d.kind = f"too small ({k}x{n})", "too small"
                elif s.rows <= batch:
                    d.reason, d.kind = "one vector per sample: int8 saves nothing", "one vector per sample"
            candidates = [linear for linear in linears if not decisions[linear.name].reason]
            shared = shared_weights(candidates)  # stored int8 once: one form and one rounding for all their readers
            forms = _offer_forms(path, context, candidates, shared, stats, decisions, options.smooth_gain, two_pass)
            rounded = (
                _compensated(path, context, candidates, shared, forms, decisions) if options.compensate_rounding else {}
            )
            form = Int8Form(rounded, two_pass)
            linear_flops = sum(d.flops for d in decisions.values())
            conv_decisions = _measure_convs(path, context, convs, model.opset_imports.get("", 1), linear_flops)
            for d in conv_decisions.values():
                d.role = role[d.name]
            conv_plans = {name: d.plan for name, d in conv_decisions.items() if not d.reason}
            if not options.sensitivity:
                chosen = self._without_search(decisions, candidates, options)
                chosen_tables, chosen_convs = set(tables), set(conv_plans)
                for name in chosen_convs:
                    conv_decisions[name].reason = "no end-to-end search"
                used = {}
            else:
                space = SearchSpace(path, candidates, tables, conv_plans, forms, decisions, conv_decisions, form)
                chosen, chosen_tables, chosen_convs, used = self._search(space, context, budget, options, report)
            speed = None
            if given is not None and (chosen or chosen_tables or chosen_convs):
                linear_plans = {n: (forms[n][used[n]] if n in used else LinearPlan()) for n in chosen}
                timer = Int8Timer(
                    path, given, context.feeds[0], linear_plans, set(chosen_tables),
                    {n: conv_plans[n] for n in chosen_convs}, form, seconds=SPEED_SECONDS,
                )  # fmt: skip
                speed = _keep_fast(
                    timer, context, chosen, chosen_tables, chosen_convs, decisions, conv_decisions, options.keep_fast
                )
                chosen, chosen_tables, chosen_convs = (
                    chosen - speed.kept_names,
                    chosen_tables - speed.kept_names,
                    chosen_convs - speed.kept_names,
                )
        plan = {}
        for name in chosen:
            d = decisions[name]
            d.int8 = True
            d.form = used.get(name)
            plan[name] = forms[name][d.form] if d.form is not None else LinearPlan()
            d.compensated = rounding_key(name, plan[name]) in form.rounded
        for name in chosen_convs:
            conv_decisions[name].int8 = True
        context.progress(
            f"int8: rewriting {len(plan)} Linears, {len(chosen_tables)} tables and {len(chosen_convs)} Convs"
        )
        QuantizeLinearsPass(plan, form)(model)
        QuantizeTablesPass(chosen_tables)(model)
        QuantizeConvsPass({name: conv_plans[name] for name in chosen_convs})(model)
        RemoveUnusedNodesPass()(model)
        _report(report, list(decisions.values()), tables, chosen_tables, list(conv_decisions.values()), budget, form)
        if speed is not None:
            _speed_report(report, speed, context.feeds[0])
        if unfused.modified:
            report.notes.append(unfused.note())
        if hard_swishes:
            report.notes.append(
                f"for onnxruntime's CPU kernels: {hard_swishes} written-out hard swishes -> x * HardSigmoid(x) (two "
                "passes over the activation instead of four; rules/hardswish.py)"
            )
        samples = sum(_batch(feeds) for feeds in context.range_feeds or context.feeds)
        if chosen_convs and context.real_inputs and samples < MIN_CONV_SAMPLES:
            report.notes.append(
                f"the {len(chosen_convs)} int8 Convs' activation ranges come from {samples} calibration sample(s): "
                f"inputs beyond them are clipped; give at least {MIN_CONV_SAMPLES} real ones (--inputs, a recipe's "
                "task data)"
            )
        if chosen_convs and not context.real_inputs:
            report.notes.append(
                f"the {len(chosen_convs)} int8 Convs have activation scales from the ranges of {samples} made-up "
                f"input sets ({'; '.join(describe_inputs(model))}), and the variant was judged on other made-up ones; "
                "real data (--inputs) gives the real ranges"
            )
        if found_convs and not with_convs:
            report.notes[0] += f"; {len(found_convs)} Convs fp32: they {_why_convs_fp32(options, context)}"
            report.why_not_more.append(
                f"{len(found_convs)} Conv(s) stay fp32: they {_why_convs_fp32(options, context)}"
            )
        if not plan and not chosen_tables and not chosen_convs:  # a copy of the source is no variant: say why not
            why = "; ".join(report.why_not_more) or "no part of it measured worth int8"
            raise NothingGained(f"nothing went int8, no variant written: {why}", context.source_path)
        _refuse_too_little(report, decisions, conv_decisions, bytes_before, weight_bytes(model), context)
        return report

    def _without_search(self, decisions, candidates, options: Options) -> set[str]:
        chosen = set()
        for linear in candidates:
            d = decisions[linear.name]
            error = d.errors.get(None, float("inf"))
            if not error <= options.max_layer_error:
                d.reason = (
                    f"layer error {error:.3f} > {options.max_layer_error:g} (input outlier ratio {d.outlier_ratio:.1f})"
                )
                d.kind = "layer error"
                continue
            d.reason = "layer error within bound (no end-to-end search)"
            chosen.add(linear.name)
        return chosen

    def _search(self, space: SearchSpace, context, budget, options, report):
        """(Linears int8, tables int8, Convs int8, form per Linear not plain) from end-to-end measurements."""
        path, candidates, tables, conv_plans = space.path, space.candidates, space.tables, space.conv_plans
        forms, decisions, conv_decisions = space.forms, space.decisions, space.conv_decisions
        # Smoothing that folds into a LayerNorm costs nothing at run time: used wherever it is offered. The other
        # forms offered (smoothing elsewhere, outlier channels apart: a Mul, and a Gather and MatMul) if need be.
        folding = _folding(candidates)
        free = {n: a for n in folding if (a := decisions[n].offered_smoothing) is not None}
        offered = {n: a for n, d in decisions.items() if (a := d.offered) is not None}  # includes the free ones
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
                plain = everything = _measured(probe, every, context.judge, budget)
                if plain > budget:
                    # Smoothing that costs a Mul, where it was offered: measured in a second probe, kept if it helps.
                    probe.close()
                    runs += probe.runs
                    probe = open_probe(offered)
                    smoothed = _measured(probe, every, context.judge, budget)
                    report.notes.append(
                        f"smoothing or outliers apart offered for {len(costly)} more Linears (a Mul each input): "
                        f"everything int8 {plain:.2e} without, {smoothed:.2e} with it"
                    )
                    if smoothed < plain:
                        used, everything = dict(offered), smoothed
                    else:
                        probe.close()
                        runs += probe.runs
                        probe = open_probe(free)
            groups: dict[str, list[str]] = {}
            if tables:
                groups["embedding tables"] = list(tables)
            for n in names:
                groups.setdefault(decisions[n].role, []).append(n)
            for n in conv_plans:
                groups.setdefault(conv_decisions[n].role, []).append(n)
            value = {n: float(decisions[n].flops) for n in names}
            value.update({n: float(conv_decisions[n].flops) for n in conv_plans})
            value.update({t: 0.75 * tables[t].value.const_value.nbytes for t in tables})

            def error(chosen: set[str]) -> float:
                context.progress(f"int8: end-to-end run {runs + probe.runs + 1}")
                return _measured(probe, chosen, context.judge, budget)

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
        _explain(selection, {**decisions, **{n: conv_decisions[n] for n in conv_plans}}, budget)
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
                    probe, context, candidates, chosen, used, decisions, budget, options.max_runs - runs, measured
                )
            finally:
                probe.close()
                runs += probe.runs
            for label, n_names, error in dropped:
                steps.append(f"smoothing of {label} dropped: {error:.2e}")
                for n in n_names:
                    del used[n]
        report.notes.append(
            f"end to end on the calibration inputs: relative output error {measured:.2e} "
            f"(budget {budget:g}; {runs} run(s): {'; '.join(steps)})"
        )
        report.stats["measured_output_error"] = measured
        report.stats["end_to_end_runs"] = runs
        return chosen & set(names), chosen & set(tables), chosen & set(conv_plans), used


def _keep_fast(timer, context, chosen, chosen_tables, chosen_convs, decisions, conv_decisions, trim) -> SpeedCheck:
    """Times the variant against the model given; with ``trim``, the groups of int8 parts (the tables, the Convs,
    the Linears of each role) that do not make it faster are kept fp32, and their decisions say so."""
    groups = [
        ("the embedding tables", sorted(chosen_tables)),
        ("the Convs", [n for n in conv_decisions if n in chosen_convs]),
    ]
    by_role: dict[str, list[str]] = {}
    for name, d in decisions.items():
        if name in chosen:
            by_role.setdefault(d.role, []).append(name)
    groups += [(f"the Linears {role}", names) for role, names in by_role.items()]
    context.progress("int8: timing the variant against the model given (onnxruntime CPU)")
    check = keep_fast(set(chosen) | set(chosen_tables) | set(chosen_convs), groups, timer, trim=trim)
    for label, names, without in check.kept:
        reason = (
            f"kept fp32: not faster, measured {check.with_all:.2f}x the model given with {label} int8, "
            f"{without:.2f}x without"
        )
        for n in names:
            d = decisions.get(n) or conv_decisions.get(n)
            if d is not None:
                d.reason, d.kind = reason, "not faster"
    return check


def _speed_report(report: StepReport, check: SpeedCheck, feeds: dict[str, np.ndarray]) -> None:
    where = f"on the first calibration input (batch {_batch(feeds)}), onnxruntime CPU, {os.cpu_count() or 1} threads"
    kept = "; ".join(f"{label} ({len(names)}): {without:.2f}x without them" for label, names, without in check.kept)
    report.notes.append(
        f"measured speed-up {where}: {check.speedup:.2f}x the model given"
        + (
            f" (kept fp32 for speed, not faster: {kept}; {check.with_all:.2f}x with everything chosen int8)"
            if kept
            else ""
        )
    )
    if not check.int8:
        report.why_not_more.insert(
            0,
            f"no int8 part measured faster than fp32 here: all kept fp32, {check.speedup:.2f}x the model given ({where})",
        )
    elif check.speedup < 1.0:
        report.why_not_more.insert(
            0,
            f"int8 measured no faster than the model given here: {check.speedup:.2f}x ({where})"
            + ("" if check.trimmed else "; --keep-fast keeps fp32 the int8 parts that do not pay"),
        )
    report.stats["measured_speedup"] = check.speedup
    report.stats["kept_fp32_for_speed"] = sorted(check.kept_names)


def _folding(candidates) -> set[str]:
    """The candidates whose input's smoothing folds into a LayerNorm when every candidate reading it goes int8."""
    return {
        r.name
        for x, readers in by_input(candidates).items()
        if smoothing_folds(x, [r.node for r in readers])
        for r in readers
    }


def _measured(probe: SensitivityProbe, int8: set[str], judge, budget: float) -> float:
    """The outputs' relative error with ``int8`` switched on; told how the gate measures (``judge``: it refused
    the first variant), a choice it would refuse counts as over ``budget`` by as much as it is over the gate."""
    if judge is None:
        return probe.error(int8)
    error, severity = probe.judged(int8, judge)
    return error if severity <= 1 else max(error, budget * severity)


def _drop_smoothing(probe, context, candidates, chosen, used, decisions, budget, runs_left, measured):
    """Smoothing that costs a Mul (its input is not a normalisation's output only the smoothed Linears read),
    dropped where the outputs stay within ``budget`` without it, the least helpful first: one measured run per
    role of inputs (the query/key/value inputs of every block together). Returns ((label, Linears, error)
    for each drop, the final measured error)."""
    units: dict[tuple, list] = {}
    for x, readers in by_input(candidates).items():
        smoothed = [r for r in readers if r.name in used]
        apart = any(used[r.name] == OUTLIERS for r in smoothed)  # the Gather reads the input: no fold
        if not smoothed or (not apart and smoothing_folds(x, [r.node for r in readers if r.name in chosen])):
            continue
        key = tuple(sorted({decisions[r.name].role.split(" #")[0] for r in smoothed}))
        units.setdefault(key, []).extend(smoothed)

    def kept_share(linears) -> float:
        shares = []
        for r in linears:
            errors = decisions[r.name].errors
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
        error = _measured(probe, trial, context.judge, budget)
        if error <= budget:
            current, measured = trial, error
            roles = key[0] + (f" and {len(key) - 1} more role(s)" if len(key) > 1 else "")
            dropped.append((f"{len(linears)} Linears ({roles})", [r.name for r in linears], error))
    return dropped, measured


def _ranges_real(context: TransformContext) -> bool:
    """Whether the calibration inputs' ranges are real data's: real inputs, or plausible made-up ones whose
    every image is in a value range known from the model or the user."""
    return context.real_inputs or (context.plausible_inputs and not context.guessed_ranges)


def _why_convs_fp32(options: Options, context: TransformContext) -> str:
    if options.convs is False:
        return "stay fp32 by --no-convs"
    if context.plausible_inputs and context.guessed_ranges:
        names = ", ".join(f"'{name}'" for name in context.guessed_ranges)
        example = context.guessed_ranges[0]
        return (
            f"take activation scales from the calibration inputs' ranges, and the value range of {names} is a guess "
            f"(the model does not say it): give it with --input-role {example}=0..255 (or 0..1, normalized), or "
            "real inputs (--inputs)"
        )
    return (
        "go int8 with real calibration inputs (--inputs): the activation scales come from their ranges, and "
        "random inputs' ranges are not real data's (--convs forces it)"
    )


def _measure_convs(path, context, convs: list[Conv], opset: int, linear_flops: int = 0) -> dict[str, ConvDecision]:
    """Per Conv: its decision, with the measured ranges and a :class:`ConvPlan` where it is a candidate.
    ``linear_flops``: the Linears' multiply-adds (x2) on the calibration input, for each Conv's share."""
    decisions = {c.name: ConvDecision(c.name, c.shape, c.group, c.relu is not None) for c in convs}
    if not convs:
        return decisions
    context.progress(f"int8: measuring the activation ranges of {len(convs)} Convs")
    feeds = context.range_feeds or context.feeds
    ranges = measure_ranges(path, feeds, {v.name for conv in convs for v in (conv.input, conv.output)})
    for conv in convs:
        d = decisions[conv.name]
        x, y = ranges.get(conv.input.name), ranges.get(conv.output.name)
        if x is not None and y is not None:
            d.input_range, d.output_range, d.elements = (x.low, x.high), (y.low, y.high), y.elements
    total = linear_flops + sum(d.flops for d in decisions.values())
    conv_nodes = {conv.node for conv in convs}
    for conv in convs:
        d = decisions[conv.name]
        x, y = ranges.get(conv.input.name), ranges.get(conv.output.name)
        share = d.flops / total if total else 1.0
        read_by_fp32 = conv.output.is_graph_output() or any(user not in conv_nodes for user, _ in conv.output.uses())
        if opset < MIN_OPSET:
            d.reason, d.kind = f"opset {opset} < {MIN_OPSET} (no QuantizeLinear)", "opset"
        elif int8_rank_problem(conv):
            d.reason, d.kind = int8_rank_problem(conv), f"{len(conv.shape) - 2}-D (int8 takes 1-D and 2-D Convs)"
        elif conv.group > 1:
            d.reason, d.kind = "grouped (depthwise) conv: its int8 kernel measured no faster", "grouped conv"
        elif d.depth < MIN_CONV_DEPTH:
            d.reason, d.kind = f"too shallow ({d.depth} multiply-adds per output < {MIN_CONV_DEPTH})", "too shallow"
        elif read_by_fp32 and share < MIN_CONV_SHARE:
            d.reason, d.kind = (
                f"{share:.2%} of the multiply-adds (< {MIN_CONV_SHARE:.0%}), its output read by fp32 ops: QLinearConv "
                "would round that output to one uint8 scale for little speed",
                "small, read by fp32",
            )
        elif x is None or y is None or not all(np.isfinite([x.low, x.high, y.low, y.high])):
            d.reason, d.kind = "activation range not measured or not finite", "not measured"
        else:
            d.plan = ConvPlan(*uint8_params(x.low, x.high), *uint8_params(y.low, y.high))
    return decisions


def _offer_forms(path, context, candidates, shared: set, stats, decisions, gain: float, two_pass: bool = False) -> dict:
    """Per candidate: form label -> :class:`LinearPlan` (plain, smoothed per alpha, and where the input has
    outlier channels, those apart); measures the per-layer errors and sets ``Decision.errors``, ``.outliers``
    ``.offered`` (the form that cuts the input's Linears' mean error most, if by ``gain``) and
    ``.offered_smoothing`` (the same among the smoothing alphas). With ``two_pass`` activations (measured so): the
    plain form only (they leave almost no activation rounding error for other forms to trade away); so do the
    readers of a weight in ``shared`` (:func:`shared_weights`: its one int8 copy cannot change for one input)."""
    forms: dict[str, dict] = {}
    for readers in by_input(candidates).values():
        weights = [r.weight_array() for r in readers]
        absmax = stats[readers[0].name].channel_absmax
        per_input: dict = {None: LinearPlan()}
        if two_pass or any(r.weight in shared for r in readers):
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
            decisions[r.name].outliers = outliers
    if not forms:
        return forms
    context.progress(f"int8: measuring the int8 error of {len(forms)} Linears (plain, smoothed, outliers apart)")
    errors = measure_layer_errors(path, context.feeds, forms, two_pass)
    for readers in by_input(candidates).values():
        for r in readers:
            decisions[r.name].errors = errors.get(r.name, {})
        labels = [label for label in forms[readers[0].name] if label is not None]
        if not labels:
            continue
        mean = {a: np.mean([decisions[r.name].errors.get(a, np.inf) for r in readers]) for a in (None, *labels)}
        best = min(labels, key=lambda a: (mean[a], str(a)))
        smoothing = min(ALPHAS, key=lambda a: (mean[a], a))
        for r in readers:
            if mean[best] < (1.0 - gain) * mean[None]:
                decisions[r.name].offered = best
            if mean[smoothing] < (1.0 - gain) * mean[None]:
                decisions[r.name].offered_smoothing = smoothing
    return forms


def _compensated(path, context, candidates, shared: set, forms, decisions) -> dict:
    """Error-compensated int8 weights of every candidate, for each form it may take (plain, and the forms
    offered), by :func:`rounding_key`: from the Gram matrix of its input on the calibration inputs (as the
    form prepares it: channels divided by the smoothing, outlier channels zero), factored once per input and
    form (the Linears reading an input share its forms); a weight in ``shared`` once, for all its readers."""
    # Too few calibration rows for the width of an input leave most directions of XᵀX unseen: compensation puts
    # the rounding error there, and other inputs meet it (a T5 encoder calibrated on 8 tokens, K 256-1024:
    # cosine 0.96 on 16 other tokens, 1.0 rounded to nearest). Those Linears are rounded to nearest.
    for linear in candidates:
        d = decisions[linear.name]
        d.few_rows = d.rows * len(context.feeds) < COMPENSATION_ROWS * linear.kn()[0]
    few = {linear.weight for linear in candidates if decisions[linear.name].few_rows}
    by_name = {linear.name: linear for linear in candidates if linear.weight not in few}
    shared_grams: dict = {}  # a weight several inputs' Linears read -> the sum of their inputs' XᵀX
    rounded = {}
    if not by_name:
        return rounded
    context.progress(f"int8: error-compensated rounding of {len(by_name)} Linears (XᵀX of their inputs)")
    for readers, gram in input_grams(path, context.feeds, set(by_name)):
        factors: dict = {}  # form label -> compensation factor of this input as that form prepares it
        for name in readers:
            linear, d = by_name[name], decisions[name]
            if linear.weight in shared:
                shared_grams[linear.weight] = shared_grams.get(linear.weight, 0) + gram
                continue
            w = linear.weight_array()
            for label in {None, d.offered, d.offered_smoothing}:
                plan = forms[name].get(label)
                if plan is None:
                    continue
                if label not in factors:
                    scaling = plan.input_factor(linear.kn()[0])
                    factors[label] = qz.compensation_factor(
                        gram if scaling is None else gram * np.outer(scaling, scaling)
                    )
                rounded[rounding_key(name, plan)] = qz.quantize_columns_compensated(plan.int8_weight(w), factors[label])
    # One rounding for every reader of a shared weight (the same array: stored once), compensated for all their
    # inputs together: what it minimises is the sum of their errors.
    for weight, gram in shared_grams.items():
        readers = [linear for linear in by_name.values() if linear.weight is weight]
        q = qz.quantize_columns_compensated(readers[0].weight_array(), qz.compensation_factor(gram))
        for linear in readers:
            rounded[rounding_key(linear.name, forms[linear.name][None])] = q
    return rounded


def _explain(selection: Selection, decisions: dict[str, Decision], budget: float) -> None:
    for name, d in decisions.items():
        if d.reason:
            continue
        piece = selection.piece_of(name)
        if piece is not None:
            d.piece, d.piece_error = piece.label, piece.error
        if name in selection.chosen:
            d.reason = "measured within budget" if piece is None else f"its part measured {piece.error:.2e}, chosen"
        else:
            d.kind = "end-to-end error"
            d.reason = (
                f"{piece.label}: {piece.error:.2e} alone; with the rest over the budget {budget:g}"
                if piece is not None
                else f"over the budget {budget:g}"
            )


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


def _kept_counts(decisions) -> dict[str, int]:
    """The fp32 ones counted by the kind of reason."""
    kept: dict[str, int] = {}
    for d in decisions:
        if not d.int8:
            kept[d.kind or d.reason] = kept.get(d.kind or d.reason, 0) + 1
    return dict(sorted(kept.items()))


def _kept(decisions) -> str:
    """The fp32 ones counted by the kind of reason: '2 (one vector per sample), 1 (too small)'."""
    return ", ".join(f"{n} ({k})" for k, n in _kept_counts(decisions).items())


def _report(
    report: StepReport, decisions: list[Decision], tables: dict, chosen_tables: set[str], convs, budget, form
) -> None:
    int8 = [d for d in decisions if d.int8]
    flops = sum(d.flops for d in decisions) or 1
    share = sum(d.flops for d in int8) / flops
    smoothed = [d for d in int8 if d.form is not None and d.form != OUTLIERS]
    apart = [d for d in int8 if d.form == OUTLIERS]
    compensated = [d for d in int8 if d.compensated]
    few_rows = [d for d in int8 if d.few_rows]
    kernel = KERNEL_SPEEDUP / (2 if form.two_pass else 1)  # two-pass activations: two int8 GEMMs per Linear
    expected = 1.0 / ((1.0 - share) + share / kernel)
    kept = _kept(decisions)
    table_note = ""
    if tables:
        stored = sum(tables[t].value.const_value.nbytes for t in chosen_tables)
        table_note = (
            f"; {len(chosen_tables)} of {len(tables)} embedding tables int8 per row ({stored / 1e6:.1f} MB fp32)"
        )
    report.notes.insert(
        0,
        f"{len(int8)} of {len(decisions)} Linears int8 (int8 weights per output column, activations per tensor at "
        f"run time{', in two passes' if form.two_pass else ''}), {share:.0%} of the Linears' multiply-adds"
        + (f"; {len(compensated)} with error-compensated rounding" if compensated else "")
        + (
            f"; {len(few_rows)} rounded to nearest: calibrated on fewer rows than {COMPENSATION_ROWS:g} of their "
            "input width (more inputs, --samples, let their rounding be compensated)"
            if few_rows
            else ""
        )
        + (f"; {len(smoothed)} with smoothed inputs" if smoothed else "")
        + (f"; {len(apart)} with their inputs' outlier channels in fp32 beside them" if apart else "")
        + (f"; fp32: {kept}" if kept else "")
        + table_note
        + _convs_note(convs),
    )
    report.notes.append(
        f"expected speed-up if the Linears dominate the run time: {expected:.2f}x "
        f"({share:.0%} of their work at the ~{kernel:g}x of the int8 kernel"
        + (", two GEMMs each" if form.two_pass else "")
        + ")"
    )
    report.why_not_more += [f"{n} Linear(s) stay fp32: {kind}" for kind, n in _kept_counts(decisions).items()]
    report.why_not_more += [f"{n} Conv(s) stay fp32: {kind}" for kind, n in _kept_counts(convs).items()]
    report.tables["Linears"] = [d.row() for d in decisions]
    if tables:
        report.tables["Embedding tables"] = [
            {
                "table": name,
                "rows x width": "x".join(map(str, t.shape)),
                "MB (fp32)": round(t.value.const_value.nbytes / 1e6, 2),
                "int8": "yes" if name in chosen_tables else "no",
            }
            for name, t in tables.items()
        ]
    if convs:
        report.tables["Convs"] = [d.row() for d in convs]
    report.stats["before_after"] = {
        "Linears in int8": (0, len(int8)),
        "Linears in fp32": (len(decisions), len(decisions) - len(int8)),
        "tables in int8": (0, len(chosen_tables)),
        "Convs in int8": (0, sum(d.int8 for d in convs)),
    }
    report.stats["int8_flops_share"] = share
    report.stats["compensated_linears"] = [d.name for d in compensated]
    report.stats["expected_speedup"] = expected
    report.stats["error_budget"] = budget


#: Ops of a model that is quantized already.
_QUANTIZED_OPS = frozenset(
    {"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "DynamicQuantizeLinear", "MatMulNBits"}
)
_WEIGHT_READERS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def _why_none_taken(model: ir.Model) -> list[str]:
    """Why the Convs, MatMuls and Gemms int8 found nothing in are not its to take: the model is quantized
    already, their weights are another float type than fp32, or they sit in subgraphs int8 does not enter."""
    quantized = Counter(n.op_type for g in model.graphs() for n in g if n.op_type in _QUANTIZED_OPS)
    other_float = Counter()
    nested = Counter()
    for graph in model.graphs():
        for node in graph:
            if node.op_type not in _WEIGHT_READERS or len(node.inputs) < 2 or node.inputs[1] is None:
                continue
            if graph is not model.graph:
                nested[node.op_type] += 1
                continue
            weight = node.inputs[1].const_value
            if weight is not None and weight.dtype != ir.DataType.FLOAT and weight.dtype.is_floating_point():
                other_float[(node.op_type, weight.dtype.name.lower())] += 1
    reasons = []
    if quantized:
        reasons.append(f"it is quantized already ({', '.join(f'{n} {op}' for op, n in sorted(quantized.items()))})")
    for (op, dtype), n in sorted(other_float.items()):
        reasons.append(f"its {n} {op}(s) read {dtype} weights, not fp32: int8 starts from an fp32 model")
    if nested:
        ops = ", ".join(f"{n} {op}" for op, n in sorted(nested.items()))
        reasons.append(f"its {ops} are inside If/Loop/Scan subgraphs, which int8 does not enter")
    return reasons


def _refuse_too_little(report, decisions: dict, conv_decisions: dict, before: int, after: int, context) -> None:
    """NothingGained when so little went int8 that the variant is the source again: under ``MIN_GAIN_SHARE`` of
    the Linears' and Convs' multiply-adds and no smaller than ``MAX_GAIN_SIZE`` of the source's weight bytes
    (isbnx's YOLO: 2 of 102 Convs, 3 % of their work, 0.94x the bytes, as fast as its source). Decided on what
    went int8, not on a timing: the same model gets the same answer on every machine."""
    parts = [*decisions.values(), *conv_decisions.values()]
    flops = sum(d.flops for d in parts)
    share = sum(d.flops for d in parts if d.int8) / flops if flops else 0.0
    size = after / before if before else 1.0
    if share >= MIN_GAIN_SHARE or size <= MAX_GAIN_SIZE:
        return
    went = sum(d.int8 for d in decisions.values()), sum(d.int8 for d in conv_decisions.values())
    why = "; ".join(report.why_not_more) or "no other part of it measured worth int8"
    raise NothingGained(
        f"too little went int8 to gain anything, no variant written: {went[0]} Linear(s) and {went[1]} Conv(s), "
        f"{share:.0%} of the multiply-adds (at least {MIN_GAIN_SHARE:.0%} needed) and {size:.2f}x the weight bytes; "
        f"{why}",
        context.source_path,
    )


def _convs_note(convs: list[ConvDecision]) -> str:
    if not convs:
        return ""
    int8 = [d for d in convs if d.int8]
    flops = sum(d.flops for d in convs) or 1
    kept = _kept(convs)
    return (
        f"; {len(int8)} of {len(convs)} Convs int8 (QLinearConv, activation scales from the calibration inputs), "
        f"{sum(d.flops for d in int8) / flops:.0%} of their multiply-adds" + (f"; fp32: {kept}" if kept else "")
    )
