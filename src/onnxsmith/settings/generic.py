"""The ``generic`` task's settings (the engine: :mod:`onnxsmith.tasks.generic`, which checks ``shape`` and
``input_role`` further with the parsers of runtime/ and analysis/)."""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxsmith.core.options import option
from onnxsmith.settings import TaskSettings
from onnxsmith.settings.gate import GateOptions
from onnxsmith.settings.run import DEFAULT_SEED


@dataclass
class GenericOptions:
    data: str | None = field(
        default=None,
        metadata={
            "help": "an .npz of inputs, or a folder of them, or of images, audio (.wav) or text (.txt): one input set "
            "each (default: seeded plausible inputs)",
            "path": True,
        },
    )
    input_role: list[str] = option(
        help="correct what an input was taken to be: image, waveform or generic; an image's layout "
        "NCHW|NHWC and values 0..255|0..1|normalized (e.g. x=NHWC,0..255)",
        default_factory=list,
        repeat=True,
        metavar="NAME=WORD,...",
    )
    samples: int = option(4, "random input sets when there is no data")
    seed: int = option(DEFAULT_SEED, "seed of the random inputs")
    shape: list[str] = option(
        help="the shape of an input with symbolic dims, or a size for a named symbolic dim",
        default_factory=list,
        repeat=True,
        metavar="NAME:D0,D1|DIM=N",
    )
    min_cosine: float | None = option(None, "the gate: every float output's cosine to the source's at least this")
    rtol: float | None = option(None, "the gate: |Δ| <= RTOL·(|value| + its channel's RMS) for every value")
    atol: float | None = option(None, "the gate: an absolute bound on each value instead, |Δ| <= ATOL + RTOL·|value|")
    min_agreement: float | None = option(
        None, "the gate: integer outputs' share of equal values, detection lists' share of matched rows"
    )

    def validate(self) -> None:
        if self.samples < 1:
            raise ValueError("samples must be >= 1")
        if self.seed < 0:
            raise ValueError("seed must be >= 0")
        GateOptions(self.min_cosine, self.rtol, self.atol, self.min_agreement)  # ValueError on a bound out of range


GENERIC = TaskSettings(
    "generic",
    "any model: raw outputs judged by the gate the transforms use (cosine, magnitude, each value, NaN/inf)",
    GenericOptions,
)
