"""quantize: a language model with 4-bit (or 8-bit) weights, small enough for a web page.

The steps, each a pass of its own:

1. the default opset becomes 21 when blocked DequantizeLinear needs it (onnxscript's
   version converter, the onnx C API as its fallback);
2. Gemm -> MatMul + Add, so every body weight is a plain [K, N] MatMul constant;
   then the graph is made cheaper than the source (``simplify``): the Reshape pairs around
   MatMuls go (passes/unflatten_matmul.py) and computed Reshape targets become constants
   (passes/reshape_targets.py), so the shape arithmetic is not redone on every call;
3. the LM head and the token embedding are found; a tied pair is stored once, int8
   per token, in the head's layout (lookups gather columns) or, for a model without a KV
   cache, in the table's (lookups gather rows) (passes/tied_head.py);
   With ``--format nbits`` an int8 head runs as an 8-bit MatMulNBits instead, its rows
   gathered 8-bit by the lookups (passes/nbits_head.py): native onnxruntime would
   otherwise dequantize the whole table on every call;
4. every other MatMul weight is quantized in blocks along K behind one blocked
   DequantizeLinear, or packed for MatMulNBits (passes/quantize_weights.py);
5. the head's weight gets a leading unit dim so onnxruntime runs it as a GEMV at one row
   (``gemv_head``, passes/gemv_head.py); optionally, only the last position's logits are computed;
6. dead nodes and unreferenced initializers are removed (no fp32 copy stays behind).

What a runtime does with the ``qdq`` format depends on its session options:

* onnxruntime-web (WASM) with ``session.disable_quant_qdq=1`` constant-folds every
  DequantizeLinear at load and runs fp32 MatMuls: fp32 speed, a quarter of the download;
* onnxruntime without it keeps the DequantizeLinear+MatMul pairs and fuses them into
  MatMulNBits (native CPU: fast, int8 activations at ``session.qdq_matmulnbits_accuracy_level``
  4, its default; WASM: about 10x slower than fp32);
* ``--format nbits`` writes MatMulNBits directly, for native CPU and WebGPU.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, RemoveUnusedOpsetsPass
from onnxscript.version_converter import ConvertVersionPass

from onnxsmith.analysis.lm_signature import lm_signature
from onnxsmith.core import options as opts
from onnxsmith.core.errors import InputError
from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.irutil.tensors import weight_bytes
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.gemm_to_matmul import GemmToMatMulPass
from onnxsmith.passes.gemv_head import GemvHeadPass
from onnxsmith.passes.last_token_logits import LastTokenLogitsPass
from onnxsmith.passes.nbits_head import NBitsHeadPass
from onnxsmith.passes.quantize_weights import QuantizeWeightsPass, quantizable_weights
from onnxsmith.passes.reshape_targets import ConstantReshapeTargetsPass
from onnxsmith.passes.tied_head import LMHead, StoreHeadPass, find_lm_head
from onnxsmith.passes.unflatten_matmul import UnflattenMatMulPass
from onnxsmith.settings.quantize import QUANTIZE, QuantizeOptions

#: Blocked DequantizeLinear (block_size, 4-bit types) is opset 21, which needs IR version 10.
BLOCKED_DQ_OPSET = 21
BLOCKED_DQ_IR_VERSION = 10
#: Per-axis DequantizeLinear (the int8 head) is opset 13.
PER_AXIS_DQ_OPSET = 13

#: Session options per target, for the report and the card.
WASM_CONFIG = {"session.disable_quant_qdq": "1"}
TARGETS = {
    "qdq": {
        "onnxruntime-web (WASM)": {
            "session_options": WASM_CONFIG,
            "why": "constant-folds the DequantizeLinear at load: fp32 MatMuls, fp32 speed "
            "(without it WASM fuses DequantizeLinear+MatMul into MatMulNBits and runs ~10x slower)",
        },
        "onnxruntime native CPU": {
            "session_options": {},
            "why": "runs, but not fast: it fuses the body's DequantizeLinear+MatMul into MatMulNBits, while the "
            "int8 head's DequantizeLinear (shared with the lookups) runs on every call, the whole table (decode "
            "several times slower than the source on a 50k vocabulary); for native CPU make --format nbits",
        },
    },
    "nbits": {
        "onnxruntime native CPU / WebGPU": {
            "session_options": {},
            "why": "MatMulNBits runs directly, the head's too (8-bit, int8 activations: nothing is dequantized per "
            "call); accuracy_level in the model picks the body's activation precision",
        },
    },
}


@register
class Quantize(Transform, settings=QUANTIZE):
    gate_task = "lm"  # next-token KL and top-1 agreement (tasks/lm/gate.py), not output atol

    def apply(self, model: ir.Model, options: QuantizeOptions, context: TransformContext) -> StepReport:
        report = StepReport(self.name, opts.to_json(options))
        progress = context.progress
        weight_bytes_before = weight_bytes(model)
        nodes_before = count_nodes(model)

        progress("quantize: opset")
        self._upgrade_opset(model, options, report)
        head, body, prepared = prepare(model, options, context.source_path)
        if prepared.gemms:
            report.notes.append(f"{prepared.gemms} Gemm(s) rewritten as MatMul + Add")
        if options.simplify:
            report.notes.append(
                f"graph simplified: {prepared.unflattened} Reshape pair(s) around MatMuls removed, "
                f"{prepared.reshape_targets} computed Reshape target(s) made constant; "
                f"{nodes_before} -> {prepared.nodes} nodes that run (Constant nodes not counted)"
            )

        nbits_head = head is not None and options.format == "nbits" and options.head == "int8"
        rows = self._store_head(model, head, options, report, progress) if head is not None else []
        progress(f"quantize: {len(body)} weights")
        weights = QuantizeWeightsPass(
            bits=options.bits,
            block_size=options.block_size,
            symmetric=options.symmetric,
            format=options.format,
            accuracy_level=options.accuracy_level,
            uneven=options.uneven,
            exclude={head.matmul} if head else set(),
        )(model)
        report.notes.insert(
            0,
            f"{weights.quantized} of {len(body)} MatMul weight(s) quantized "
            f"({options.bits}-bit, block {options.block_size}, "
            f"{'symmetric' if options.symmetric else 'asymmetric'}, format {options.format})",
        )
        report.notes.extend(weights.notes)
        rows.extend(weights.rows)
        if weights.grids_rounded:
            report.if_refused.append(
                f"{weights.grids_rounded} weight(s) sit on {options.bits}-bit grids (a model dequantized from a GGUF "
                "file) that this format rounds and --format nbits stores exactly"
            )

        if options.gemv_head and head is not None and options.head != "keep" and not nbits_head:
            gemv = GemvHeadPass(head.matmul)(model)
            report.notes.append(
                f"head not laid out for a GEMV: {gemv.skipped}"
                if gemv.skipped
                else f"head weight is [1, {head.hidden}, {head.vocab}] ({gemv.how}): onnxruntime does "
                "not prepack it and runs the one-row head as a GEMV (faster decode)"
            )
        if options.last_token:
            LastTokenLogitsPass(head.matmul, head.logits)(model)
            report.notes.append("logits for the last position only ([batch, 1, vocab]); generation reads nothing else")

        RemoveUnusedNodesPass()(model)
        RemoveUnusedOpsetsPass()(model)
        self._describe(report, model, options, head, rows, (nodes_before, weight_bytes_before), weights.quantized)
        return report

    def _store_head(self, model: ir.Model, head: LMHead, options: QuantizeOptions, report: StepReport, progress):
        """The LM head (and the lookups sharing its table) stored as ``--head`` says; returns the table's rows."""
        progress("quantize: LM head")
        if options.format == "nbits" and options.head == "int8":
            store = NBitsHeadPass(
                head, block_size=options.block_size, symmetric=options.symmetric, accuracy_level=options.accuracy_level
            )(model)
        else:
            store = StoreHeadPass(
                head,
                options.head,
                block_size=options.block_size,
                symmetric=options.symmetric,
                lookups=_lookups(model, options),
            )(model)
        report.notes.extend(store.notes)
        return list(store.rows)

    def _describe(self, report, model, options: QuantizeOptions, head, rows, before: tuple[int, int], quantized: int):
        """The numbers, the weights table, why not more, and what each target needs to run the variant."""
        nodes_before, weight_bytes_before = before
        weight_bytes_after = weight_bytes(model)
        nodes_after = count_nodes(model, folded=True)
        report.stats["before_after"] = {
            "weight bytes": (weight_bytes_before, weight_bytes_after),
            "nodes that run": (nodes_before, nodes_after),
        }
        report.stats["nodes"] = {"before": nodes_before, "after": nodes_after}
        report.stats["weight_bytes"] = {"before": weight_bytes_before, "after": weight_bytes_after}
        report.stats["quantized_weights"] = quantized
        report.tables["weights"] = rows
        report.why_not_more = _why_not_more(model, options, rows, weight_bytes_after)
        if options.format == "qdq" and head is not None and options.head != "keep":
            report.why_not_more.append(
                "made for onnxruntime-web (WASM, DequantizeLinear folded at load); native onnxruntime would "
                "dequantize the whole head on every call (slower than the source): for native CPU make --format nbits"
            )
        report.stats["targets"] = TARGETS[options.format]
        if options.format == "qdq":
            report.runtime.update(WASM_CONFIG)
            report.notes.append(
                "onnxruntime-web (WASM): create the session with session.disable_quant_qdq=1 "
                "(it folds the DequantizeLinear at load: fp32 speed); without it WASM runs ~10x slower"
            )

    def _upgrade_opset(self, model: ir.Model, options: QuantizeOptions, report: StepReport) -> None:
        needs_blocks = options.format == "qdq" or options.head == "q4"
        target = BLOCKED_DQ_OPSET if needs_blocks else PER_AXIS_DQ_OPSET
        current = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        if current >= target:
            return
        try:
            ConvertVersionPass(target, fallback=True)(model)
        except Exception as err:  # the converters raise assorted errors
            raise InputError(f"cannot convert the model from opset {current} to {target}: {err}") from None
        if model.opset_imports.get("", 0) < target:
            raise InputError(f"cannot convert the model from opset {current} to {target} (the converter refused)")
        if needs_blocks:
            model.ir_version = max(model.ir_version, BLOCKED_DQ_IR_VERSION)
        report.notes.append(
            f"default opset {current} -> {target} (blocked DequantizeLinear)"
            if needs_blocks
            else f"default opset {current} -> {target}"
        )

    def gate_settings(self, options: QuantizeOptions) -> dict:
        """The LM gate's bounds, and the variant run as its target runs it (session options)."""
        return {
            "max_kl": options.max_kl,
            "min_top1": options.min_top1,
            "candidate_config": WASM_CONFIG if options.format == "qdq" else None,
        }


