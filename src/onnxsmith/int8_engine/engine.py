"""The int8 engine: prepare the graph, find the parts, measure them, choose, rewrite, report.

``make_int8`` is what :class:`onnxsmith.transforms.int8.Int8` runs. Each step is a module of this package:
what the parts are and the bounds they are decided by (parts.py), how each Linear may be made (forms.py),
which Convs may go (convs.py), the end-to-end choice (search.py), the probes that measure (measure.py,
speed.py) and the words the report shows (report.py). The rewrite itself is the passes'
(passes/quantize_linears.py, quantize_tables.py, quantize_convs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import onnx_ir as ir
from onnx_ir.passes.common import LiftConstantsToInitializersPass, RemoveUnusedNodesPass

from onnxsmith.analysis.int8_policy import SpeedCheck, roles
from onnxsmith.core.options import to_json
from onnxsmith.core.transform import StepReport, TransformContext
from onnxsmith.int8_engine.convs import measure_convs, ranges_are_real
from onnxsmith.int8_engine.forms import compensated_weights, offer_forms, with_few_rows
from onnxsmith.int8_engine.parts import (
    MIN_SIDE,
    LinearFacts,
    Part,
    Parts,
    TableFacts,
    outlier_ratio,
    replaced,
    vectors_per_sample,
)
from onnxsmith.int8_engine.report import (
    closing_notes,
    describe_parts,
    describe_speed,
    refuse_nothing,
    refuse_too_little,
    refuse_unchanged,
    two_pass_note,
)
from onnxsmith.int8_engine.search import SPEED_SECONDS, SearchSpace, check_speed, search_parts, without_search
from onnxsmith.int8_engine.speed import Int8Timer
from onnxsmith.int8_engine.statistics import announced, measure_inputs
from onnxsmith.irutil.tensors import weight_bytes
from onnxsmith.passes.cpu_unfuse import CpuUnfusePass
from onnxsmith.passes.quantize_convs import MIN_OPSET, PER_CHANNEL_OPSET, ConvPlan, QuantizeConvsPass, find_convs
from onnxsmith.passes.quantize_linears import (
    Int8Form,
    Linear,
    LinearPlan,
    QuantizeLinearsPass,
    find_linears,
    rounding_key,
    shared_weights,
)
from onnxsmith.passes.quantize_tables import QuantizeTablesPass, Table, find_tables
from onnxsmith.passes.raise_opset import RaiseOpsetPass, default_opset
from onnxsmith.rules.batchnorm import batchnorm_rules
from onnxsmith.rules.hardswish import hardswish_rules
from onnxsmith.settings.int8 import Int8Options


@dataclass(frozen=True)
class Choice:
    """What goes int8, as the rewrite takes it, and the records of every part that decided it."""

    linears: dict[str, LinearPlan]
    tables: frozenset[str]
    convs: dict[str, ConvPlan]
    form: Int8Form
    parts: Parts  # every Linear, table and Conv found, with its measurements and its decision
    speed: SpeedCheck | None


def make_int8(
    model: ir.Model, options: Int8Options, context: TransformContext, given: Path | None, name: str = "int8"
) -> StepReport:
    """Rewrite ``model`` in place with the int8 parts its measurements allow; ``given``: the model as given, what
    the variant's speed is measured against (None: not timed). Raises NothingGained where nothing would pay."""
    report = StepReport(name, to_json(options))
    bytes_before = weight_bytes(model)
    # Convs' activation scales are fixed from the calibration inputs' ranges: real inputs', or made-up ones shaped
    # like the real thing (photo crops, speech) in a value range read from the model or given by the user. In a
    # guessed range (an image "normalized" that is really 0..255) every scale would be off 100-fold.
    with_convs = options.convs if options.convs is not None else ranges_are_real(context)
    unfused, hard_swishes = _prepare(model, context, with_convs)
    if with_convs and find_convs(model):
        report.notes.extend(_opset_for_convs(model, context))
    linears = find_linears(model)
    tables = {t.name: t for t in find_tables(model)} if options.tables else {}
    found_convs = find_convs(model)
    convs = found_convs if with_convs else []
    if not linears and not tables and not convs:
        raise refuse_nothing(model, options, context, len(found_convs))
    budget = options.budget()
    # Told how the gate measures after it refused a variant (release/: the one gate, or build's task gates),
    # int8 makes the more exact form: the activation rounding is most of what one pass loses (docs/int8.md).
    two_pass = options.two_pass_activations or context.judge is not None
    report.notes.extend(two_pass_note(options, two_pass))
    with context.model_file(model) as path:
        choice = _choose(path, model, linears, tables, convs, options, context, budget, two_pass, given, report)
    context.progress(
        f"int8: rewriting {len(choice.linears)} Linears, {len(choice.tables)} tables and {len(choice.convs)} Convs"
    )
    QuantizeLinearsPass(choice.linears, choice.form)(model)
    QuantizeTablesPass(set(choice.tables))(model)
    QuantizeConvsPass(choice.convs)(model)
    RemoveUnusedNodesPass()(model)
    describe_parts(report, choice.parts, budget, choice.form)
    if choice.speed is not None:
        describe_speed(report, choice.speed, context.feeds[0])
    closing_notes(
        report,
        model,
        options,
        context,
        chosen_convs=len(choice.convs),
        found_convs=len(found_convs),
        with_convs=with_convs,
        unfused=unfused,
        hard_swishes=hard_swishes,
    )
    if not choice.linears and not choice.tables and not choice.convs:
        raise refuse_unchanged(report, context)
    refuse_too_little(report, choice.parts, bytes_before, weight_bytes(model), context)
    return report


