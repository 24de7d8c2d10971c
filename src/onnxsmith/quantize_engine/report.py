"""What quantize did, in the words the report and the console show: the notes (what each step did, what each
runtime needs), why not more, the weights table and the numbers, and the refusals of a model it cannot take."""

from __future__ import annotations

import os
from collections import Counter

import onnx_ir as ir

from onnxsmith.core.errors import InputError
from onnxsmith.core.transform import StepReport
from onnxsmith.rules.decoder_attention import LIMITS as ATTENTION_LIMITS
from onnxsmith.runtime.lm_feeds import DECODE_PAST
from onnxsmith.settings.quantize import QuantizeOptions

#: The session options onnxruntime-web (WASM) needs to run the ``qdq`` format at fp32 speed.
WASM_CONFIG = {"session.disable_quant_qdq": "1"}
#: Session options per target, for the report and the card.
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
            "several times slower than the source on a 50k vocabulary); for native CPU make --target cpu",
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

#: Why int8 takes a causal LM with a KV cache this way (quantize_engine/engine.make_decoder_int8).
DECODER_INT8_NOTE = (
    "a causal LM with a KV cache: its MatMul weights int8 in blocks of 32 along K as MatMulNBits (int8 activations, "
    "accuracy level 4) and its tied embedding/head int8 per token, stored once; per-column int8 with one activation "
    "scale per tensor, what int8 does elsewhere, keeps an LLM's Linears fp32 (its outlier channels exceed the "
    "error budget). Judged as a language model, on text the source writes; --no-decoder: as any model"
)
#: What becomes of inputs a user gave int8 for a decoder.
DECODER_INPUTS_NOTE = (
    "the inputs given are not used: 8-bit weight blocks need no calibration, and the variant is judged on text the "
    "source writes (--no-decoder calibrates on them as for any model)"
)
#: The note of ``--last-token``.
LAST_TOKEN_NOTE = "logits for the last position only ([batch, 1, vocab]); generation reads nothing else"


def decode_speed(report: StepReport, given: float, variant: float) -> None:
    """The measured decode step (seconds per run of the model given and of the variant) in the report."""
    where = f"one token after {DECODE_PAST} cached, batch 1, onnxruntime CPU, {os.cpu_count() or 1} threads"
    speedup = given / variant
    report.notes.append(
        f"measured decode step ({where}): {given * 1e3:.2f} ms -> {variant * 1e3:.2f} ms, {speedup:.2f}x the model given"
    )
    if speedup < 1.0:
        report.why_not_more.insert(
            0, f"a decode step measured no faster than the model given here: {speedup:.2f}x ({where})"
        )
    report.stats["measured_speedup"] = speedup


def opset_note(current: int, target: int, blocked: bool) -> str:
    """The default opset raised (to 21 for blocked DequantizeLinear)."""
    return f"default opset {current} -> {target}" + (" (blocked DequantizeLinear)" if blocked else "")


def refuse_opset(current: int, target: int, err: Exception | None = None) -> InputError:
    """The refusal of a model the version converter cannot raise to ``target`` (``err``: what it raised)."""
    if err is not None:
        return InputError(f"cannot convert the model from opset {current} to {target}: {err}")
    return InputError(f"cannot convert the model from opset {current} to {target} (the converter refused)")


def refuse_headless(err: InputError, options: QuantizeOptions, source: str | os.PathLike[str] | None) -> InputError:
    """The refusal of a model without a findable LM head, with the flags that quantize it without one."""
    needs = "--head keep --no-last-token" if options.last_token else "--head keep"
    return InputError(f"{err.problem} (without a head, use {needs})", source)


def refuse_no_weights(source: str | os.PathLike[str] | None) -> InputError:
    """The refusal of a model with no weight to quantize."""
    return InputError("no MatMul or Gemm with a constant 2-D weight to quantize", source)


def prepared_notes(gemms: int, simplify: tuple[int, int, int, int, int] | None) -> list[str]:
    """What :func:`~onnxsmith.quantize_engine.engine.prepare` did: the Gemms rewritten and, with ``simplify``
    (Reshape pairs removed, Reshape and Expand targets made constant, nodes that run before and after), the graph
    made cheaper."""
    notes = [f"{gemms} Gemm(s) rewritten as MatMul + Add"] if gemms else []
    if simplify is not None:
        unflattened, reshape_targets, expand_targets, before, after = simplify
        notes.append(
            f"graph simplified: {unflattened} Reshape pair(s) around MatMuls removed, "
            f"{reshape_targets} computed Reshape and {expand_targets} Expand target(s) made constant; "
            f"{before} -> {after} nodes that run (Constant nodes not counted)"
        )
    return notes


def attention_note(layers: int, refused: str) -> str:
    """What became of the decoder layers' attention (``attention``)."""
    if layers:
        return f"{layers} decoder layer(s): attention and KV cache -> RotaryEmbedding + GroupQueryAttention"
    return f"attention not fused (GroupQueryAttention): {refused or 'no decoder layer of that form'}"


def weights_note(quantized: int, found: int, options: QuantizeOptions) -> str:
    """The report's first note: how many of the body's weights were quantized, and how."""
    return (
        f"{quantized} of {found} MatMul weight(s) quantized "
        f"({options.bits}-bit, block {options.block_size}, "
        f"{'symmetric' if options.symmetric else 'asymmetric'}, format {options.format})"
    )


