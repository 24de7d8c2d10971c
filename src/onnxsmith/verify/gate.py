"""The one gate: whether a variant's outputs are close enough to its source's.

Every command that judges a variant decides here: the transforms before they write one,
``compare``, ``validate --task generic``, ``extract`` and ``build``. The same two models on
the same inputs get the same verdict from each.

A variant that stores or computes in a coarser number format than its source differs from
it by that format's rounding, amplified by the model, in proportion to the magnitude of
what is computed. So the bounds are relative, scaled by the unit roundoff u of the format
the two models differ in (:func:`onnxsmith.analysis.number_formats.compared_format`), and
each output is judged against its own magnitude. With ε = 64·u (fp16: 2^-5), every float
output must have:

* no NaN/inf the source does not have at the same places (no option accepts them);
* direction: cosine(source, variant) >= 1 - ε²/2 (fp16: 0.99951);
* magnitude: RMS(variant) / RMS(source) within 1 ± ε (an output scaled by 1.1 has cosine 1);
* every value: |Δ| <= rtol · (|value| + m) with rtol = 8·ε (fp16: 0.25), where m is the
  magnitude of the value's channel: the root mean square of the slices through the value
  (the smallest along any axis whose slices hold at least 16 values), at least 1/1024 of
  the whole output's and at least the format's smallest normal number (below it fp16 holds
  values with fewer bits: its error there is absolute). So a detector's class scores (0..1)
  are not judged against its box coordinates (0..640), nor a logit near zero against the
  largest one: a local defect (a shifted bias in the score head) fails where cosine cannot
  see it.

fp32 and fp64 count as 18-bit formats: reordered fp32 arithmetic (a fused kernel, a folded
constant) moves the outputs of an ill-conditioned model far more than one rounding
(measured: the face-age ViT-L, whose residual stream carries 1.5e5, moves by up to 1.3e-4 of
a value's magnitude under fusion). The constants are set from the real-model corpus (the
worst fp16 variants there need 1/4 of the direction and 1/3 of the value budget) and from
deliberately broken variants (a flipped sign, a shifted bias), which fail.

Argmax agreement (over the last axis) is measured and reported: where the source's top two
values are further apart than twice the allowed |Δ|, the bounds let no argmax move.

Each bound can be set instead (``--min-cosine``; ``--rtol``; ``--atol``: an absolute |Δ| in
place of rtol·m; the magnitude follows the cosine bound). A refusal is one line: the worst
output's cosine, argmax agreement and worst value, and the options that would accept it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from onnxsmith.analysis.number_formats import FP32, NumberFormat
from onnxsmith.core.errors import InputError

#: ε = DIRECTION_UNITS · u: the relative error the direction and magnitude bounds allow.
DIRECTION_UNITS = 64
#: rtol = VALUE_FACTOR · ε: a single value may be off by this much more than the output as a whole.
VALUE_FACTOR = 8
#: fp32 and fp64 are judged as if they had this many bits (see the module doc).
FINEST_BITS = 18
#: A channel's magnitude is at least this share of the whole output's RMS.
CHANNEL_FLOOR = 1 / 1024
#: An axis defines channels when each of its slices holds at least this many values.
CHANNEL_VALUES = 16


@dataclass(frozen=True)
class GateOptions:
    """The bounds a user (or a transform) sets explicitly; None: from the compared format."""

    min_cosine: float | None = None
    rtol: float | None = None
    atol: float | None = None

    def __post_init__(self) -> None:
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise ValueError(f"min_cosine must be in [-1, 1], not {self.min_cosine}")
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be a non-negative number, not {value}")


@dataclass(frozen=True)
class Bounds:
    """What every float output must meet (see the module doc)."""

    format: str  # the compared format, e.g. "fp16"
    min_cosine: float
    rtol: float
    atol: float | None = None  # None: rtol times the value's channel magnitude
    explicit: tuple[str, ...] = ()  # which bounds were set rather than derived
    smallest_magnitude: float = 0.0  # the format's smallest normal number: no channel is judged as smaller

    @classmethod
    def for_format(cls, fmt: NumberFormat = FP32, options: GateOptions | None = None) -> Bounds:
        options = options or GateOptions()
        unit = max(fmt.unit_roundoff, 2.0**-FINEST_BITS)
        eps = DIRECTION_UNITS * unit
        derived = {"min_cosine": 1 - eps * eps / 2, "rtol": VALUE_FACTOR * eps, "atol": None}
        given = {k: v for k, v in asdict(options).items() if v is not None}
        return cls(
            fmt.name, **{**derived, **given}, explicit=tuple(sorted(given)), smallest_magnitude=fmt.smallest_normal
        )

    @property
    def magnitude(self) -> float:
        """How far the RMS may move, relative: the error the cosine bound allows, sqrt(2·(1 - min_cosine))."""
        return math.sqrt(2 * max(0.0, 1 - self.min_cosine))

    def describe(self) -> str:
        values = (
            f"|Δ| <= {self.atol:g} + {self.rtol:g}·|value|"
            if self.atol is not None
            else (f"|Δ| <= {self.rtol:g}·(|value| + its channel's RMS)")
        )
        origin = f"set: {', '.join(self.explicit)}; " if self.explicit else ""
        return (
            f"{origin}{self.format}: cosine >= {format_cosine(self.min_cosine)}, "
            f"RMS within ±{self.magnitude:.3g}, {values}"
        )

    def to_json(self) -> dict:
        return {**asdict(self), "explicit": list(self.explicit), "magnitude": self.magnitude}


@dataclass
class OutputDiff:
    """One output of the variant against the source's: what was measured and the verdict."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    mean_abs: float
    cosine: float | None
    nonfinite_ref: int
    nonfinite_test: int
    argmax_agreement: float | None  # share of rows (last axis) whose argmax agrees
    passed: bool
    magnitude: float | None = None  # RMS(variant) / RMS(source)
    worst: float = 0.0  # max over values of |Δ| / allowed (> 1: a value outside its bound)
    worst_at: tuple[int, ...] = ()  # (input set, *index) of that value
    worst_ref: float = 0.0  # the source's value there
    worst_delta: float = 0.0  # |Δ| there
    worst_allowed: float = 0.0  # the |Δ| allowed there
    argmax_rows: int = 0
    failed: list[str] = field(default_factory=list)  # "nonfinite", "cosine", "magnitude", "values"
    needed: dict[str, float] = field(default_factory=dict)  # option -> the value that would accept it

    def to_json(self) -> dict:
        data = asdict(self)
        data["shape"] = list(self.shape)
        data["worst_at"] = list(self.worst_at)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}

    def problem(self, bounds: Bounds) -> str:
        """What is wrong with this output, for one line (empty when it passed)."""
        if self.passed:
            return ""
        if "nonfinite" in self.failed:
            return f"output '{self.name}' has {self.nonfinite_test} NaN/inf values (the source {self.nonfinite_ref})"
        parts = []
        if self.cosine is not None:
            part = f"cosine {format_cosine(self.cosine)}"
            if "cosine" in self.failed:
                part += f" < {format_cosine(bounds.min_cosine)}"
            parts.append(part)
        if "magnitude" in self.failed and self.magnitude is not None:
            parts.append(f"RMS {self.magnitude:.4g}x the source's (±{bounds.magnitude:.3g} allowed)")
        if self.argmax_agreement is not None:
            parts.append(f"argmax {self.argmax_agreement:.1%} of {self.argmax_rows} rows")
        if "values" in self.failed:
            at = ", ".join(str(i) for i in self.worst_at[1:])
            parts.append(
                f"|Δ| {self.worst_delta:.3g} at [{at}] (source {self.worst_ref:.4g}) > "
                f"{self.worst_allowed:.3g} allowed there"
            )
        return f"output '{self.name}': " + ", ".join(parts)