def _prepare(model: ir.Model, context: TransformContext, with_convs: bool):
    """The graph as int8 measures and rewrites it: (what CPU unfusing did, how many hard swishes were rewritten)."""
    # Constant-node weights (Paddle's) become initializers: what is measured is what is converted;
    # with Convs, small ones too (BatchNormalization parameters: it folds into its Conv).
    smallest = 1 if with_convs else MIN_SIDE * MIN_SIDE
    changed = LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=smallest)(model).modified
    changed |= bool(with_convs and batchnorm_rules.apply_to_model(model))  # measure the folded Convs
    # What onnxruntime's CPU kernels run slower fused (or would fuse at load time) is taken apart first: the
    # Linears int8 finds then include the biases those ops held.
    unfused = CpuUnfusePass()(model)
    # A written-out hard swish (Add, Clip, Mul, Div: four passes over the activation) as x * HardSigmoid(x), two.
    hard_swishes = hardswish_rules.apply_to_model(model)
    if changed or unfused.modified or hard_swishes:
        context.changed()
    return unfused, hard_swishes


def _opset_for_convs(model: ir.Model, context: TransformContext) -> list[str]:
    """A model older than QuantizeLinear (opset 10: tf2onnx's opset 9 exports) raised to 13, where it quantizes
    per channel, so that its Convs can go int8; what was done, or why not (the Convs then stay fp32)."""
    before = default_opset(model)
    if before is None or before >= MIN_OPSET:
        return []
    raised = RaiseOpsetPass(PER_CHANNEL_OPSET)(model)
    if not raised.modified:
        return [f"opset {before} kept (the Convs need {MIN_OPSET} for QuantizeLinear): {raised.reason}"]
    context.changed()
    return [f"opset raised {before} -> {PER_CHANNEL_OPSET}: QuantizeLinear (per channel from 13) for the Convs"]


def _linear_parts(path: Path, context: TransformContext, linears: list[Linear], role: dict[str, str]):
    """(the Linears' input statistics, a part per Linear with the reason of those that cannot go int8)."""
    shards = announced(context.progress, f"int8: measuring the inputs of {len(linears)} Linears")
    stats = measure_inputs(path, context.feeds, context.engine, shards) if linears else {}
    batch = vectors_per_sample(context.feeds[0])
    parts: dict[str, Part] = {}
    for linear in linears:
        k, n = linear.kn()
        s = stats.get(linear.name)
        part = Part("linear", linear.name, LinearFacts(k, n, s.rows if s else 0, outlier_ratio(s)), role[linear.name])
        if s is None:
            part = part.decided(reason="input not measured (no shape)", kind="not measured")
        elif min(k, n) < MIN_SIDE:
            part = part.decided(reason=f"too small ({k}x{n})", kind="too small")
        elif s.rows <= batch:
            part = part.decided(reason="one vector per sample: int8 saves nothing", kind="one vector per sample")
        parts[linear.name] = part
    return stats, parts