@dataclass
class Prepared:
    """What :func:`prepare` did to the graph."""

    gemms: int = 0  # Gemms rewritten as MatMul + Add
    unflattened: int = 0  # Reshape pairs removed around MatMuls
    reshape_targets: int = 0  # computed Reshape targets made constant
    nodes: int = 0  # nodes that run, after


def prepare(model: ir.Model, options: QuantizeOptions, source) -> tuple[LMHead | None, list, Prepared]:
    """Gemm -> MatMul, simplify, then find the head and the body weights: (head, body weights, what was done).

    Raises InputError when there is nothing to quantize or no head where one is needed.
    ``onnxsmith quantize`` runs it on a throwaway copy first, to fail before any work.
    """
    gemms = GemmToMatMulPass()(model)
    prepared = Prepared(gemms=gemms.rewritten)
    infer_types(model)
    if options.simplify:
        unflatten = UnflattenMatMulPass()(model)
        targets = ConstantReshapeTargetsPass()(model)
        RemoveUnusedNodesPass()(model)
        infer_types(model)
        prepared.unflattened, prepared.reshape_targets = unflatten.rewritten, targets.rewritten
    prepared.nodes = count_nodes(model)
    try:
        head = find_lm_head(model)
    except InputError as err:
        if options.head != "keep" or options.last_token:
            needs = "--head keep --no-last-token" if options.last_token else "--head keep"
            raise InputError(f"{err.problem} (without a head, use {needs})", source) from None
        head = None
    body = quantizable_weights(model, {head.matmul} if head else set())
    if not body:
        raise InputError("no MatMul or Gemm with a constant 2-D weight to quantize", source)
    return head, body, prepared


