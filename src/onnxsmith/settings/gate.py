"""The one gate's bounds (verify/gate.py): declared once, read by every command, recipe variant and API call.

Each field is a flag (``--min-cosine``), a key of a recipe's variant (``min_cosine = 0.99``) and a keyword of
every verifying API call (``onnxsmith.fp16(..., min_cosine=0.99)``); core/options.py renders all three.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxsmith.core.options import COSINE, SHARE, TOLERANCE, check_numbers, option

#: Greedy generation of a cached decoder (tasks/lm/gate.py): what share of the source's tokens a variant repeats
#: before its first divergence, on average over the prompts, unless told.
DEFAULT_MIN_GENERATION = 0.5

#: How the gate's options are introduced where they are listed (``--help``, docs/recipe.md).
GATE_TITLE = (
    "verification gate (default: scaled by the format the models differ in, e.g. fp16: cosine >= 0.99951, "
    "RMS within ±3.1 %, |Δ| <= 0.25·(|value| + its channel's RMS))"
)


@dataclass(frozen=True)
class GateOptions:
    """The bounds a user (or a transform) sets explicitly; None: from the compared format (docs/gate.md)."""

    min_cosine: float | None = option(None, "every float output's cosine to the source's at least this", number=COSINE)
    rtol: float | None = option(
        None, "relative bound on each value: |Δ| <= RTOL·(|value| + its channel's RMS)", number=TOLERANCE
    )
    atol: float | None = option(
        None, "absolute bound on each value instead: |Δ| <= ATOL + RTOL·|value|", number=TOLERANCE
    )
    min_agreement: float | None = option(
        None,
        "integer outputs: this share of values equal; detection lists: of confident rows matched "
        "(automatic: 1 at fp32, 0.99 at a coarser format)",
        number=SHARE,
    )

    min_generation: float | None = option(
        None,
        "a causal LM with a KV cache: the mean share of the source's greedy tokens the variant repeats before it "
        f"first differs, from prompts the source writes (automatic: {DEFAULT_MIN_GENERATION})",
        number=SHARE,
    )

    def __post_init__(self) -> None:
        check_numbers(self)