def _table_parts(tables: dict[str, Table]) -> dict[str, Part]:
    return {
        name: Part("table", name, TableFacts(t.shape, t.value.const_value.nbytes), "embedding tables")
        for name, t in tables.items()
    }


def _choose(path, model, linears, tables: dict[str, Table], convs, options, context, budget, two_pass, given, report):
    """Measure every part on the model at ``path`` and choose what goes int8 (a :class:`Choice`)."""
    role = roles(
        [(linear.name, linear.input, linear.output, linear.kn()) for linear in linears]
        + [(conv.name, conv.input, conv.output, conv.shape) for conv in convs]
    )
    stats, parts = _linear_parts(path, context, linears, role)
    candidates = [linear for linear in linears if parts[linear.name].candidate]
    shared = shared_weights(candidates)  # stored int8 once: one form and one rounding for all their readers
    forms, parts = offer_forms(path, context, candidates, shared, stats, parts, options.smooth_gain, two_pass)
    rounded = {}
    if options.compensate_rounding:
        parts = with_few_rows(parts, candidates, len(context.feeds))
        rounded = compensated_weights(path, context, candidates, shared, forms, parts)
    form = Int8Form(rounded, two_pass)
    linear_flops = sum(p.flops for p in parts.values())
    conv_parts = measure_convs(path, context, convs, model.opset_imports.get("", 1), role, linear_flops)
    parts = {**parts, **_table_parts(tables), **conv_parts}
    conv_plans = {name: p.facts.plan for name, p in conv_parts.items() if p.candidate}
    # One set of the names chosen int8, whatever their kind (names are unique across Linears, tables and Convs).
    if not options.sensitivity:
        chosen, parts = without_search(parts, candidates, options)
        chosen |= set(tables) | set(conv_plans)
        parts = replaced(parts, {name: parts[name].decided(reason="no end-to-end search") for name in conv_plans})
        used = {}
    else:
        space = SearchSpace(path, candidates, tables, conv_plans, forms, parts, form)
        chosen, used, parts = search_parts(space, context, budget, options, report)
    speed = None
    if given is not None and chosen:
        kinds = _by_kind(chosen, parts)
        linear_plans = {n: (forms[n][used[n]] if n in used else LinearPlan()) for n in kinds["linear"]}
        timer = Int8Timer(
            path, given, context.feeds[0], linear_plans, set(kinds["table"]),
            {n: conv_plans[n] for n in kinds["conv"]}, form, seconds=SPEED_SECONDS,
        )  # fmt: skip
        speed, parts = check_speed(timer, context, chosen, parts, options.keep_fast)
        chosen = chosen - speed.kept_names
    kinds = _by_kind(chosen, parts)
    plans = {n: forms[n][used[n]] if used.get(n) is not None else LinearPlan() for n in kinds["linear"]}
    final = {n: parts[n].decided(int8=True) for n in chosen}
    for n, plan in plans.items():
        final[n] = final[n].decided(form=used.get(n), compensated=rounding_key(n, plan) in form.rounded)
    parts = replaced(parts, final)
    convs_chosen = {name: conv_plans[name] for name in conv_parts if name in chosen}
    return Choice(plans, frozenset(kinds["table"]), convs_chosen, form, MappingProxyType(parts), speed)


def _by_kind(names: set[str], parts: Parts) -> dict[str, set[str]]:
    kinds: dict[str, set[str]] = {"linear": set(), "table": set(), "conv": set()}
    for n in names:
        kinds[parts[n].kind].add(n)
    return kinds