def _lookups(model: ir.Model, options: QuantizeOptions) -> str:
    """``auto``: rows for a model without a KV cache (it looks up the whole sequence at every step)."""
    if options.lookups != "auto":
        return options.lookups
    try:
        return "columns" if lm_signature(model).past else "rows"
    except InputError:
        return "columns"


def count_nodes(model: ir.Model, *, folded: bool = False) -> int:
    """Nodes of the main graph that run: not Constant, and with ``folded`` not DequantizeLinear of constants
    either (onnxruntime folds them at load with session.disable_quant_qdq=1)."""

    def runs(node: ir.Node) -> bool:
        if node.op_type == "Constant":
            return False
        if folded and node.op_type == "DequantizeLinear":
            return not all(v is None or ir.convenience.get_const_tensor(v) is not None for v in node.inputs)
        return True

    return sum(1 for node in model.graph if runs(node))


def _why_not_more(model: ir.Model, options: QuantizeOptions, rows: list[dict], total: int) -> list[str]:
    """What quantize left wider than the scheme, and why: the headline's lines after the size."""
    lines = []
    scheme = (f"{options.bits}-bit", "int8") if options.bits == 8 else (f"{options.bits}-bit",)
    wider = Counter(row["stored as"] for row in rows if not any(s in row["stored as"] for s in scheme))
    lines += [f"{n} weight(s) stored as {how}" for how, n in sorted(wider.items())]
    fp32 = sum(
        v.const_value.nbytes
        for v in model.graph.initializers.values()
        if v.const_value is not None and v.const_value.dtype == ir.DataType.FLOAT
    )
    if total and fp32 / total >= 0.05:
        lines.append(
            f"{fp32 / 2**20:.1f} MB of the {total / 2**20:.1f} MB of weights stay fp32: "
            "what no MatMul reads as a weight (biases, norms, position embeddings)"
        )
    return lines
