"""The inputs the models are run on: declared once, read by every verifying command and API call.

Each field is a flag of ``fp16``, ``fuse``, ``shrink``, ``int8``, ``extract`` and ``compare`` (``--samples``;
``feeds`` is ``--inputs``, also ``--calib``, and ``extract``'s ``--input-data``) and a keyword of every
verifying API call (``onnxsmith.fp16(..., samples=8)``: ``api.VerifySettings`` is this dataclass, its
``feeds``, ``shape`` and ``input_role`` widened to what a call may pass besides strings). core/options.py
renders both. ``samples``' default is each command's own (cli/common.add_input_options).
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxsmith.core.options import COUNT, POSITIVE, check_numbers, option
from onnxsmith.settings.run import DEFAULT_SEED

#: How the inputs' flags are introduced in ``--help`` (``extract`` says what its source is run on for).
INPUTS_TITLE = "inputs the models are run on"


@dataclass(frozen=True)
class InputOptions:
    """The input sets a command calibrates and verifies on: ``feeds``, else ``samples`` made-up sets
    seeded from ``seed`` and sized by ``shape``; ``input_role`` corrects what an input was taken to be."""

    feeds: str | None = option(
        None,
        "run on these arrays (an .npz named like the model's inputs), or a folder of .npz files, images, "
        "audio (.wav) or text (.txt): one input set each (default: --samples made-up input sets)",
        metavar="NPZ|DIR",
        flag="inputs",
        aliases=("calib",),
    )
    samples: int = option(4, "how many random input sets to run", number=POSITIVE)
    seed: int = option(DEFAULT_SEED, "seed of the random inputs", number=COUNT)
    shape: list[str] | None = option(
        None,
        "shape of an input with symbolic dims, or a size for a named symbolic dim",
        repeat=True,
        metavar="NAME:D0,D1|DIM=N",
    )
    input_role: list[str] | None = option(
        None,
        "correct what an input was taken to be (docs/inputs.md): image, waveform, mel or generic; an image's layout "
        "NCHW|NHWC and values 0..255|0..1|normalized, e.g. x=NHWC,0..255; a condition's range 0..1|0..255; a mel "
        "spectrogram's log scale ln|log10|ln-power",
        repeat=True,
        metavar="NAME=WORD,...",
    )

    def __post_init__(self) -> None:
        check_numbers(self)
