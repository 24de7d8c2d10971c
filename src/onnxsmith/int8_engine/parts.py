"""The parts int8 may take (Linears, embedding tables, Convs), what decided each, and the bounds it decides by."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnxsmith.int8_engine.measure import InputStats
from onnxsmith.passes.quantize_convs import ConvPlan

#: Error-compensated rounding needs calibration rows (vectors over all calibration inputs) of at least this
#: share of a Linear's input width K; MiniLM's 128 rows for K 384 helped, a T5's 8 for K 256 hurt.
COMPENSATION_ROWS = 0.25
#: Smoothing strengths tried per input.
ALPHAS: tuple[float, ...] = (0.5, 0.75, 0.9)
#: The form label of an input's outlier channels kept out of the int8 product (passes/quantize_linears.py).
OUTLIERS = "outliers"
#: Linears smaller than this on either side stay fp32 (nothing to gain).
MIN_SIDE = 16
#: Convs with fewer multiply-adds per output (input channels per group x kernel) stay fp32: QLinearConv
#: measured about as fast as the fp32 Conv at 16-64, 1.5x at 96-144, 2-3.5x from 256 (docs/int8.md),
#: and each int8 Conv between fp32 ops adds a QuantizeLinear and layout changes.
MIN_CONV_DEPTH = 128
#: A Conv whose output fp32 ops read (not another int8 Conv) and that does less than this share of the
#: multiply-adds int8 could speed up stays fp32: QLinearConv rounds its output to one uint8 scale, and fp32
#: readers get that rounding for at most this share of speed. The ViT's patch embedding (0.25 % of a ViT-L's
#: multiply-adds, output range 65 at RMS 5) moved the face-age fixture's ages 0.06 years by that rounding alone.
MIN_CONV_SHARE = 0.01


@dataclass
class Decision:
    """What happened to one Linear, and the measurements that decided it."""

    name: str
    k: int
    n: int
    rows: int  # vectors multiplied per run on the calibration input
    outlier_ratio: float  # max / median of the input's per-channel max |x|
    role: str = ""
    # form (a smoothing alpha, OUTLIERS, None: plain) -> measured per-layer error
    errors: dict = field(default_factory=dict)
    offered: float | str | None = None  # the form offered (it cuts the input's error most, by the gain), if any
    offered_smoothing: float | None = None  # the smoothing alpha offered (what folds into a LayerNorm), if any
    form: float | str | None = None  # the form used: a smoothing alpha, OUTLIERS, or None (plain)
    outliers: tuple[int, ...] = ()  # the input channels the OUTLIERS form keeps in fp32
    piece: str = ""  # the end-to-end measurement that decided it
    piece_error: float | None = None
    int8: bool = False
    reason: str = ""
    kind: str = ""  # the reason's kind, for the summary line
    compensated: bool = False  # its int8 weight rounded with error compensation
    few_rows: bool = False  # too few calibration rows for its width to compensate the rounding (COMPENSATION_ROWS)

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.k * self.n

    def row(self) -> dict:
        plain = self.errors.get(None)
        return {
            "linear": self.name,
            "K x N": f"{self.k}x{self.n}",
            "rows": self.rows,
            "input outlier ratio": round(self.outlier_ratio, 1),
            "layer error": "-" if plain is None else f"{plain:.4f}",
            "smoothing": _form_text(self.form, self.outliers, self.errors),
            "end-to-end error": "-" if self.piece_error is None else f"{self.piece_error:.2e} ({self.piece})",
            "int8": "yes" if self.int8 else "no",
            "rounding": ("error-compensated" if self.compensated else "nearest") if self.int8 else "-",
            "why": self.reason,
        }


def _form_text(form, outliers: tuple[int, ...], errors: dict) -> str:
    if form is None:
        return "-"
    error = f" ({errors[form]:.4f})" if form in errors else ""
    if form == OUTLIERS:
        return f"channel(s) {', '.join(map(str, outliers))} fp32 beside it{error}"
    return f"alpha {form:g}{error}"


@dataclass
class ConvDecision:
    """What happened to one Conv, and the measurements that decided it."""

    name: str
    shape: tuple[int, ...]  # the weight's: out channels, in channels per group, kernel
    group: int
    relu: bool  # its output quantized after the Relu that follows it
    input_range: tuple[float, float] | None = None
    output_range: tuple[float, float] | None = None
    elements: int = 0  # of its output on the calibration input
    plan: ConvPlan | None = None
    role: str = ""
    piece: str = ""
    piece_error: float | None = None
    int8: bool = False
    reason: str = ""
    kind: str = ""

    @property
    def depth(self) -> int:
        """Multiply-adds per output value: input channels per group x kernel size."""
        _, per_group, *kernel = self.shape
        return per_group * int(np.prod(kernel))

    @property
    def flops(self) -> int:
        return 2 * self.elements * self.depth

    def row(self) -> dict:
        def span(r):
            return "-" if r is None else f"{r[0]:.3g}..{r[1]:.3g}"

        return {
            "conv": self.name,
            "weight": "x".join(map(str, self.shape)) + (f" group {self.group}" if self.group > 1 else ""),
            "input range": span(self.input_range),
            "output range": span(self.output_range) + (" (after Relu)" if self.relu else ""),
            "end-to-end error": "-" if self.piece_error is None else f"{self.piece_error:.2e} ({self.piece})",
            "int8": "yes" if self.int8 else "no",
            "why": self.reason,
        }


def vectors_per_sample(feeds: dict[str, np.ndarray]) -> int:
    """Vectors per sample: the leading dim of the first input (1 for a scalar)."""
    first = next(iter(feeds.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


def outlier_ratio(stats: InputStats | None) -> float:
    if stats is None or not stats.channel_absmax.size:
        return 0.0
    median = float(np.median(stats.channel_absmax))
    peak = float(stats.channel_absmax.max())
    return peak / median if median > 0 else (float("inf") if peak > 0 else 1.0)
