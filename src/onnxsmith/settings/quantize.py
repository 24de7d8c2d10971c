"""``quantize``'s settings (the engine: :mod:`onnxsmith.quantize_engine`, under transforms/quantize.py)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxsmith.core.options import option
from onnxsmith.settings import TransformSettings
from onnxsmith.settings.lm import lm_gate_bound

#: How 4-bit blocks are stored: blocked DequantizeLinear (web/WASM) or com.microsoft MatMulNBits.
FORMATS = ("qdq", "nbits")
#: Where the model runs, and what quantize makes for there unless told: (format, MatMulNBits accuracy level).
#: web-wasm: DequantizeLinear that onnxruntime-web folds at load; web-webgpu: MatMulNBits, which its WebGPU
#: backend runs as it is (fp32 activations); cpu: MatMulNBits with int8 activations, what native onnxruntime
#: runs fastest. Each is run on its runtime: benchmarks/quantize_smollm2.py, tests/test_web_client.py.
TARGETS: dict[str, tuple[str, int | None]] = {
    "web-wasm": ("qdq", None),
    "web-webgpu": ("nbits", None),
    "cpu": ("nbits", 4),
}
DEFAULT_TARGET = "web-wasm"
#: Targets whose decoders get GroupQueryAttention unless told (``attention``): native onnxruntime generates one
#: sequence at a time; a web page's transformers.js may batch left-padded prompts, which it masks otherwise.
ATTENTION_TARGETS = ("cpu",)
#: What becomes of a weight whose K is not a multiple of the block.
UNEVEN = ("int8", "keep")
#: How the LM head (and the embedding it shares) is stored.
HEAD_MODES = ("int8", "q4", "keep")
#: How the lookups read a tied table (passes/tied_head.py).
LOOKUPS = ("columns", "rows")


@dataclass
class QuantizeOptions:
    scheme: str = option("q4", "weight bits of the body", choices=["q4", "q8"])
    block_size: int = option(32, "weights per quantization block along K (power of two, >= 16)")
    symmetric: bool = option(False, "symmetric blocks (no zero points)")
    target: str | None = option(
        None,
        "where the model runs: web-wasm (blocked DequantizeLinear that onnxruntime-web folds at load), web-webgpu "
        "(MatMulNBits, which onnxruntime-web's WebGPU backend runs), cpu (MatMulNBits with int8 activations, for "
        "native onnxruntime); it picks --format and --accuracy-level "
        f"(default: {DEFAULT_TARGET})",
        choices=list(TARGETS),
    )
    # None until __post_init__: then the target's (a str); given, it must be what the target runs.
    format: str = option(
        None,
        "qdq: blocked DequantizeLinear (web/WASM); nbits: com.microsoft MatMulNBits (native CPU, WebGPU) "
        "(default: the target's)",
        choices=list(FORMATS),
    )
    accuracy_level: int | None = option(
        None,
        "MatMulNBits accuracy_level (nbits format): 0 fp32 activations, 4 int8 (default: the target's)",
        choices=[0, 1, 2, 3, 4],
    )
    head: str = option(
        "int8", "LM head (and embedding): int8 per token, q4 blocks (ablation), keep", choices=list(HEAD_MODES)
    )
    lookups: str = option(
        "auto",
        "a tied table's layout: columns (one fp32 copy at run time), rows (faster lookups, the runtime "
        "folds a transposed copy for the head), auto: rows for a model without a KV cache",
        choices=["auto", *LOOKUPS],
    )
    uneven: str = option(
        "int8", "a weight whose K is not a multiple of the block: int8 per column, or keep it", choices=list(UNEVEN)
    )
    last_token: bool = option(True, "compute the logits of the last position only")
    simplify: bool = option(
        True,
        "drop shape arithmetic the source redoes on every call (Reshape pairs around MatMuls, "
        "computed Reshape and Expand targets)",
    )
    attention: bool | None = option(
        None,
        "fuse each decoder layer's attention and KV cache into GroupQueryAttention with RotaryEmbedding "
        "(rules/decoder_attention.py: it masks causally and by the count of ones in attention_mask, padding on the "
        f"right only) (default: on for --target {', '.join(ATTENTION_TARGETS)})",
    )
    gemv_head: bool = option(
        True, "store the head as [1, hidden, vocab] so onnxruntime runs it as a GEMV at one row (faster decode)"
    )
    # The defaults are the lm gate's (tasks/lm/gate.py DEFAULT_MAX_KL, DEFAULT_MIN_TOP1, DEFAULT_MIN_GENERATION).
    max_kl: float = lm_gate_bound("max_kl", 0.1)
    min_top1: float = lm_gate_bound("min_top1", 0.8)
    min_generation: float = lm_gate_bound("min_generation", 0.5)

    def __post_init__(self) -> None:
        fmt, level = TARGETS.get(self.target or DEFAULT_TARGET, TARGETS[DEFAULT_TARGET])  # unknown: validate says
        if self.format is None:
            self.format = fmt
        if self.accuracy_level is None and self.format == fmt:
            self.accuracy_level = level
        if self.attention is None:
            self.attention = (self.target or DEFAULT_TARGET) in ATTENTION_TARGETS

    @property
    def bits(self) -> int:
        return 4 if self.scheme == "q4" else 8

    def validate(self) -> None:
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two, at least 16")
        if self.target is not None and self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {self.target!r}")
        if self.target is not None and self.format != TARGETS[self.target][0]:
            raise ValueError(
                f"--format {self.format} is not what --target {self.target} runs ({TARGETS[self.target][0]}): "
                "give one of them"
            )
        if self.accuracy_level is not None and self.format != "nbits":
            raise ValueError("accuracy_level applies to --format nbits only")
        if not self.max_kl > 0:
            raise ValueError("max_kl must be > 0")


QUANTIZE = TransformSettings(
    "quantize", "4-bit / 8-bit weights for a language model (web-ready; see docs/quantize.md)", QuantizeOptions
)