def format_cosine(value: float) -> str:
    """A cosine with enough digits to show its distance from 1 (0.99871, 0.9999999702)."""
    gap = 1 - value
    digits = 4 if gap <= 0 else max(4, math.ceil(-math.log10(gap)) + 2)
    return f"{value:.{digits}f}"


def judge_output(name: str, ref: np.ndarray, test: np.ndarray, bounds: Bounds) -> OutputDiff:
    """Measure and judge one output; the arrays stack the input sets on a leading axis."""
    if ref.shape != test.shape:
        raise InputError(f"output '{name}' has shape {test.shape[1:]}, the reference {ref.shape[1:]}")
    shape = tuple(int(d) for d in ref.shape[1:])
    if ref.dtype.kind not in "fc" and test.dtype.kind not in "fc":
        mismatched = int(np.count_nonzero(ref != test))
        largest = float(np.max(np.abs(ref.astype(np.float64) - test.astype(np.float64)))) if mismatched else 0.0
        diff = OutputDiff(name, shape, str(test.dtype), largest, mismatched / max(ref.size, 1), None, 0, 0, None, True)
        if mismatched:
            diff.passed, diff.failed = False, ["values"]
        return diff
    a = ref.astype(np.float64)
    b = test.astype(np.float64)
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    both = finite_a & finite_b
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is not a difference: compared below
        delta = np.where(both, np.abs(a - b), 0.0)
    diff = OutputDiff(
        name,
        shape,
        str(test.dtype),
        float(delta.max(initial=0.0)),
        float(delta[both].mean()) if both.any() else 0.0,
        None,
        int((~finite_a).sum()),
        int((~finite_b).sum()),
        None,
        True,
    )
    # Non-finite values must match exactly (same NaN/inf places and values): new ones fail, whatever the bounds.
    if not (np.array_equal(~finite_a, ~finite_b) and np.array_equal(a[~finite_a], b[~finite_b], equal_nan=True)):
        diff.failed.append("nonfinite")
    if a.ndim >= 2 and a.shape[-1] >= 2 and both.all():  # axis 0 stacks the input sets
        diff.argmax_agreement = float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
        diff.argmax_rows = int(a.size // a.shape[-1])
    if not both.any():
        diff.passed = not diff.failed
        return diff
    ref_finite = np.where(both, a, 0.0)
    ref_rms = math.sqrt(float(np.mean(ref_finite[both] ** 2)))
    test_rms = math.sqrt(float(np.mean(b[both] ** 2)))
    if ref_rms == 0:  # an all-zero output has no direction and no magnitude to keep: its values decide
        diff.cosine = 1.0 if test_rms == 0 else None  # (all zeros on both sides: identical)
    else:
        va, vb = a[both], b[both]
        diff.cosine = float(np.dot(va, vb) / (np.linalg.norm(va) * np.linalg.norm(vb))) if test_rms > 0 else 0.0
        diff.magnitude = test_rms / ref_rms
        if diff.cosine < bounds.min_cosine:
            diff.failed.append("cosine")
        if abs(diff.magnitude - 1) > bounds.magnitude:
            diff.failed.append("magnitude")
    channel = np.maximum(channel_magnitude(ref_finite, both), bounds.smallest_magnitude)
    floor = np.abs(ref_finite) * bounds.rtol
    allowed = floor + (bounds.atol if bounds.atol is not None else bounds.rtol * channel)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(delta > 0, delta / allowed, 0.0)
    index = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    diff.worst = float(ratio[index])
    diff.worst_at = tuple(int(i) for i in index)
    diff.worst_ref = float(a[index])
    diff.worst_delta = float(delta[index])
    diff.worst_allowed = float(np.broadcast_to(allowed, ratio.shape)[index])
    if diff.worst > 1:
        diff.failed.append("values")
    diff.passed = not diff.failed
    if not diff.passed and "nonfinite" not in diff.failed:
        diff.needed = _needed(diff, bounds, delta, ref_finite, channel)
    return diff


def channel_magnitude(ref: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each value's channel magnitude (see the module doc), broadcastable to ``ref``; axis 0 stacks input sets."""
    count = max(int(valid.sum()), 1)
    whole = math.sqrt(float(np.sum(ref**2)) / count)
    magnitude = None
    for axis in range(1, ref.ndim):
        if ref.shape[axis] < 2 or ref.size // ref.shape[axis] < CHANNEL_VALUES:
            continue
        others = tuple(i for i in range(ref.ndim) if i != axis)
        counts = np.maximum(np.sum(valid, axis=others, keepdims=True), 1)
        rms = np.sqrt(np.sum(ref**2, axis=others, keepdims=True) / counts)
        magnitude = rms if magnitude is None else np.minimum(magnitude, rms)
    if magnitude is None:
        return np.full((1,) * ref.ndim, whole)
    return np.maximum(magnitude, CHANNEL_FLOOR * whole)


def severity(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], bounds: Bounds) -> float:
    """How far ``candidate``'s outputs are outside ``bounds`` (the largest ratio of measured to allowed
    error over every output; <= 1 passes, inf for new NaN/inf): what a repair measures its choices with."""
    worst = 0.0
    for name, ref in reference.items():
        diff = judge_output(name, ref, candidate[name], bounds)
        if "nonfinite" in diff.failed:
            return math.inf
        score = _severity(diff, bounds)
        if not diff.passed and diff.cosine is None and score <= 1:  # integers that differ: graded by how many
            score = 1.0 + diff.mean_abs
        worst = max(worst, score)
    return worst


def _needed(diff: OutputDiff, bounds: Bounds, delta, ref, channel) -> dict[str, float]:
    """The value of each failing bound's option that would accept this output."""
    needed: dict[str, float] = {}
    if "cosine" in diff.failed or "magnitude" in diff.failed:
        cosine = min(diff.cosine, 1 - (diff.magnitude - 1) ** 2 / 2)
        digits = max(4, math.ceil(-math.log10(max(1 - cosine, 1e-300))) + 2)
        needed["min_cosine"] = math.floor(cosine * 10**digits) / 10**digits
    if "values" in diff.failed:
        rtol = None
        if bounds.atol is None and np.any(ref != 0):
            with np.errstate(divide="ignore", invalid="ignore"):
                rtol = _round_up(float(np.max(np.where(delta > 0, delta / (np.abs(ref) + channel), 0.0))))
        if rtol is not None and rtol <= 1:
            needed["rtol"] = rtol
        else:  # an absolute bound: where the source's output is all zeros, or errors beyond the values themselves
            needed["atol"] = _round_up(float(np.max(delta - bounds.rtol * np.abs(ref))))
    return needed


def _round_up(value: float) -> float:
    """``value`` rounded up to two significant digits."""
    if value <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(value)) - 1)
    return math.ceil(value / scale * (1 - 1e-12)) * scale


