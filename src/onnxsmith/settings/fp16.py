"""``fp16``'s settings (the engine: :mod:`onnxsmith.precision`, under :mod:`onnxsmith.transforms.fp16`)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxsmith.core.options import option
from onnxsmith.settings import TransformSettings

#: Keep fp32 every tensor whose measured max |x| is over fp16's largest value divided by this.
DEFAULT_HEADROOM = 4.0


@dataclass
class Fp16Options:
    keep_io_types: bool = option(True, "keep the model's float inputs and outputs fp32")
    headroom: float = option(
        DEFAULT_HEADROOM, "keep fp32 every tensor whose measured max |x| is over 65,504 / headroom"
    )
    rescale_residual: bool | None = option(
        None,
        "carry an overflowing pre-LN residual stream scaled by a power of two so it and "
        "what writes it fit fp16 (automatic: when the stream is carried in fp16)",
    )
    residual_fp32: bool = option(
        True,
        "keep an overflowing residual stream, and the branch that writes its massive "
        "activation, fp32 end to end (more accurate than carrying it rescaled in fp16)",
    )
    small_fp32: bool = option(
        True,
        "keep fp32 the nodes whose tensors are tiny next to the largest activation "
        "(a readout on the pooled token): fp16 saves nothing there",
    )
    # No bf16 option: the precision engine can write bf16, but a variant is only written verified, and
    # onnxruntime's CPU provider has no bf16 kernels (the storage-faithful run emulates fp16 only).

    def validate(self) -> None:
        if not self.headroom >= 1.0:
            raise ValueError(f"headroom must be at least 1, not {self.headroom}")


FP16 = TransformSettings(
    "fp16",
    "weights and compute to fp16, with fp32 islands where measured ranges overflow (never NaN)",
    Fp16Options,
    on_engines=True,
)
