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

fp32 and fp64 count as 17-bit formats: reordered fp32 arithmetic (a fused kernel, a folded
constant) moves the outputs of an ill-conditioned model far more than one rounding
(measured: the face-age ViT-L, whose residual stream carries 1.5e5, moves by up to 1.3e-4 of
a value's magnitude under fusion; its small fixture, fused, on photo crops rather than noise:
cosine 1 - 6.7e-8, over the 1 - 3e-8 an 18-bit budget allows). The constants are set from the real-model corpus (the
worst fp16 variants there need 1/4 of the direction and 1/3 of the value budget) and from
deliberately broken variants (a flipped sign, a shifted bias), which fail.

Argmax agreement (over the last axis) is measured and reported: where the source's top two
values are further apart than twice the allowed |Δ|, the bounds let no argmax move.

Structured outputs (:mod:`onnxsmith.verify.structure`) are judged for what they are. Integer
outputs (labels, token ids, indices) by their agreement: the share of values equal to the source's,
at least ``min_agreement`` (1 at fp32: equal; 0.99 at a coarser format, where a near tie may flip).
A detection list (boxes, score, class; ranked by score or not) by matching its rows: every confident
row of either side (score >= 1/4 of the list's best, at most 100) must find a row of the same class
with IoU >= 1 - 3·ε (fp16: 0.906; at least 0.5, at most 0.99) among the other side's, in at least
``min_agreement`` of the rows; the matched rows' values are then judged as a tensor's (each column a
channel). Near-tied scores reorder a ranked list under any rounding; matched rows do not move.
A top-k's values as sorted lists and its indices as sets within near ties (:func:`judge_ranked`); a
CTC output's text by its character error rate (:func:`_judge_sequences`); a decoder's KV cache by the
next step's logits (:mod:`onnxsmith.verify.cache`, run by :func:`onnxsmith.verify.compare.compare_models`).
Probabilities (a Softmax's distributions, a Sigmoid's map: told by the source's values,
:func:`onnxsmith.verify.structure.probability_kind`) are judged for what they mean as well: a
probability's scale is 1, so no value's channel is taken below the probability bound
(``PROBABILITY_UNITS``·u: fp16 0.00098, int8 0.0078); their decisions (each value's side of 0.5, a
softmax's argmax) must agree in ``min_agreement`` of them (a source within the bound of the threshold is a
near tie, excused); and where only the direction or magnitude failed (a softmax: or a few of its values, its
argmax being its decision), an RMS |Δp| within the bound accepts them: on a text detector's map of 1e-7
everywhere (ppocr_det on a photo) cosine measures noise. Audio (a vocoder's speech:
:func:`onnxsmith.verify.structure.waveform`) keeps the direction and magnitude bounds, its SNR, and is judged
frame by frame in its spectrum instead of sample by sample (:func:`_judge_waveform`): a sample near a zero
crossing is no channel of its own, and what is heard is each short frame's spectrum, so each frame's
magnitude spectrum may be off by rtol·(that frame's magnitude + a typical frame's), as a value by
rtol·(|value| + m); a click in one frame fails where the whole output's cosine cannot see it.

Each bound can be set instead (``--min-cosine``; ``--rtol``; ``--atol``: an absolute |Δ| in
place of rtol·m; the magnitude follows the cosine bound; ``--min-agreement``). A refusal is one
line: the worst output's cosine, argmax agreement and worst value, and the options that would
accept it, but never a bound that would accept anything (a cosine below 0.9, an rtol above 1, an
atol above the output's RMS, an agreement below 90 %): a variant that far from its source is said
to be so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from onnxsmith.analysis.number_formats import FP32, NumberFormat
from onnxsmith.core.errors import InputError
from onnxsmith.core.text import format_cosine
from onnxsmith.settings.gate import DEFAULT_MIN_GENERATION, GateOptions
from onnxsmith.verify import structure

#: ε = DIRECTION_UNITS · u: the relative error the direction and magnitude bounds allow.
DIRECTION_UNITS = 64
#: rtol = VALUE_FACTOR · ε: a single value may be off by this much more than the output as a whole.
VALUE_FACTOR = 8
#: fp32 and fp64 are judged as if they had this many bits (see the module doc).
FINEST_BITS = 17
#: A channel's magnitude is at least this share of the whole output's RMS.
CHANNEL_FLOOR = 1 / 1024
#: An axis defines channels when each of its slices holds at least this many values.
CHANNEL_VALUES = 16
#: At a format coarser than fp32, this share of an integer output's values (or of the rows of a
#: detection list) may differ: a near tie flips under rounding. At fp32 they must be equal.
AGREEMENT_MISS = 0.01
#: A probability output's RMS |Δp| may be this many unit roundoffs (fp16: 2^-10 ≈ 0.00098, int8 0.0078, fp32
#: 1.5e-5): where it is, and its decisions agree, a low cosine alone does not refuse it (see the module doc).
PROBABILITY_UNITS = 2
#: Two detections are the same when their IoU is at least 1 - IOU_UNITS·ε, within [MIN_IOU, MAX_IOU].
IOU_UNITS = 3
MIN_IOU = 0.5
MAX_IOU = 0.99
#: Audio is judged in frames of this many samples (Hann-windowed, hop a quarter of it): 46 ms at 22.05 kHz.
WAVEFORM_FRAME = 1024
#: A refusal suggests no bound that would accept anything: a cosine below this, an rtol above
#: MAX_SUGGESTED_RTOL (a value may move by as much as it is), an atol above MAX_SUGGESTED_ATOL_SHARE
#: of the output's RMS (every value may move by as much as a typical one is), an agreement below this.
MIN_SUGGESTED_COSINE = 0.9
MAX_SUGGESTED_RTOL = 1.0
MAX_SUGGESTED_ATOL_SHARE = 1.0
MIN_SUGGESTED_AGREEMENT = 0.9


@dataclass(frozen=True)
class Bounds:
    """What every float output must meet (see the module doc)."""

    format: str  # the compared format, e.g. "fp16"
    min_cosine: float
    rtol: float
    atol: float | None = None  # None: rtol times the value's channel magnitude
    explicit: tuple[str, ...] = ()  # which bounds were set rather than derived
    smallest_magnitude: float = 0.0  # the format's smallest normal number: no channel is judged as smaller
    min_agreement: float = 1.0  # integer outputs: share of equal values; detection lists: share of matched rows
    min_iou: float = MAX_IOU  # two detections are the same when their IoU is at least this
    probability_rms: float = 0.0  # a probability output's RMS |Δp| at which a low cosine alone does not refuse
    min_generation: float = DEFAULT_MIN_GENERATION  # a cached decoder's greedy generation (release/variant.py)

    @classmethod
    def for_format(cls, fmt: NumberFormat = FP32, options: GateOptions | None = None) -> Bounds:
        options = options or GateOptions()
        unit = max(fmt.unit_roundoff, 2.0**-FINEST_BITS)
        eps = DIRECTION_UNITS * unit
        derived = {
            "min_cosine": 1 - eps * eps / 2,
            "rtol": VALUE_FACTOR * eps,
            "atol": None,
            "min_agreement": 1.0 if unit <= 2.0**-FINEST_BITS else 1 - AGREEMENT_MISS,
        }
        given = {k: v for k, v in asdict(options).items() if v is not None}
        return cls(
            fmt.name,
            **{**derived, **given},
            explicit=tuple(sorted(given)),
            smallest_magnitude=fmt.smallest_normal,
            min_iou=min(MAX_IOU, max(MIN_IOU, 1 - IOU_UNITS * eps)),
            probability_rms=PROBABILITY_UNITS * unit,
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
        labels = "equal" if self.min_agreement >= 1 else f"{self.min_agreement:.3g} agree"
        return (
            f"{origin}{self.format}: cosine >= {format_cosine(self.min_cosine)}, "
            f"RMS within ±{self.magnitude:.3g}, {values}; labels {labels}, detections IoU >= {self.min_iou:.3g}, "
            f"probabilities RMS |Δp| <= {self.probability_rms:.2g}, audio by each frame's spectrum"
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
    #: "nonfinite", "cosine", "magnitude", "values", "labels", "detections"
    failed: list[str] = field(default_factory=list)
    needed: dict[str, float] = field(default_factory=dict)  # option -> the value that would accept it
    kind: str = "tensor"  # what it was judged as: "tensor", "labels", "detections", "cache" (verify/cache.py)
    agreement: float | None = None  # labels: share of equal values; detections: share of confident rows matched
    detections: dict | None = None  # detections: rows matched, missing, extra, lowest IoU, largest |Δscore|
    #: cache (present.*): the measures above are the next step's logits'; here what judged it and its own cosine
    cache: dict | None = None
    sequences: dict | None = None  # CTC label sequences: how many equal after the collapse, the error rate
    #: probabilities: softmax or sigmoid, RMS |Δp| and its bound, decisions agreeing, whether a low cosine was waived
    probabilities: dict | None = None
    #: audio: its SNR, the frames judged and the worst frame's spectral error against what it may be
    waveform: dict | None = None

    def to_json(self) -> dict:
        data = asdict(self)
        data["shape"] = list(self.shape)
        data["worst_at"] = list(self.worst_at)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}

    def problem(self, bounds: Bounds) -> str:
        """What is wrong with this output, for one line (empty when it passed)."""
        if self.passed:
            return ""
        effect = ""
        if self.kind == "cache" and self.cache is not None:
            effect = f"{self.cache['outputs']} judged by the next step's logits: "
        if "nonfinite" in self.failed:
            if effect and not self.nonfinite_test:  # the cache is finite: the next step's logits are not
                return f"output '{self.name}': {effect}{self.cache['next_nonfinite']} NaN/inf values"
            return f"output '{self.name}' has {self.nonfinite_test} NaN/inf values (the source {self.nonfinite_ref})"
        parts = []
        if self.kind == "labels" and self.agreement is not None:
            parts.append(f"labels: {self.agreement:.2%} equal (at least {bounds.min_agreement:.2%} required)")
        if self.kind == "topk" and self.agreement is not None:
            parts.append(
                f"top-k indices: {self.agreement:.2%} the same within near ties "
                f"(at least {bounds.min_agreement:.2%} required)"
            )
        if self.sequences is not None:
            q = self.sequences
            parts.append(
                f"sequences: {q['equal']} of {q['sequences']} equal after CTC collapse, character error rate "
                f"{q['error_rate']:.2%} (at most {1 - bounds.min_agreement:.2%})"
            )
        if self.probabilities is not None and {"decisions", "cosine", "magnitude"} & set(self.failed):
            p = self.probabilities
            parts.append(
                f"{p['kind']} probabilities: RMS |Δp| {p['rms_delta']:.3g} (a low cosine is excused at most "
                f"{p['rms_bound']:.3g}), decisions {p['agreement']:.2%} the same "
                f"(at least {bounds.min_agreement:.2%} required)"
            )
        if self.waveform is not None and "spectrum" in self.failed:
            w = self.waveform
            parts.append(
                f"audio: frame {w['worst_frame']} of its spectrum off by {w['worst_error']:.3g} of that frame's "
                f"magnitude and a typical frame's (at most {bounds.rtol:.3g}), SNR {w['snr_db']:.1f} dB"
            )
        if self.detections is not None:
            d = self.detections
            part = (
                f"detections: {d['matched']} of {d['required']} matched (same class, IoU >= {bounds.min_iou:.3g}; "
                f"{d['missing']} of the source's missing, {d['extra']} new"
            )
            if d["matched"]:
                part += f"; lowest IoU {d['lowest_iou']:.3g}, |Δscore| up to {d['score_delta']:.3g}"
            parts.append(part + ")")
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
            if self.kind == "detections":  # the index is into the matched rows, not the output
                at = f"matched row {self.worst_at[1]}, column {self.worst_at[2]}"
            parts.append(
                f"|Δ| {self.worst_delta:.3g} at [{at}] (source {self.worst_ref:.4g}) > "
                f"{self.worst_allowed:.3g} allowed there"
            )
        return f"output '{self.name}': {effect}" + ", ".join(parts)


def judge_output(name: str, ref: np.ndarray, test: np.ndarray, bounds: Bounds) -> OutputDiff:
    """Measure and judge one output; the arrays stack the input sets on a leading axis.

    What the output is decides how (:mod:`onnxsmith.verify.structure`): integer labels by agreement,
    a detection list by matching rows, anything else as a tensor, value by value.
    """
    if ref.shape != test.shape:
        raise InputError(f"output '{name}' has shape {test.shape[1:]}, the reference {ref.shape[1:]}")
    frames = structure.ctc_frames(name, ref)
    if ref.dtype.kind not in "fc" and test.dtype.kind not in "fc":
        if frames is not None:
            return _judge_sequences(_judge_labels(name, ref, test, bounds), frames, test, bounds, replace_labels=True)
        return _judge_labels(name, ref, test, bounds)
    layout = structure.detection_layout(name, ref)
    if layout is not None:
        return judge_detections(layout, {name: ref}, {name: test}, bounds)[0]
    kind = structure.probability_kind(ref)
    channel = None
    if kind is not None:  # a probability's scale is 1: none is judged against a channel below the bound on |Δp|
        floor = max(bounds.smallest_magnitude, bounds.probability_rms)
        channel = np.maximum(channel_magnitude(ref.astype(np.float64), np.ones(ref.shape, bool)), floor)
    diff = judge_tensor(name, ref, test, bounds, channel=channel)
    if kind is not None and np.all(np.isfinite(test)):
        diff = _judge_probabilities(diff, kind, ref, test, bounds)
    if frames is not None and np.all(np.isfinite(test)):  # probabilities of a CTC recogniser: their text too
        diff = _judge_sequences(diff, frames, np.argmax(test, axis=-1), bounds, replace_labels=False)
    if bounds.atol is None and structure.waveform(ref) and np.all(np.isfinite(test)):
        diff = _judge_waveform(diff, ref, test, bounds)
    return diff


def _judge_waveform(diff: OutputDiff, ref: np.ndarray, test: np.ndarray, bounds: Bounds) -> OutputDiff:
    """Audio (judged as a tensor in ``diff``) judged by its spectrum instead of its samples (see the module doc):
    each frame's magnitude spectrum within rtol·(the frame's magnitude + the frames' RMS magnitude). The
    direction and magnitude bounds stay. An ``--atol`` (an absolute bound on samples) keeps the samples judged."""
    a = ref.astype(np.float64).reshape(-1, ref.shape[-1])
    b = test.astype(np.float64).reshape(-1, ref.shape[-1])
    magnitude, error = _frame_spectra(a, b)  # [signals, frames]
    typical = max(math.sqrt(float(np.mean(magnitude**2))), bounds.smallest_magnitude)
    relative = error / (magnitude + typical)
    flat = int(np.argmax(relative))
    signal, frame = np.unravel_index(flat, relative.shape)
    noise = float(np.sum((a - b) ** 2))
    failed = [f for f in diff.failed if f != "values"]
    worst = float(relative[signal, frame]) / bounds.rtol
    if worst > 1:
        failed.append("spectrum")
    # The options that would accept it, none where only a bound accepting anything would (see _needed).
    needed: dict[str, float] = {}
    far = False
    if {"cosine", "magnitude"} & set(failed):
        needed = _needed(replace(diff, failed=[f for f in failed if f != "spectrum"]), bounds, None, None, None)
        far = not needed
    if "spectrum" in failed:
        needed["rtol"] = _round_up(float(relative[signal, frame]))
        far = far or needed["rtol"] > MAX_SUGGESTED_RTOL
    at = np.unravel_index(int(signal), ref.shape[:-1])
    return replace(
        diff,
        kind="waveform",
        argmax_agreement=None,  # the loudest sample of a signal decides nothing
        argmax_rows=0,
        failed=failed,
        passed=not failed,
        needed={} if far else needed,
        worst=worst,
        worst_at=(*(int(i) for i in at), int(frame)),
        worst_ref=float(magnitude[signal, frame]),
        worst_delta=float(error[signal, frame]),
        worst_allowed=bounds.rtol * float(magnitude[signal, frame] + typical),
        waveform={
            "frames": int(relative.size),
            "frame_samples": WAVEFORM_FRAME,
            "worst_frame": int(frame),
            "worst_error": float(relative[signal, frame]),
            "snr_db": 10 * math.log10(float(np.sum(a * a)) / noise) if noise > 0 else math.inf,
        },
    )


#: Frames whose spectra are taken at once (32 MB of them): a minute of 48 kHz audio holds 11,000.
_FRAMES_AT_ONCE = 4096


def _frame_spectra(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([signals, frames] each Hann-windowed frame's magnitude spectrum's norm in ``a``, the norm of ``b``'s
    spectrum minus ``a``'s there), a few thousand frames at a time."""
    hop = WAVEFORM_FRAME // 4
    count = 1 + (a.shape[-1] - WAVEFORM_FRAME) // hop
    window = np.hanning(WAVEFORM_FRAME)
    magnitude, error = np.empty((len(a), count)), np.empty((len(a), count))
    for start in range(0, count, _FRAMES_AT_ONCE):
        frames = np.arange(start, min(count, start + _FRAMES_AT_ONCE))
        index = np.arange(WAVEFORM_FRAME)[None, :] + hop * frames[:, None]
        for row, (x, y) in enumerate(zip(a, b)):
            spectrum_a = np.abs(np.fft.rfft(x[index] * window, axis=-1))
            spectrum_b = np.abs(np.fft.rfft(y[index] * window, axis=-1))
            magnitude[row, frames] = np.linalg.norm(spectrum_a, axis=-1)
            error[row, frames] = np.linalg.norm(spectrum_b - spectrum_a, axis=-1)
    return magnitude, error


def _judge_probabilities(
    diff: OutputDiff, kind: structure.ProbabilityKind, ref: np.ndarray, test: np.ndarray, bounds: Bounds
) -> OutputDiff:
    """A probability output (:func:`onnxsmith.verify.structure.probability_kind`), judged as a tensor in
    ``diff``, judged for what it means too: its decisions (each value's side of 0.5, a softmax's argmax) must
    agree in ``bounds.min_agreement`` of them, near ties excused; and where only its direction or magnitude
    failed (a softmax's: or a few of its values), an RMS |Δp| within ``bounds.probability_rms`` accepts it.
    A probability's scale is 1, not the
    map's RMS: on a map of 1e-7 everywhere (a text detector on a photo) cosine measures noise."""
    a = ref.astype(np.float64)
    b = test.astype(np.float64)
    rms_delta = math.sqrt(float(np.mean((a - b) ** 2)))
    # A near tie: the source within the probability bound of the threshold (a softmax: its top two within
    # twice it of each other); not the tensor's ε·(|p| + channel), which at int8 ties everything in 0.25..0.75.
    margin = bounds.probability_rms
    ref_d, test_d = kind.decisions(a), kind.decisions(b)
    if kind.axis is None:
        tied = np.abs(a - 0.5) <= margin
    else:
        top2 = np.sort(a, axis=kind.axis)[(slice(None),) * kind.axis + (slice(-2, None),)]
        tied = np.diff(top2, axis=kind.axis).squeeze(kind.axis) <= 2 * margin
    moved = int(np.count_nonzero((ref_d != test_d) & ~tied))
    agreement = 1 - moved / max(ref_d.size, 1)
    # A softmax is decided by its argmax, which is checked: a few small probabilities beyond their own bound
    # (a CTC recogniser's 0.006 -> 0.009 in fp16, text and argmax the same) are within the RMS bound. A
    # sigmoid map's threshold is the user's (a text detector binarises at 0.3), so its values stay judged.
    waivable = {"cosine", "magnitude"} if kind.axis is None else {"cosine", "magnitude", "values"}
    directional = bool(diff.failed) and set(diff.failed) <= waivable
    waived = directional and rms_delta <= bounds.probability_rms and agreement >= bounds.min_agreement
    diff.probabilities = {
        "kind": kind.name,
        "rms_delta": rms_delta,
        "rms_bound": bounds.probability_rms,
        "decisions": int(ref_d.size),
        "agreement": agreement,
        "waived": waived,
    }
    if waived:
        diff.failed, diff.needed = [], {}
    if agreement < bounds.min_agreement:
        diff.failed.append("decisions")
        needed = _agreement_needed(agreement)
        diff.needed = {**diff.needed, **needed} if needed and (diff.needed or diff.failed == ["decisions"]) else {}
    allowed = 1 - bounds.min_agreement
    miss = 1 - agreement
    diff.worst = max(diff.worst, miss / allowed if allowed > 0 else (1 + miss if moved else 0.0))
    diff.passed = not diff.failed
    return diff


def _judge_sequences(
    diff: OutputDiff, ref_frames: np.ndarray, test_frames: np.ndarray, bounds: Bounds, *, replace_labels: bool
) -> OutputDiff:
    """A CTC output's text: its collapsed sequences (repeats merged, blanks dropped) must agree in
    ``bounds.min_agreement`` of their characters (1 - the character error rate). ``replace_labels``:
    integer frames, whose frame-by-frame agreement this replaces (a label moved within its run of frames
    is the same text); else probabilities, whose values are judged as a tensor's as well."""
    seq = structure.sequence_agreement(ref_frames, test_frames)
    agreement = max(0.0, 1 - seq.error_rate)
    diff.sequences = {
        "sequences": seq.sequences,
        "equal": seq.equal,
        "edits": seq.edits,
        "characters": seq.characters,
        "error_rate": seq.error_rate,
    }
    if replace_labels:
        diff.kind = "sequences"
        diff.failed = []
        diff.needed = {}
        diff.worst = 0.0
    diff.agreement = agreement
    if agreement < bounds.min_agreement:
        diff.failed.append("sequences")
        needed = _agreement_needed(agreement)
        diff.needed = {**diff.needed, **needed} if needed and (diff.needed or diff.failed == ["sequences"]) else {}
    allowed = 1 - bounds.min_agreement
    share = 1 - agreement
    diff.worst = max(diff.worst, share / allowed if allowed > 0 else (1 + share if seq.edits else 0.0))
    diff.passed = not diff.failed
    return diff


def judge_all(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], bounds: Bounds) -> list[OutputDiff]:
    """Every output of ``reference`` judged against ``candidate``'s, in the reference's order; a detection
    list written as separate outputs (boxes, scores, labels) is judged as one, each of them with its verdict."""
    for name, ref in reference.items():
        if ref.shape != candidate[name].shape:
            raise InputError(f"output '{name}' has shape {candidate[name].shape[1:]}, the reference {ref.shape[1:]}")
    grouped: dict[str, OutputDiff] = {}
    for layout in structure.separate_detections(reference):
        for diff in judge_detections(layout, reference, candidate, bounds):
            grouped[diff.name] = diff
    for pair in structure.ranked_pairs({k: v for k, v in reference.items() if k not in grouped}):
        for diff in judge_ranked(pair, reference, candidate, bounds):
            grouped[diff.name] = diff
    return [grouped.get(name) or judge_output(name, ref, candidate[name], bounds) for name, ref in reference.items()]


def judge_ranked(
    pair: structure.RankedPair, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], bounds: Bounds
) -> list[OutputDiff]:
    """A top-k (:func:`onnxsmith.verify.structure.ranked_pairs`): the values as sorted lists (the variant's
    rows sorted as the source's are, then judged as a tensor's), the indices as sets within each run of
    near-tied values (two neighbours within ε·(|value| + its channel's RMS) of each other's, added): which of two tied
    entries ranks first does not matter. At least ``bounds.min_agreement`` of the indices must agree."""
    ref_v, test_v = reference[pair.values], candidate[pair.values]
    ref_i, test_i = reference[pair.indices], candidate[pair.indices]
    if not np.all(np.isfinite(test_v.astype(np.float64))):  # NaN/inf are refused as a tensor's are
        return [judge_tensor(pair.values, ref_v, test_v, bounds), _judge_labels(pair.indices, ref_i, test_i, bounds)]
    order = np.argsort(-test_v if pair.descending else test_v, axis=-1, kind="stable")
    test_v = np.take_along_axis(test_v, order, axis=-1)
    test_i = np.take_along_axis(test_i, order, axis=-1)
    values = judge_tensor(pair.values, ref_v, test_v, bounds)
    values.kind = "topk"
    a = ref_v.astype(np.float64)
    channel = np.maximum(channel_magnitude(a, np.ones(a.shape, bool)), bounds.smallest_magnitude)
    allowed = np.broadcast_to(
        bounds.rtol * np.abs(a) + (bounds.atol if bounds.atol is not None else bounds.rtol * channel), a.shape
    )
    # Near ties: the typical error the output is allowed (ε, the direction bound's), not the worst single
    # value's (rtol = 8ε): at fp16 that would tie every entry of a short list with every other.
    allowed = allowed / VALUE_FACTOR
    tied = np.abs(np.diff(a, axis=-1)) <= allowed[..., :-1] + allowed[..., 1:]
    positions, agreed, excused = structure.index_agreement(a, ref_i, test_i, tied)
    indices = _judge_labels(pair.indices, ref_i, test_i, bounds)
    indices.kind = "topk"
    indices.agreement = (agreed + excused) / max(positions, 1)
    indices.failed, indices.needed = [], {}
    if indices.agreement < bounds.min_agreement:
        indices.failed = ["labels"]
        indices.needed = _agreement_needed(indices.agreement)
    allowed_miss = 1 - bounds.min_agreement
    miss = 1 - indices.agreement
    indices.worst = miss / allowed_miss if allowed_miss > 0 else (1 + miss if miss > 0 else 0.0)
    indices.passed = not indices.failed
    return [values, indices]


def _judge_labels(name: str, ref: np.ndarray, test: np.ndarray, bounds: Bounds) -> OutputDiff:
    """Integer outputs: the share of values equal to the source's, at least ``bounds.min_agreement``."""
    shape = tuple(int(d) for d in ref.shape[1:])
    mismatched = int(np.count_nonzero(ref != test))
    largest = float(np.max(np.abs(ref.astype(np.float64) - test.astype(np.float64)))) if mismatched else 0.0
    share = mismatched / max(ref.size, 1)
    diff = OutputDiff(name, shape, str(test.dtype), largest, share, None, 0, 0, None, True, kind="labels")
    diff.agreement = 1 - share
    if diff.agreement < bounds.min_agreement:
        diff.passed, diff.failed = False, ["labels"]
        diff.needed = _agreement_needed(diff.agreement)
    # How far outside: the share that differs over the share allowed; all-or-nothing when equality is asked.
    allowed = 1 - bounds.min_agreement
    diff.worst = share / allowed if allowed > 0 else (1 + share if mismatched else 0.0)
    return diff


def _agreement_needed(agreement: float) -> dict[str, float]:
    """The ``min_agreement`` that accepts ``agreement`` (rounded down), unless that would accept anything."""
    if agreement < MIN_SUGGESTED_AGREEMENT:
        return {}
    return {"min_agreement": math.floor(agreement * 10**4) / 10**4}


def judge_detections(
    layout: structure.DetectionLayout,
    reference: dict[str, np.ndarray],
    candidate: dict[str, np.ndarray],
    bounds: Bounds,
) -> list[OutputDiff]:
    """A detection list (one output, or separate ones: one verdict each) judged by matching rows.

    The confident rows of each side must find the same detections on the other side (class, IoU,
    :func:`onnxsmith.verify.structure.match_detections`) in ``bounds.min_agreement`` of the rows;
    the matched rows' values (boxes, score, class) are then judged as a tensor's, each column a channel.
    """
    names = layout.outputs
    nonfinite_ref = sum(int(np.count_nonzero(~np.isfinite(reference[n].astype(np.float64)))) for n in names)
    nonfinite_test = sum(int(np.count_nonzero(~np.isfinite(candidate[n].astype(np.float64)))) for n in names)
    if nonfinite_ref or nonfinite_test:  # judged value by value: NaN/inf are refused there
        return [judge_tensor(n, reference[n], candidate[n], bounds) for n in names]
    ref_lists = structure.detection_rows(layout, reference)
    test_lists = structure.detection_rows(layout, candidate)
    scores = np.concatenate([rows.scores for rows in ref_lists])
    live = scores[scores > 0]
    score_rms = max(math.sqrt(float(np.mean(live**2))) if live.size else 0.0, bounds.smallest_magnitude)

    def tolerance(values: np.ndarray) -> np.ndarray:
        """The |Δscore| the gate allows at each score (its channel: the list's scores)."""
        absolute = bounds.atol if bounds.atol is not None else bounds.rtol * score_rms
        return bounds.rtol * np.abs(values) + absolute

    match = structure.match_detections(ref_lists, test_lists, bounds.min_iou, tolerance)
    if match.reference:
        a = np.stack(match.reference)[None]
        b = np.stack(match.candidate)[None]
        columns = np.sqrt(np.mean(a**2, axis=1, keepdims=True))
        whole = math.sqrt(float(np.mean(a**2)))
        channel = np.maximum(np.maximum(columns, CHANNEL_FLOOR * whole), bounds.smallest_magnitude)
        base = judge_tensor(names[0], a, b, bounds, channel=channel)
    else:  # nothing confident on either side (every score zero): nothing to judge but that
        base = OutputDiff(names[0], (), "", 0.0, 0.0, None, 0, 0, None, True)
    base.argmax_agreement, base.argmax_rows = None, 0  # a row's argmax over box, score and class means nothing
    base.kind = "detections"
    base.agreement = match.share
    base.detections = {
        "required": match.required,
        "matched": match.matched,
        "missing": match.missing,
        "extra": match.extra,
        "excused": match.excused,
        "lowest_iou": match.lowest_iou,
        "score_delta": match.score_delta,
    }
    if match.share < bounds.min_agreement:
        base.failed.append("detections")
        base.passed = False
        needed = _agreement_needed(match.share)
        base.needed = {**base.needed, **needed} if needed and (base.needed or base.failed == ["detections"]) else {}
        base.worst = max(base.worst, (1 - match.share) / max(1 - bounds.min_agreement, AGREEMENT_MISS / 10))
    diffs = []
    for name in names:
        shape = tuple(int(d) for d in reference[name].shape[1:])
        diffs.append(replace(base, name=name, shape=shape, dtype=str(candidate[name].dtype), failed=list(base.failed)))
    return diffs


def judge_tensor(
    name: str, ref: np.ndarray, test: np.ndarray, bounds: Bounds, *, channel: np.ndarray | None = None
) -> OutputDiff:
    """A float output value by value (see the module doc); ``channel``: each value's channel magnitude,
    when it is known better than :func:`channel_magnitude` finds it."""
    shape = tuple(int(d) for d in ref.shape[1:])
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
    if channel is None:
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


def structured_outputs(reference: dict[str, np.ndarray]) -> list[str]:
    """The outputs the gate judges for what they are rather than value by value (verify/structure.py): ranked
    detection lists (one output, or boxes, scores and labels apart) and top-k pairs, matched; audio, by its SNR and
    frames' spectra; integer labels, by the share that agree (a class id's distance to another says nothing)."""
    names = [name for layout in structure.separate_detections(reference) for name in layout.outputs]
    names += [n for pair in structure.ranked_pairs(reference) for n in (pair.values, pair.indices) if n not in names]
    names += [n for n, ref in reference.items() if n not in names and structure.detection_layout(n, ref)]
    names += [n for n, ref in reference.items() if n not in names and structure.waveform(ref)]
    return names + [n for n, ref in reference.items() if n not in names and ref.dtype.kind in "iub"]


def structured_severity(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], *, bounds: Bounds
) -> float | None:
    """:func:`severity` where the gate judges some output for what it is (:func:`structured_outputs`: any rounding
    reorders a ranked list's rows, a label flips between any two class ids, audio is heard by its spectrum, so a
    positional error says little of them), else None."""
    return severity(reference, candidate, bounds) if structured_outputs(reference) else None


def severity(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], bounds: Bounds) -> float:
    """How far ``candidate``'s outputs are outside ``bounds`` (the largest ratio of measured to allowed
    error over every output; <= 1 passes, inf for new NaN/inf): what a repair measures its choices with."""
    worst = 0.0
    for diff in judge_all(reference, candidate, bounds):
        if "nonfinite" in diff.failed:
            return math.inf
        score = _severity(diff, bounds)
        if not diff.passed and diff.cosine is None and score <= 1:  # integers that differ: graded by how many
            score = 1.0 + diff.mean_abs
        worst = max(worst, score)
    return worst


def _needed(diff: OutputDiff, bounds: Bounds, delta, ref, channel) -> dict[str, float]:
    """The value of each failing bound's option that would accept this output; empty when only a bound
    that accepts anything would (see the module doc): such a variant is far from its source."""
    needed: dict[str, float] = {}
    if "cosine" in diff.failed or "magnitude" in diff.failed:
        cosine = min(diff.cosine, 1 - (diff.magnitude - 1) ** 2 / 2)
        if cosine < MIN_SUGGESTED_COSINE:
            return {}
        digits = max(4, math.ceil(-math.log10(max(1 - cosine, 1e-300))) + 2)
        needed["min_cosine"] = math.floor(cosine * 10**digits) / 10**digits
    if "values" in diff.failed:
        rtol = None
        if bounds.atol is None and np.any(ref != 0):
            with np.errstate(divide="ignore", invalid="ignore"):
                rtol = _round_up(float(np.max(np.where(delta > 0, delta / (np.abs(ref) + channel), 0.0))))
        if rtol is not None and rtol <= MAX_SUGGESTED_RTOL:
            needed["rtol"] = rtol
        else:  # an absolute bound: where the source's output is all zeros, or errors beyond the values themselves
            atol = _round_up(float(np.max(delta - bounds.rtol * np.abs(ref))))
            rms = math.sqrt(float(np.mean(ref**2))) if ref.size else 0.0
            if rms > 0 and atol > MAX_SUGGESTED_ATOL_SHARE * rms:
                return {}
            needed["atol"] = atol
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
    # The cache outputs are judged together, by one next step: they fail as one.
    groups = {"cache" if o.kind == "cache" else o.name for o in failing}
    if len(groups) > 1:
        line += f" (and {len(groups) - 1} more of {len(outputs)} outputs)"
    if nonfinite:
        return line + "; no bound accepts NaN/inf"
    if any(not o.needed for o in failing):
        return line + "; far from the source: no bound short of accepting anything accepts it"
    options: dict[str, float] = {}
    for o in failing:
        for option, value in o.needed.items():
            pick = min if option.startswith("min_") else max
            options[option] = pick(options.get(option, value), value)
    if options:
        flags = " ".join(f"--{k.replace('_', '-')} {_plain(v)}" for k, v in sorted(options.items()))
        line += f"; {flags} would accept it"
    return line


def _severity(o: OutputDiff, bounds: Bounds) -> float:
    """How far an output is outside its bounds: the largest ratio of measured to allowed error."""
    direction = 0.0
    if o.cosine is not None and bounds.min_cosine < 1:
        direction = max(direction, math.sqrt(max(0.0, 1 - o.cosine) / (1 - bounds.min_cosine)))
    if o.magnitude is not None and bounds.magnitude > 0:
        direction = max(direction, abs(o.magnitude - 1) / bounds.magnitude)
    p = o.probabilities
    if p is not None and p["rms_bound"] > 0:  # a probability passes on either (its decisions are in o.worst)
        direction = min(direction, p["rms_delta"] / p["rms_bound"])
    return max(o.worst, direction)


def _plain(value: float) -> str:
    return f"{value:.12g}"