def verdict(outputs: list[OutputDiff], bounds: Bounds) -> str:
    """One line on why the outputs fail: the worst output, then the options that would accept them."""
    failing = [o for o in outputs if not o.passed]
    if not failing:
        return ""
    nonfinite = [o for o in failing if "nonfinite" in o.failed]
    worst = nonfinite[0] if nonfinite else max(failing, key=lambda o: _severity(o, bounds))
    line = worst.problem(bounds)
    if len(failing) > 1:
        line += f" (and {len(failing) - 1} more of {len(outputs)} outputs)"
    if nonfinite:
        return line + "; no bound accepts NaN/inf"
    options: dict[str, float] = {}
    for o in failing:
        for option, value in o.needed.items():
            pick = min if option == "min_cosine" else max
            options[option] = pick(options.get(option, value), value)
    if options:
        flags = " ".join(f"--{k.replace('_', '-')} {_plain(v)}" for k, v in sorted(options.items()))
        line += f"; {flags} would accept it"
    return line


def _severity(o: OutputDiff, bounds: Bounds) -> float:
    """How far an output is outside its bounds: the largest ratio of measured to allowed error."""
    score = o.worst
    if o.cosine is not None and bounds.min_cosine < 1:
        score = max(score, math.sqrt(max(0.0, 1 - o.cosine) / (1 - bounds.min_cosine)))
    if o.magnitude is not None and bounds.magnitude > 0:
        score = max(score, abs(o.magnitude - 1) / bounds.magnitude)
    return score


def _plain(value: float) -> str:
    return f"{value:.12g}"
