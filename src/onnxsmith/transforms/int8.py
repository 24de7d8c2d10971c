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
calibration inputs (int8/measure.py, analysis/int8_policy.py), never from op types; the engine is
:mod:`onnxsmith.int8_engine` (int8/engine.py), this module its declaration:

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
   calibration input (int8/speed.py); the report gives the measured speed-up, and says first when
   it is no faster. With ``--keep-fast`` (opt-in: the variant then depends on the machine's timing, not the
   same bytes everywhere), a variant not faster by 5% has the groups of int8 parts (the Convs, the Linears of
   a role, the tables) without which it is faster kept fp32 (analysis/int8_policy.keep_fast).

int8 weights are rounded with error compensation (GPTQ, from the Gram matrices of the Linears' inputs on
the calibration inputs; ``--no-compensate-rounding``: to nearest). Opt-in: ``--two-pass-activations`` (each
Linear's activation quantized twice, ``x ≈ Q(x) + Q(x - Q(x))``: ~100x less activation rounding error for a
second int8 GEMM). Both are the forms the search measures and the rewrite makes (docs/int8.md).

A causal LM with a KV cache (a decoder as optimum and transformers.js export it: analysis/lm_signature.py
``cache_layout``) is taken as decoders are (``--no-decoder``: as any model): per-column int8 with one activation
scale per tensor keeps an LLM's Linears fp32 (its outlier channels exceed any budget), so every MatMul weight goes
int8 in blocks of 32 as MatMulNBits with int8 activations and the tied embedding/head int8 per token, once
(quantize_engine.make_decoder_int8); the variant is judged as a language model (tasks/lm/gate.py: next-token KL,
top-1 agreement and greedy generation on text the source writes itself, ``--max-kl``, ``--min-top1``,
``--min-generation``).

The budget defaults to 0.3 of what the gate allows (relative error sqrt(2 (1 - min_cosine)):
0.03 for cosine 0.995): room for inputs the calibration did not see (calibrated on random
inputs, the face-age fixture's ages move ~0.9 years at 0.03 and ~1.4 at 0.05 on real crops). The variant is verified against the source by the one gate
(verify/gate.py) at int8's bounds: every output's cosine >= ``--min-cosine``, no new NaN/inf (a recipe's task gates apply on top in build).
"""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from onnxsmith.analysis.lm_signature import cache_layout
from onnxsmith.core.errors import UsageError
from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.int8_engine.engine import make_int8
from onnxsmith.quantize_engine.engine import make_decoder_int8
from onnxsmith.settings.int8 import INT8, Int8Options

#: The options by their short name.
Options = Int8Options


@register
class Int8(Transform, settings=INT8):
    judged_on_unseen = True  # its Convs' activation scales are the calibration inputs' ranges
    measured_as = "int8"  # its search measures ranked rows, audio and labels with the gate (int8_engine/search.py)

    def repairs(self, options: Options) -> bool:
        return not options.two_pass_activations  # two passes leave ~100x less activation rounding error

    def gate_task_for(self, model: ir.Model, options: Options) -> str | None:
        return "lm" if as_decoder(model, options) else None

    def task_gate_settings(self, options: Options) -> dict:
        # A decoder's: on text the source writes, not the made-up inputs that calibrate int8 elsewhere.
        bounds = {"max_kl": options.max_kl, "min_top1": options.min_top1, "min_generation": options.min_generation}
        return {**bounds, "sample_from_source": True}

    def gate_settings(self, options: Options) -> dict:
        # The one gate (verify/gate.py) at int8's bounds, with the direction bound this transform promises.
        return {"min_cosine": options.min_cosine}

    def apply(self, model: ir.Model, options: Options, context: TransformContext) -> StepReport:
        if as_decoder(model, options):
            if not options.speed:
                return make_decoder_int8(model, context, self.name)
            with context.model_file(model) as given:
                return make_decoder_int8(model, context, self.name, Path(given))
        if not options.speed:
            return make_int8(model, options, context, None, self.name)
        with context.model_file(model) as given:  # the model as given: what the variant's speed is measured against
            return make_int8(model, options, context, Path(given), self.name)


def as_decoder(model: ir.Model, options: Options) -> bool:
    """Whether ``model`` is taken as a causal LM with a KV cache (``--decoder``: it must be one)."""
    if options.decoder is False:
        return False
    if cache_layout(model) is not None:
        return True
    if options.decoder:
        raise UsageError("--decoder: the model is not a causal LM with a KV cache (ids and past in, logits out)")
    return False