def gemv_note(skipped: str, how: str, hidden: int, vocab: int) -> str:
    """The head laid out for a GEMV, or why not."""
    if skipped:
        return f"head not laid out for a GEMV: {skipped}"
    return (
        f"head weight is [1, {hidden}, {vocab}] ({how}): onnxruntime does "
        "not prepack it and runs the one-row head as a GEMV (faster decode)"
    )


def describe(
    report: StepReport,
    model: ir.Model,
    options: QuantizeOptions,
    *,
    head_quantized: bool,
    rows: list[dict],
    nodes: tuple[int, int],
    weight_bytes: tuple[int, int],
    quantized: int,
) -> None:
    """The numbers, the weights table, why not more, and what each target needs to run the variant.

    ``head_quantized``: the LM head is stored quantized (not ``--head keep``); ``nodes`` (that run) and
    ``weight_bytes``: (before, after).
    """
    report.stats["before_after"] = {"weight bytes": weight_bytes, "nodes that run": nodes}
    report.stats["nodes"] = {"before": nodes[0], "after": nodes[1]}
    report.stats["weight_bytes"] = {"before": weight_bytes[0], "after": weight_bytes[1]}
    report.stats["quantized_weights"] = quantized
    report.tables["weights"] = rows
    report.why_not_more = why_not_more(model, options, rows, weight_bytes[1])
    if options.format == "qdq" and head_quantized:
        report.why_not_more.append(
            "made for onnxruntime-web (WASM, DequantizeLinear folded at load); native onnxruntime would "
            "dequantize the whole head on every call (slower than the source): for native CPU make --target cpu"
        )
    report.stats["targets"] = TARGETS[options.format]
    if options.format == "qdq":
        report.runtime.update(WASM_CONFIG)
        report.notes.append(
            "onnxruntime-web (WASM): create the session with session.disable_quant_qdq=1 "
            "(it folds the DequantizeLinear at load: fp32 speed); without it WASM runs ~10x slower"
        )


def why_not_more(model: ir.Model, options: QuantizeOptions, rows: list[dict], total: int) -> list[str]:
    """What quantize left wider than the scheme, and why: the headline's lines after the size."""
    lines = []
    scheme = (f"{options.bits}-bit", "int8") if options.bits == 8 else (f"{options.bits}-bit",)
    wider = Counter(row["stored as"] for row in rows if not any(s in row["stored as"] for s in scheme))
    lines += [f"{n} weight(s) stored as {how}" for how, n in sorted(wider.items())]
    params = quantization_parameters(model)
    fp32 = {
        name: v.const_value.nbytes
        for name, v in model.graph.initializers.items()
        if v.const_value is not None and v.const_value.dtype == ir.DataType.FLOAT
    }
    kept = sum(size for name, size in fp32.items() if name not in params)
    scales = sum(size for name, size in fp32.items() if name in params)
    if total and scales / total >= 0.05:
        lines.append(
            f"{scales / 2**20:.1f} MB of the {total / 2**20:.1f} MB are the blocks' fp32 scales and zero points "
            f"(or grid offsets), one each per block of {options.block_size}"
        )
    if total and kept / total >= 0.05:
        lines.append(
            f"{kept / 2**20:.1f} MB of the {total / 2**20:.1f} MB of weights stay fp32: "
            "what no MatMul reads as a weight (biases, norms, position embeddings)"
        )
    if any(node.op_type == "GroupQueryAttention" for node in model.graph):
        lines.append(ATTENTION_LIMITS)
    return lines


#: Ops that read a quantized weight, and the input index from which on they read its quantization parameters.
_QUANTIZED_READERS = {"DequantizeLinear": 1, "MatMulNBits": 2, "GatherBlockQuantized": 2}


def quantization_parameters(model: ir.Model) -> set[str]:
    """Initializers that are scales, zero points or grid offsets of quantized weights (not weights kept fp32): the
    parameters of a DequantizeLinear / MatMulNBits / GatherBlockQuantized, and a grid's block offsets
    (passes/quantization.py), added to a dequantized weight's blocks (``Add(Reshape(DequantizeLinear(levels)),
    offsets)``) or to a MatMulNBits product (``Add(MatMulNBits(x, levels), MatMul(block sums, offsets))``)."""
    names = set()
    for node in model.graph:
        first = _QUANTIZED_READERS.get(node.op_type)
        if first is not None:
            names.update(v.name for v in node.inputs[first:] if v is not None and v.is_initializer())
        elif node.op_type == "Add" and any(_dequantized_blocks(v) for v in node.inputs):
            names.update(v.name for v in node.inputs if v is not None and v.is_initializer())
        elif node.op_type == "Add" and any(_producer_type(v) == "MatMulNBits" for v in node.inputs):
            offsets = [v.producer() for v in node.inputs if _producer_type(v) == "MatMul"]
            names.update(
                v.name for m in offsets if m is not None for v in m.inputs if v is not None and v.is_initializer()
            )
    return {name for name in names if name is not None}


def _producer_type(value: ir.Value | None) -> str | None:
    producer = value.producer() if value is not None else None
    return None if producer is None else producer.op_type


def _dequantized_blocks(value: ir.Value | None) -> bool:
    reshape = value.producer() if value is not None else None
    if reshape is None or reshape.op_type != "Reshape" or reshape.inputs[0] is None:
        return False
    source = reshape.inputs[0].producer()
    return source is not None and source.op_type == "DequantizeLinear"
