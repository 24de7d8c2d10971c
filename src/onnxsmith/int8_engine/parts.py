"""The parts int8 may take (Linears, embedding tables, Convs) as immutable records: what was measured of each, and
its one decision; the bounds the engine decides by.

A :class:`Part` is made once per part when the engine finds it and replaced, never edited, as each step decides:
``part.measured(...)`` gives a copy with more measurements, ``part.decided(...)`` one with its decision changed.
A plan is a mapping from names to parts (:data:`Parts`); each step returns a new one (:func:`replaced`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

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
#: The form label of weights in all 8 bits (uint8: exact, a slower kernel) where int8 within pairs is the default.
WIDE = "8-bit weights"
#: ... offered where they cut an input's Linears' int8 error by this share (a slower kernel, nothing fitted) ...
WIDE_GAIN = 0.05
#: ... and their error is within this factor of the best other form's.
WIDE_PREFERRED = 1.1
#: Linears smaller than this on either side stay fp32 (nothing to gain).
MIN_SIDE = 16
#: Convs with fewer multiply-adds per output (input channels per group x kernel) stay fp32: QLinearConv
#: measured about as fast as the fp32 Conv at 16-64, 1.5x at 96-144, 2-3.5x from 256 (docs/int8.md),
#: and each int8 Conv between fp32 ops adds a QuantizeLinear and layout changes.
MIN_CONV_DEPTH = 128
#: A Conv whose output fp32 ops read (not another int8 Conv) and that does less than this share of the
#: multiply-adds int8 could speed up stays fp32: QLinearConv rounds its output to one uint8 scale, and fp32
#: readers get that rounding for at most this share of speed (docs/int8.md: the ViT patch embedding).
MIN_CONV_SHARE = 0.01

#: A Linear's int8 form: a smoothing alpha, OUTLIERS, WIDE, or None (plain).
Form = float | str | None


@dataclass(frozen=True)
class Decision:
    """What became of one part, and why: the one decision each part carries."""

    int8: bool = False
    reason: str = ""  # why it stays fp32, or what chose it
    kind: str = ""  # the reason's kind, for the summary line ("too small", "end-to-end error", ...)
    piece: str = ""  # the end-to-end measurement that decided it
    piece_error: float | None = None
    form: Form = None  # a Linear's form used
    compensated: bool = False  # a Linear's int8 weight rounded with error compensation


@dataclass(frozen=True)
class LinearFacts:
    """What was measured of a Linear."""

    k: int
    n: int
    rows: int  # vectors multiplied per run on the calibration input
    outlier_ratio: float  # max / median of the input's per-channel max |x|
    errors: Mapping[Form, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))  # form -> error
    offered: Form = None  # the form that cuts the input's error most, by the gain, if any
    offered_smoothing: float | None = None  # the smoothing alpha offered (what folds into a LayerNorm), if any
    outliers: tuple[int, ...] = ()  # the input channels the OUTLIERS form keeps in fp32
    few_rows: bool = False  # too few calibration rows for its width to compensate the rounding (COMPENSATION_ROWS)


@dataclass(frozen=True)
class TableFacts:
    """An embedding table: its shape and fp32 bytes."""

    shape: tuple[int, int]
    nbytes: int


@dataclass(frozen=True)
class ConvFacts:
    """What was measured of a Conv."""

    shape: tuple[int, ...]  # the weight's: out channels, in channels per group, kernel
    group: int
    relu: bool  # its output quantized after the Relu that follows it
    input_range: tuple[float, float] | None = None
    output_range: tuple[float, float] | None = None
    elements: int = 0  # of its output on the calibration input
    plan: ConvPlan | None = None  # its int8 form, where it is a candidate

    @property
    def depth(self) -> int:
        """Multiply-adds per output value: input channels per group x kernel size."""
        _, per_group, *kernel = self.shape
        return per_group * int(np.prod(kernel))


Facts = LinearFacts | TableFacts | ConvFacts


@dataclass(frozen=True)
class Part:
    """One Linear, table or Conv: its name, role, what was measured of it and its decision."""

    kind: Literal["linear", "table", "conv"]
    name: str
    facts: Any  # LinearFacts, TableFacts or ConvFacts, by kind
    role: str = ""
    decision: Decision = Decision()

    @property
    def int8(self) -> bool:
        return self.decision.int8

    @property
    def candidate(self) -> bool:
        """Nothing has ruled it out yet."""
        return not self.decision.reason

    @property
    def flops(self) -> int:
        """Multiply-adds (x2) on the calibration input (a table's: none)."""
        f = self.facts
        if self.kind == "linear":
            return 2 * f.rows * f.k * f.n
        if self.kind == "conv":
            return 2 * f.elements * f.depth
        return 0

    def measured(self, **facts: Any) -> Part:
        return dataclasses.replace(self, facts=dataclasses.replace(self.facts, **facts))

    def decided(self, **decision: Any) -> Part:
        return dataclasses.replace(self, decision=dataclasses.replace(self.decision, **decision))

    def row(self) -> dict[str, Any]:
        """Its row of the report's table of its kind."""
        return {"linear": _linear_row, "table": _table_row, "conv": _conv_row}[self.kind](self)


#: The parts of a model by name: a plan, as each step of the engine leaves it.
Parts = Mapping[str, Part]


def replaced(parts: Parts, changed: Mapping[str, Part]) -> dict[str, Part]:
    """``parts`` with those in ``changed`` replaced, in the same order."""
    return {name: changed.get(name, part) for name, part in parts.items()}


def of_kind(parts: Parts, kind: str) -> list[Part]:
    return [p for p in parts.values() if p.kind == kind]


def _linear_row(part: Part) -> dict[str, Any]:
    f, d = part.facts, part.decision
    plain = f.errors.get(None)
    return {
        "linear": part.name,
        "K x N": f"{f.k}x{f.n}",
        "rows": f.rows,
        "input outlier ratio": round(f.outlier_ratio, 1),
        "layer error": "-" if plain is None else f"{plain:.4f}",
        "form": _form_text(d.form, f.outliers, f.errors),
        "end-to-end error": "-" if d.piece_error is None else f"{d.piece_error:.2e} ({d.piece})",
        "int8": "yes" if d.int8 else "no",
        "rounding": ("error-compensated" if d.compensated else "nearest") if d.int8 else "-",
        "why": d.reason,
    }


def _table_row(part: Part) -> dict[str, Any]:
    f = part.facts
    return {
        "table": part.name,
        "rows x width": "x".join(map(str, f.shape)),
        "MB (fp32)": round(f.nbytes / 1e6, 2),
        "int8": "yes" if part.int8 else "no",
    }


def _conv_row(part: Part) -> dict[str, Any]:
    f, d = part.facts, part.decision

    def span(r):
        return "-" if r is None else f"{r[0]:.3g}..{r[1]:.3g}"

    return {
        "conv": part.name,
        "weight": "x".join(map(str, f.shape)) + (f" group {f.group}" if f.group > 1 else ""),
        "input range": span(f.input_range),
        "output range": span(f.output_range) + (" (after Relu)" if f.relu else ""),
        "end-to-end error": "-" if d.piece_error is None else f"{d.piece_error:.2e} ({d.piece})",
        "int8": "yes" if d.int8 else "no",
        "why": d.reason,
    }


def _form_text(form: Form, outliers: tuple[int, ...], errors: Mapping[Form, float]) -> str:
    if form is None:
        return "-"
    error = f" ({errors[form]:.4f})" if form in errors else ""
    if form == OUTLIERS:
        return f"channel(s) {', '.join(map(str, outliers))} fp32 beside it{error}"
    if form == WIDE:
        return f"{WIDE} (uint8, a slower kernel){error}"
    return f"smoothed, alpha {form:g}{error}"


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
