"""``int8``'s settings (the engine under :mod:`onnxsmith.transforms.int8`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxsmith.core.options import option
from onnxsmith.settings import TransformSettings
from onnxsmith.settings.lm import lm_gate_bound

#: The default error budget's share of the relative output error the cosine gate allows.
GATE_SHARE = 0.3


@dataclass
class Int8Options:
    error_budget: float | None = option(
        None,
        "relative output error (||Δ|| / ||source||, worst output) the int8 parts may cause together on "
        "the calibration inputs (default: 0.3 of what the gate allows, 0.03 for --min-cosine 0.995)",
    )
    max_runs: int = option(24, "end-to-end runs of the calibration inputs the search may take (more only to trim)")
    smooth_gain: float = option(
        0.25, "offer smoothing (SmoothQuant) for an input when it cuts its Linears' error by this share"
    )
    sensitivity: bool = option(
        True, "measure the outputs' error and keep fp32 what --error-budget needs (else: all int8)"
    )
    max_layer_error: float = option(
        0.1, "with --no-sensitivity: a Linear whose own int8 error is above this stays fp32"
    )
    min_cosine: float = option(0.995, "the gate: every output's cosine to the source's at least this")
    # How the int8 Linears are made (docs/int8.md).
    compensate_rounding: bool = option(
        True,
        "round int8 weights with error compensation (GPTQ): each row's rounding error spread over the rows not "
        "yet rounded, weighted by the calibration inputs' XᵀX (measured less error than rounding to nearest on "
        "MiniLM and the face-age ViTs, even calibrated on random inputs; docs/int8.md)",
    )
    two_pass_activations: bool = option(
        False,
        "quantize each int8 Linear's activation in two passes (x ≈ Q(x) + Q(x - Q(x)), two int8 GEMMs): "
        "~100x less activation rounding error, for about half the int8 speed-up",
    )
    # What goes int8 besides the Linears the search chooses.
    tables: bool = option(True, "store embedding tables (read by Gather) in int8, one scale per row")
    convs: bool | None = option(
        None,
        "Convs int8 too (QLinearConv), with static activation scales from the calibration inputs' ranges "
        "(default: when those are real inputs, --inputs or a recipe's task data, or made-up ones like the real "
        "thing whose value ranges the model or --input-role states; random ones give scales real data overflows)",
    )
    speed: bool = option(
        True,
        "time the variant against the model given on the first calibration input (onnxruntime CPU, threads = "
        "cores) and report the measured speed-up (the variant's bytes do not depend on it)",
    )
    keep_fast: bool = option(
        False,
        "keep fp32 the int8 parts (the Convs, the Linears of a role, the tables) that --speed measures not to make "
        "the variant faster by 5%: the variant then depends on this machine's timing (not the same bytes everywhere)",
    )

    # A causal LM with a KV cache (transforms/int8.py): block-wise 8-bit weights, judged as a language model.
    decoder: bool | None = option(
        None,
        "a causal LM with a KV cache: every MatMul weight int8 in blocks of 32 (MatMulNBits, int8 activations) "
        "and the tied embedding/head int8 per token, judged by next-token KL, top-1 and greedy generation on "
        "text the source writes (default: when the model is one; --no-decoder: as any model)",
    )
    max_kl: float = lm_gate_bound("max_kl", 0.02, "a decoder's gate")
    min_top1: float = lm_gate_bound("min_top1", 0.9, "a decoder's gate")
    min_generation: float = lm_gate_bound("min_generation", 0.5, "a decoder's gate")

    def validate(self) -> None:
        if self.error_budget is not None and not self.error_budget > 0:
            raise ValueError(f"error_budget must be positive, not {self.error_budget}")
        if not 0 < self.min_cosine <= 1:
            raise ValueError(f"min_cosine must be in (0, 1], not {self.min_cosine}")
        if not 0 <= self.smooth_gain < 1:
            raise ValueError(f"smooth_gain must be in [0, 1), not {self.smooth_gain}")
        if self.keep_fast and not self.speed:
            raise ValueError("keep_fast needs speed (it acts on the timing)")
        if self.max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, not {self.max_runs}")

    def budget(self) -> float:
        """The error budget: given, or 0.3 of the relative error the cosine gate allows."""
        if self.error_budget is not None:
            return self.error_budget
        return GATE_SHARE * math.sqrt(2.0 * (1.0 - self.min_cosine)) if self.min_cosine < 1 else 1e-6


INT8 = TransformSettings(
    "int8",
    "Linear layers, embedding tables and Convs int8 where measured error allows, for onnxruntime on CPU",
    Int8Options,
    on_engines=True,
)
