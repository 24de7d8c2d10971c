"""The ``generic`` task's settings (the engine: :mod:`onnxsmith.tasks.generic`, which checks ``shape`` and
``input_role`` further with the parsers of runtime/ and analysis/)."""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxsmith.core.options import same_option
from onnxsmith.settings import TaskSettings
from onnxsmith.settings.gate import GateOptions
from onnxsmith.settings.inputs import InputOptions


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
    # The inputs and the gate as every verifying command declares them (settings/inputs.py, settings/gate.py).
    input_role: list[str] | None = same_option(InputOptions, "input_role")
    samples: int = same_option(InputOptions, "samples")
    seed: int = same_option(InputOptions, "seed")
    shape: list[str] | None = same_option(InputOptions, "shape")
    min_cosine: float | None = same_option(GateOptions, "min_cosine")
    rtol: float | None = same_option(GateOptions, "rtol")
    atol: float | None = same_option(GateOptions, "atol")
    min_agreement: float | None = same_option(GateOptions, "min_agreement")


GENERIC = TaskSettings(
    "generic",
    "any model: raw outputs judged by the gate the transforms use (cosine, magnitude, each value, NaN/inf)",
    GenericOptions,
)
