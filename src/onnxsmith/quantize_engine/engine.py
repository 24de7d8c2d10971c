"""quantize: a language model with 4-bit (or 8-bit) weights, small enough for a web page.

``make_quantized`` is what :class:`onnxsmith.transforms.quantize.Quantize` runs; :func:`prepare` is its first
steps, which ``onnxsmith quantize`` also runs on a throwaway copy to fail before any work (release/lm_folder.py).
The words the report shows are report.py's. The steps, each a pass of its own:

1. the default opset becomes 21 when blocked DequantizeLinear needs it (onnxscript's
   version converter, the onnx C API as its fallback);
2. Gemm -> MatMul + Add, so every body weight is a plain [K, N] MatMul constant;
   then the graph is made cheaper than the source (``simplify``): the Reshape pairs around
   MatMuls go (passes/unflatten_matmul.py) and the shape arithmetic is folded as fuse folds it
   (passes/fold_shapes.py: computed Reshape and Expand targets become constants), so it is not
   redone on every call; with ``attention`` (``--target cpu``'s default) each decoder layer's attention and
   KV cache become RotaryEmbedding + GroupQueryAttention (rules/decoder_attention.py, as fuse does);
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
* ``--format nbits`` (``--target cpu``: with int8 activations) writes MatMulNBits directly, for native CPU and WebGPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, RemoveUnusedOpsetsPass
from onnxscript.version_converter import ConvertVersionPass

from onnxsmith.analysis.lm_signature import lm_signature
from onnxsmith.core import options as opts
from onnxsmith.core.errors import InputError
from onnxsmith.core.transform import Progress, StepReport, TransformContext
from onnxsmith.irutil.tensors import weight_bytes
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.fold_shapes import FoldShapesPass, constants_to_evaluate
from onnxsmith.passes.gemm_to_matmul import GemmToMatMulPass
from onnxsmith.passes.gemv_head import GemvHeadPass
from onnxsmith.passes.last_token_logits import LastTokenLogitsPass
from onnxsmith.passes.lower_to_opset import LowerToOpsetPass
from onnxsmith.passes.name_dims import NameDimsPass
from onnxsmith.passes.nbits_head import NBitsHeadPass
from onnxsmith.passes.quantization import BLOCKED_DQ_IR_VERSION, BLOCKED_DQ_OPSET
from onnxsmith.passes.quantize_weights import QuantizeWeightsPass, quantizable_weights
from onnxsmith.passes.tied_head import LMHead, StoreHeadPass, find_lm_head
from onnxsmith.passes.unflatten_matmul import UnflattenMatMulPass
from onnxsmith.probes.evaluate import evaluate_constants
from onnxsmith.quantize_engine.report import (
    DECODER_INPUTS_NOTE,
    DECODER_INT8_NOTE,
    LAST_TOKEN_NOTE,
    attention_note,
    decode_speed,
    describe,
    gemv_note,
    opset_note,
    prepared_notes,
    refuse_headless,
    refuse_no_weights,
    refuse_opset,
    weights_note,
)
from onnxsmith.rules.apply import apply_rules
from onnxsmith.rules.decoder_attention import decoder_attention_rules
from onnxsmith.rules.noop_reshape import noop_reshape_rules
from onnxsmith.runtime.lm_feeds import decode_step_feeds
from onnxsmith.runtime.speed import seconds_per_run
from onnxsmith.settings.quantize import QuantizeOptions

#: Per-axis DequantizeLinear (the int8 head) is opset 13.
PER_AXIS_DQ_OPSET = 13
#: ``int8`` of a causal LM with a KV cache: 8-bit blocks as MatMulNBits with int8 activations (onnxruntime's
#: int8 GEMM), the head 8-bit too; every position's logits, as the source returns them (a drop-in file).
DECODER_INT8 = QuantizeOptions(scheme="q8", target="cpu", last_token=False)


def make_quantized(
    model: ir.Model, options: QuantizeOptions, context: TransformContext, name: str = "quantize"
) -> StepReport:
    """Quantize ``model`` in place as ``options`` say. Raises InputError on a model quantize cannot take."""
    report = StepReport(name, opts.to_json(options))
    progress = context.progress
    weight_bytes_before = weight_bytes(model)
    nodes_before = count_nodes(model)

    progress("quantize: opset")
    _upgrade_opset(model, options, report)
    head, body, prepared = prepare(model, options, context.source_path)
    simplified = (
        prepared.unflattened,
        prepared.reshape_targets,
        prepared.expand_targets,
        nodes_before,
        prepared.nodes,
    )
    report.notes.extend(prepared_notes(prepared.gemms, simplified if options.simplify else None))
    if options.attention:
        report.notes.append(attention_note(prepared.attention, prepared.attention_refused))

    nbits_head = head is not None and options.format == "nbits" and options.head == "int8"
    rows = _store_head(model, head, options, report, progress) if head is not None else []
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
    report.notes.insert(0, weights_note(weights.quantized, len(body), options))
    report.notes.extend(weights.notes)
    rows.extend(weights.rows)

    if options.gemv_head and head is not None and options.head != "keep" and not nbits_head:
        gemv = GemvHeadPass(head.matmul)(model)
        report.notes.append(gemv_note(gemv.skipped, gemv.how, head.hidden, head.vocab))
    if options.last_token:
        assert head is not None  # prepare refuses --last-token without a head
        LastTokenLogitsPass(head.matmul, head.logits)(model)
        report.notes.append(LAST_TOKEN_NOTE)

    RemoveUnusedNodesPass()(model)
    RemoveUnusedOpsetsPass()(model)
    describe(
        report,
        model,
        options,
        head_quantized=head is not None and options.head != "keep",
        rows=rows,
        nodes=(nodes_before, count_nodes(model, folded=True)),
        weight_bytes=(weight_bytes_before, weight_bytes(model)),
        quantized=weights.quantized,
    )
    return report


def make_decoder_int8(
    model: ir.Model, context: TransformContext, name: str = "int8", given: Path | None = None
) -> StepReport:
    """``int8`` of a causal LM with a KV cache (transforms/int8.py): :data:`DECODER_INT8`, said why first;
    ``given``: the model as given, whose decode step the variant's is timed against (None: not timed)."""
    report = make_quantized(model, DECODER_INT8, context, name)
    report.notes.insert(0, DECODER_INT8_NOTE)
    if context.real_inputs:
        report.notes.insert(1, DECODER_INPUTS_NOTE)
    if given is not None:
        context.progress("int8: timing a decode step against the model given")
        feeds = decode_step_feeds(lm_signature(model))
        with context.scratch() as folder:
            variant = Path(folder) / "variant.onnx"
            context.save(model, variant)
            times = seconds_per_run({"given": given, "variant": variant}, feeds)
        decode_speed(report, times["given"], times["variant"])
    return report


