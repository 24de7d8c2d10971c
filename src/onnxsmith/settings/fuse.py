"""``fuse``'s settings (the engine: :mod:`onnxsmith.fuse_engine`, on :mod:`onnxsmith.rules`)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxsmith.core.options import option
from onnxsmith.settings import TransformSettings


@dataclass
class FuseOptions:
    precision: str = option(
        "fp32",
        "fp16: MatMul, attention, RoPE and BiasGelu in fp16, residual stream and LayerNorms fp32; "
        "fp32: the same graph in fp32 (for CPU)",
        choices=["fp32", "fp16"],
    )
    static_dims: list[str] = option(
        help="symbolic input dims to fix at the size of the inputs given with --shape (e.g. height,width); "
        "every other dim stays dynamic",
        default_factory=list,
    )
    prune_rows: bool = option(True, "compute only the token rows the outputs read (the CLS row of the last block)")


FUSE = TransformSettings(
    "fuse",
    "fuse a transformer into ONNX Runtime's MultiHeadAttention, RotaryEmbedding, SkipLayerNorm, BiasGelu",
    FuseOptions,
)