def _store_head(
    model: ir.Model, head: LMHead, options: QuantizeOptions, report: StepReport, progress: Progress
) -> list[dict]:
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


def _upgrade_opset(model: ir.Model, options: QuantizeOptions, report: StepReport) -> None:
    """The default opset raised to what the DequantizeLinear quantize writes needs."""
    needs_blocks = options.format == "qdq" or options.head == "q4"
    target = BLOCKED_DQ_OPSET if needs_blocks else PER_AXIS_DQ_OPSET
    current = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    if current >= target:
        return
    try:
        ConvertVersionPass(target, fallback=True)(model)
    except Exception as err:  # the converters raise assorted errors
        raise refuse_opset(current, target, err) from None
    if model.opset_imports.get("", 0) < target:
        raise refuse_opset(current, target)
    if needs_blocks:
        model.ir_version = max(model.ir_version, BLOCKED_DQ_IR_VERSION)
    report.notes.append(opset_note(current, target, needs_blocks))


@dataclass
class Prepared:
    """What :func:`prepare` did to the graph."""

    gemms: int = 0  # Gemms rewritten as MatMul + Add
    unflattened: int = 0  # Reshape pairs removed around MatMuls
    reshape_targets: int = 0  # computed Reshape targets made constant
    expand_targets: int = 0  # computed Expand targets made constant (a decoder's key/value heads repeated)
    attention: int = 0  # decoder layers whose attention became GroupQueryAttention
    attention_refused: str = ""  # why none did, where it was tried
    nodes: int = 0  # nodes that run, after


def prepare(
    model: ir.Model, options: QuantizeOptions, source: str | os.PathLike[str] | None
) -> tuple[LMHead | None, list, Prepared]:
    """Gemm -> MatMul, simplify, then find the head and the body weights: (head, body weights, what was done).

    Raises InputError when there is nothing to quantize or no head where one is needed.
    ``onnxsmith quantize`` runs it on a throwaway copy first, to fail before any work.
    """
    gemms = GemmToMatMulPass()(model)
    prepared = Prepared(gemms=gemms.rewritten)
    infer_types(model)
    if options.simplify:
        unflatten = UnflattenMatMulPass()(model)
        fold = FoldShapesPass(evaluate_constants(model, constants_to_evaluate(model)))(model)
        RemoveUnusedNodesPass()(model)
        infer_types(model)
        prepared.unflattened, prepared.reshape_targets, prepared.expand_targets = (
            unflatten.rewritten,
            fold.reshapes,
            fold.expands,
        )
    if options.attention:
        # as fuse prepares a graph for its rules: dims they can compare, the no-op Reshape before the heads merge gone
        NameDimsPass()(model)
        apply_rules(model, "no-op Reshape", noop_reshape_rules)
        fused = apply_rules(model, "decoder attention", decoder_attention_rules)
        prepared.attention, prepared.attention_refused = fused.matched, fused.reason
        RemoveUnusedNodesPass()(model)
        LowerToOpsetPass()(model)  # the rule writes Shape(start, end), an opset-15 form
        infer_types(model)
    prepared.nodes = count_nodes(model)
    try:
        head = find_lm_head(model)
    except InputError as err:
        if options.head != "keep" or options.last_token:
            raise refuse_headless(err, options, source) from None
        head = None
    body = quantizable_weights(model, {head.matmul} if head else set())
    if not body:
        raise refuse_no_weights(source)
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
