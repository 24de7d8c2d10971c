"""What an output is, decided from the source's values: a detection list, a top-k (sorted values and
their indices), a CTC label sequence, integer labels, audio, or a tensor. (A decoder's KV cache is told by the
model's signature instead: :mod:`onnxsmith.verify.cache`.)

A position-by-position comparison is right for a tensor and wrong for a list ranked by score: an
end-to-end detector writes ``[batch, 300, 6]`` rows (box, score, class) sorted by score, and where
the scores nearly tie (every score of a random image sits below 0.002) any rounding reorders the rows,
so row i of the variant is another detection than row i of the source. Such an output is judged by
matching rows (:func:`match_detections`); the gate (:mod:`onnxsmith.verify.gate`) then judges the
matched rows' values as it judges a tensor.

Detection is conservative: an output is a detection list only when its values say so (a score
column in [0, 1] sorted descending along the rows of every list, on the source; exactly the
integer-valued columns a class, and a batch index, need; four box columns), else it stays a tensor
and keeps the positional judgement. A raw detector grid (``[1, 3549, 6]``: one row per anchor,
unsorted, unfiltered) is a tensor whatever its name: its rows are positions, and matching them by
IoU would pair a variant's anchor with any overlapping neighbour. Names are hints only (a model's
text is untrusted): they tell separate boxes/scores/labels outputs apart, and never make an output
whose values do not fit a ranked detection list one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

#: Rows whose score is at least this share of the best score in their list are the detections judged.
CONFIDENT_SHARE = 0.25
#: At most this many rows per list are judged (the highest scores; on a random image every row is "confident").
MAX_ROWS = 100
#: A detection output's last axis: 4 box coordinates, a score, a class (and a batch index).
ROW_WIDTHS = (6, 7)
#: Name hints (case-insensitive): the separate outputs of a detection list (beside ranked scores, never alone).
_BOXES_NAME = re.compile(r"box", re.IGNORECASE)
_SCORES_NAME = re.compile(r"score|conf", re.IGNORECASE)
_LABELS_NAME = re.compile(r"label|class|cls", re.IGNORECASE)


@dataclass(frozen=True)
class DetectionLayout:
    """Where a detection list's fields are: columns of one output, or separate outputs.

    One output ``[..., N, C]``: ``box`` (4 contiguous columns), ``score``, ``label`` and ``batch``
    columns. Separate outputs: ``boxes`` ``[..., N, 4]``, ``scores`` ``[..., N]``, ``labels``
    ``[..., N]`` (None: one class). ``xyxy``: corners, else centre and size.
    """

    outputs: tuple[str, ...]
    box: tuple[int, int, int, int] = (0, 1, 2, 3)
    score: int = 4
    label: int | None = 5
    batch: int | None = None
    xyxy: bool = True

    @property
    def single(self) -> bool:
        return len(self.outputs) == 1


@dataclass
class DetectionRows:
    """One detection list (an input set's batch item): rows of boxes (corners), scores, keys and values."""

    boxes: np.ndarray  # [N, 4] x1, y1, x2, y2
    scores: np.ndarray  # [N]
    keys: np.ndarray  # [N] class (and batch index): rows match only rows of the same key
    values: np.ndarray  # [N, C] every field of a row, as judged once matched


@dataclass
class DetectionMatch:
    """Rows of the source and the variant matched as the same detections, and what is left over."""

    required: int = 0  # the source's confident rows and the variant's that match none of them
    matched: int = 0  # of them, matched
    missing: int = 0  # confident rows of the source with no match in the variant
    extra: int = 0  # confident rows of the variant with no match in the source
    excused: int = 0  # unmatched rows that may have fallen off the end of a full ranked list
    lowest_iou: float = 1.0  # over the matched pairs
    score_delta: float = 0.0  # the largest |Δscore| over the matched pairs
    reference: list[np.ndarray] = field(default_factory=list)  # matched rows' values, source
    candidate: list[np.ndarray] = field(default_factory=list)  # the same rows, variant

    @property
    def share(self) -> float:
        return self.matched / self.required if self.required else 1.0


# ---------------------------------------------------------------- what an output is


def integer_valued(values: np.ndarray) -> bool:
    return bool(values.size) and bool(np.all(np.isfinite(values))) and bool(np.all(values == np.round(values)))


def detection_layout(name: str, ref: np.ndarray) -> DetectionLayout | None:
    """The layout of one output that holds a detection list, or None (``ref`` stacks input sets on axis 0)."""
    if ref.dtype.kind != "f" or ref.ndim < 3 or ref.shape[-1] not in ROW_WIDTHS or ref.shape[-2] < 2:
        return None
    rows = ref.reshape(-1, ref.shape[-2], ref.shape[-1]).astype(np.float64)
    if not np.all(np.isfinite(rows)):
        return None
    columns = [rows[..., c] for c in range(rows.shape[-1])]
    integers = [c for c, col in enumerate(columns) if integer_valued(col) and col.min() >= 0]
    # Ranked, never merely named: a raw grid (one row per anchor, unsorted, unfiltered) matched by IoU
    # would let a variant's rows pair with any near neighbour (an int8 detector at cosine 0.963 passed).
    scores = [
        c
        for c, col in enumerate(columns)
        if c not in integers and col.min() >= 0 and col.max() <= 1 and col.max() > 0 and _descending(col)
    ]
    width = rows.shape[-1]
    for score in scores:
        rest = [c for c in range(width) if c != score]
        for start in range(width - 3):
            box = tuple(range(start, start + 4))
            if score in box or any(c in integers for c in box):
                continue
            others = [c for c in rest if c not in box]  # the class (and the batch index)
            if not all(c in integers for c in others) or len(others) != width - 5:
                continue
            batch = None
            if len(others) == 2:  # [batch, box, class, score] and the like: the batch index comes first
                if others[0] != 0:
                    continue
                batch, label = others
            else:
                label = others[0]
            xyxy = _corners(rows[..., list(box)], rows[..., score] > 0)
            if xyxy is None:
                continue
            return DetectionLayout((name,), box, score, label, batch, xyxy)  # type: ignore[arg-type]
    return None


def separate_detections(reference: dict[str, np.ndarray]) -> list[DetectionLayout]:
    """Detection lists written as separate outputs: boxes ``[..., N, 4]`` beside scores ``[..., N]``
    (and labels ``[..., N]``), told apart by their names and values."""
    layouts = []
    used: set[str] = set()
    for boxes_name, boxes in reference.items():
        if (
            boxes.dtype.kind != "f"
            or boxes.ndim < 3
            or boxes.shape[-1] != 4
            or boxes.shape[-2] < 2
            or not _BOXES_NAME.search(boxes_name)
            or not np.all(np.isfinite(boxes))
        ):
            continue
        lead = boxes.shape[:-1]

        def fits(name: str, value: np.ndarray, pattern: re.Pattern, boxes_name=boxes_name, lead=lead) -> bool:
            return name not in used and name != boxes_name and value.shape == lead and bool(pattern.search(name))

        scores = [
            n
            for n, v in reference.items()
            if fits(n, v, _SCORES_NAME)
            and v.dtype.kind == "f"
            and np.all(np.isfinite(v))
            and v.min() >= 0
            and 0 < v.max() <= 1
            and _descending(v.reshape(-1, v.shape[-1]))  # ranked, as one output's score column must be
        ]
        labels = [
            n
            for n, v in reference.items()
            if fits(n, v, _LABELS_NAME) and (v.dtype.kind in "iub" or (v.dtype.kind == "f" and integer_valued(v)))
        ]
        if len(scores) != 1 or len(labels) > 1:
            continue  # ambiguous: every output stays what it is
        xyxy = _corners(boxes.reshape(-1, 4).astype(np.float64), reference[scores[0]].reshape(-1) > 0)
        if xyxy is None:
            continue
        names = (boxes_name, scores[0], *labels)
        used.update(names)
        layouts.append(DetectionLayout(names, label=5 if labels else None, xyxy=xyxy))
    return layouts


def _descending(column: np.ndarray) -> bool:
    """Whether every list (axis -1 of ``column``, rows in order) is sorted by score, highest first."""
    return bool(np.all(np.diff(column, axis=-1) <= 0)) and bool(np.any(np.diff(column, axis=-1) < 0))


def _corners(boxes: np.ndarray, scored: np.ndarray) -> bool | None:
    """Whether the boxes are corners (x1 <= x2, y1 <= y2 on every scored row) or centre and size
    (non-negative sizes); None when they are neither."""
    live = boxes[scored] if scored.shape == boxes.shape[:-1] else boxes.reshape(-1, 4)
    if not live.size:
        return None
    if np.all(live[:, 2] >= live[:, 0]) and np.all(live[:, 3] >= live[:, 1]):
        return True
    if np.all(live[:, 2] >= 0) and np.all(live[:, 3] >= 0):
        return False
    return None


def detection_rows(layout: DetectionLayout, arrays: dict[str, np.ndarray]) -> list[DetectionRows]:
    """Every list of ``arrays`` (the layout's outputs, input sets on axis 0), one per input set and batch item."""
    if layout.single:
        data = arrays[layout.outputs[0]].astype(np.float64)
        data = data.reshape(-1, data.shape[-2], data.shape[-1])
    else:
        boxes = arrays[layout.outputs[0]].astype(np.float64)
        lead = boxes.shape[:-1]
        parts = [boxes, arrays[layout.outputs[1]].astype(np.float64)[..., None]]
        if layout.label is not None:
            parts.append(arrays[layout.outputs[2]].astype(np.float64)[..., None])
        data = np.concatenate(parts, axis=-1).reshape(-1, lead[-1], len(parts) + 3)
    lists = []
    for rows in data:
        box = rows[:, list(layout.box)]
        if not layout.xyxy:
            centre, size = box[:, :2], box[:, 2:]
            box = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
        label = rows[:, layout.label] if layout.label is not None else np.zeros(len(rows))
        batch = rows[:, layout.batch] if layout.batch is not None else np.zeros(len(rows))
        keys = np.round(label).astype(np.int64) * (1 << 20) + np.round(batch).astype(np.int64)
        lists.append(DetectionRows(box, rows[:, layout.score], keys, rows))
    return lists


# ---------------------------------------------------------------- judging a detection list


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of every box in ``a`` [N, 4] with every box in ``b`` [M, 4] (corners)."""
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    same = np.all(a[:, None, :] == b[None, :, :], axis=-1)  # degenerate (empty) boxes: equal or not
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, same.astype(np.float64))


def match_detections(
    reference: list[DetectionRows], candidate: list[DetectionRows], min_iou: float, tolerance
) -> DetectionMatch:
    """Match each list's confident rows to the other side's by class and IoU (greedy, highest IoU first).

    A row is confident when its score is at least :data:`CONFIDENT_SHARE` of the source list's best
    (at most :data:`MAX_ROWS` rows). Every confident row, of either side, must find a row of the same
    class with IoU >= ``min_iou`` among the other side's rows scoring within ``tolerance(score)`` of the
    threshold: which of two near-tied detections ranks first does not matter, and a detection whose
    score moved across the threshold by less than the tolerance is still found. A row that could have
    fallen off the end of the other side's full list (its score within the tolerance of that list's
    lowest) is excused. ``tolerance``: an array of scores -> the |Δscore| allowed at each.
    """
    result = DetectionMatch()
    for ref, test in zip(reference, candidate):
        top = float(ref.scores.max(initial=0.0))
        if top <= 0:  # the source detects nothing here: whatever the variant detects beyond tolerance is new
            invented = int(np.count_nonzero(test.scores > tolerance(np.zeros(1))[0]))
            result.required += invented
            result.extra += invented
            continue
        ranked = np.sort(ref.scores)[::-1]
        threshold = max(CONFIDENT_SHARE * top, float(ranked[min(MAX_ROWS, len(ranked)) - 1]))
        floor = threshold - float(tolerance(np.array([threshold]))[0])
        pool_r = np.flatnonzero(ref.scores >= floor)
        pool_t = np.flatnonzero(test.scores >= floor)
        overlap = iou(ref.boxes[pool_r], test.boxes[pool_t])
        same = ref.keys[pool_r][:, None] == test.keys[pool_t][None, :]
        i, j = np.nonzero(same & (overlap >= min_iou))
        order = np.lexsort((np.abs(ref.scores[pool_r][i] - test.scores[pool_t][j]), -overlap[i, j]))
        taken_r: dict[int, int] = {}
        taken_t: set[int] = set()
        for k in order:
            r, t = int(pool_r[i[k]]), int(pool_t[j[k]])
            if r in taken_r or t in taken_t:
                continue
            taken_r[r] = t
            taken_t.add(t)
            if ref.scores[r] >= threshold or test.scores[t] >= threshold:
                result.lowest_iou = min(result.lowest_iou, float(overlap[i[k], j[k]]))
                result.score_delta = max(result.score_delta, abs(float(ref.scores[r] - test.scores[t])))
                result.reference.append(ref.values[r])
                result.candidate.append(test.values[t])
        for side, other, taken in ((ref, test, set(taken_r)), (test, ref, taken_t)):
            required = np.flatnonzero(side.scores >= threshold)
            unmatched = [r for r in required if r not in taken]
            lowest = float(other.scores.min(initial=0.0))
            cut = side.scores[unmatched] - tolerance(side.scores[unmatched]) <= lowest if unmatched else []
            excused = int(np.count_nonzero(cut))
            result.excused += excused
            if side is ref:  # the source's confident rows, and the variant's that match none of them
                result.required += len(required) - excused
                result.matched += len(required) - len(unmatched)
                result.missing += len(unmatched) - excused
            else:
                result.required += len(unmatched) - excused
                result.extra += len(unmatched) - excused
    return result


# ---------------------------------------------------------------- ranked rows (top-k) and label sequences (CTC)

#: An index output's name hint: a top-k's indices (names are required here as well as values, see ranked_pairs).
_INDICES_NAME = re.compile(r"ind|idx|topk|top_k|order|sort|rank", re.IGNORECASE)


@dataclass(frozen=True)
class RankedPair:
    """A top-k: ``values`` sorted along the last axis in every row (``descending`` or not) and ``indices``
    of the same shape, the distinct positions those values came from."""

    values: str
    indices: str
    descending: bool = True


def ranked_pairs(reference: dict[str, np.ndarray]) -> list[RankedPair]:
    """Top-k outputs: a float output sorted along its last axis in every row (all finite, at least once
    strictly) beside exactly one integer output of its shape, named like indices, whose rows hold
    distinct non-negative values; each side must have exactly one partner, else both stay what they are."""
    ranked: dict[str, bool] = {}
    for name, value in reference.items():
        if value.dtype.kind != "f" or value.ndim < 2 or value.shape[-1] < 2 or not np.all(np.isfinite(value)):
            continue
        steps = np.diff(value, axis=-1)
        if np.all(steps <= 0) and np.any(steps < 0):
            ranked[name] = True
        elif np.all(steps >= 0) and np.any(steps > 0):
            ranked[name] = False
    indices = [
        name
        for name, value in reference.items()
        if value.dtype.kind in "iu"
        and value.ndim >= 2
        and value.shape[-1] >= 2
        and _INDICES_NAME.search(name)
        and value.min() >= 0
        and _distinct_rows(value)
    ]
    pairs = []
    for name in indices:
        shape = reference[name].shape
        partners = [v for v in ranked if reference[v].shape == shape]
        rivals = [i for i in indices if reference[i].shape == shape]
        if len(partners) == 1 and len(rivals) == 1:
            pairs.append(RankedPair(partners[0], name, ranked[partners[0]]))
    return pairs


def _distinct_rows(value: np.ndarray) -> bool:
    rows = np.sort(value.reshape(-1, value.shape[-1]), axis=-1)
    return bool(np.all(np.diff(rows, axis=-1) != 0))


def index_agreement(ref_values: np.ndarray, ref_indices: np.ndarray, test_indices: np.ndarray, tied: np.ndarray):
    """How many of the source's top-k indices the variant keeps, compared as sets within each run of
    near-tied values: returns (positions, agreed, excused). ``tied``: [rows, k-1], whether the source's
    values at positions i and i+1 are within tolerance of each other. The run that reaches the end of the
    list is excused where the variant holds an index the source does not return at all: the source's
    (k+1)-th value, not returned, may have tied with its k-th (the values are judged, in order, as a tensor)."""
    k = ref_values.shape[-1]
    ref_rows = ref_indices.reshape(-1, k)
    test_rows = test_indices.reshape(-1, k)
    tied = tied.reshape(-1, k - 1)
    agreed = excused = 0
    for row in range(len(ref_rows)):
        start = 0
        for end in range(1, k + 1):
            if end < k and tied[row, end - 1]:
                continue
            a = ref_rows[row, start:end].tolist()
            b = test_rows[row, start:end].tolist()
            common = len(set(a) & set(b))
            agreed += common
            if end == k:  # the last run: an index the source ranks just below the k-th may take its place
                excused += len((set(b) - set(a)) - set(ref_rows[row].tolist()))
            start = end
    return ref_rows.size, agreed, excused


#: A label sequence's name hint (required beside its values, see ctc_sequences).
_SEQUENCE_NAME = re.compile(r"ctc|rec|char|text|ocr|seq|decod|transcri", re.IGNORECASE)
#: A CTC output has at least this many frames, at least this share of them the blank (0).
CTC_FRAMES = 16
CTC_BLANK_SHARE = 0.5


def ctc_frames(name: str, ref: np.ndarray) -> np.ndarray | None:
    """The per-frame labels of a CTC output (``ref`` stacks input sets on axis 0), or None when it is not
    clearly one: integer labels ``[batch, T]`` named like a sequence, or class probabilities ``[batch, T, C]``
    (rows in [0, 1] summing to 1) taken by their argmax. Either way: at least :data:`CTC_FRAMES` frames,
    the blank 0 the most common label and at least :data:`CTC_BLANK_SHARE` of the frames, and a label
    repeated over neighbouring frames somewhere (what CTC's collapse merges)."""
    if ref.dtype.kind in "iu" and ref.ndim == 3 and _SEQUENCE_NAME.search(name):
        frames = ref
    elif ref.dtype.kind == "f" and ref.ndim == 4 and ref.shape[-1] >= 3 and probabilities(ref):
        frames = np.argmax(ref, axis=-1)
    else:
        return None
    if frames.shape[-1] < CTC_FRAMES or frames.size == 0 or frames.min() < 0:
        return None
    counts = np.bincount(frames.reshape(-1))
    if counts[0] < CTC_BLANK_SHARE * frames.size or counts[0] < counts.max():
        return None
    repeated = (frames[..., 1:] == frames[..., :-1]) & (frames[..., 1:] != 0)
    return frames if bool(np.any(repeated)) else None


def probabilities(ref: np.ndarray) -> bool:
    """Whether every row (last axis) of ``ref`` is a distribution: finite, in [0, 1], summing to 1."""
    if ref.dtype.kind != "f" or not ref.size or not np.all(np.isfinite(ref)):
        return False
    sums = ref.astype(np.float64).sum(axis=-1)
    return bool(ref.min() >= 0 and ref.max() <= 1 and np.all(np.abs(sums - 1) <= 1e-3))


@dataclass(frozen=True)
class ProbabilityKind:
    """What a probability output is: a softmax's distributions along ``axis`` (decided by argmax), or a
    sigmoid's independent probabilities (``axis`` None, each decided on its side of 0.5)."""

    axis: int | None = None

    @property
    def name(self) -> str:
        return "sigmoid" if self.axis is None else "softmax"

    def decisions(self, values: np.ndarray) -> np.ndarray:
        return values > 0.5 if self.axis is None else np.argmax(values, axis=self.axis)


def probability_kind(ref: np.ndarray) -> ProbabilityKind | None:
    """Whether ``ref`` (input sets stacked on axis 0) holds probabilities, told as the CTC rule tells them,
    by the source's values (a model's names are untrusted): distributions along an axis (a Softmax; the last
    axis first) or, failing that, every value finite and in [0, 1] (a Sigmoid's map, a mask's)."""
    if ref.dtype.kind != "f" or not ref.size or not np.all(np.isfinite(ref)) or ref.min() < 0 or ref.max() > 1:
        return None
    for axis in range(ref.ndim - 1, 0, -1):
        if ref.shape[axis] >= 2 and probabilities(np.moveaxis(ref, axis, -1)):
            return ProbabilityKind(axis)
    return ProbabilityKind()


#: An audio output has at least this many samples along its last axis...
WAVEFORM_SAMPLES = 4096
#: ...and neighbouring samples this correlated (a sampled signal; a vector of logits or features is not)...
WAVEFORM_CORRELATION = 0.5
#: ...around zero: its mean at most this share of its RMS (a depth map or a mask is all one sign), crossing it
#: this many times per signal at least (a sorted list crosses once; a 50 Hz hum, 37 times in 4096 samples at 22 kHz).
WAVEFORM_OFFSET = 0.1
WAVEFORM_CROSSINGS = 16


def waveform(ref: np.ndarray) -> bool:
    """Whether ``ref`` (input sets stacked on axis 0) is audio, told by its values as the other rules tell theirs:
    float ``[T]``, ``[batch, T]`` or ``[batch, 1 or 2 channels, T]`` with at least :data:`WAVEFORM_SAMPLES`
    samples, neighbouring samples correlated (at least :data:`WAVEFORM_CORRELATION`), oscillating around zero. A vocoder's
    speech, a denoiser's or separator's output."""
    dims = ref.shape[1:]
    if ref.dtype.kind != "f" or not 1 <= len(dims) <= 3 or (len(dims) == 3 and dims[1] > 2):
        return False
    if dims[-1] < WAVEFORM_SAMPLES or not np.all(np.isfinite(ref)):
        return False
    x = ref.astype(np.float64).reshape(-1, dims[-1])
    energy = float(np.sum(x * x))
    if energy == 0:
        return False
    rms = np.sqrt(energy / x.size)
    neighbours = float(np.sum(x[:, 1:] * x[:, :-1])) / energy
    crossings = int(np.count_nonzero(np.signbit(x[:, 1:]) != np.signbit(x[:, :-1])))
    return (
        neighbours >= WAVEFORM_CORRELATION
        and abs(float(x.mean())) <= WAVEFORM_OFFSET * rms
        and crossings >= WAVEFORM_CROSSINGS * len(x)
    )


def ctc_collapse(frames: np.ndarray) -> list[list[int]]:
    """Each sequence (last axis) of per-frame labels collapsed as CTC decodes it: repeats merged, blanks (0) dropped."""
    sequences = []
    for row in frames.reshape(-1, frames.shape[-1]):
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        sequences.append([int(v) for v in row[keep & (row != 0)]])
    return sequences


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two label sequences."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class SequenceAgreement:
    """Collapsed label sequences of the source and the variant compared: how many are equal, the edits."""

    sequences: int
    equal: int
    edits: int
    characters: int  # the source's, all sequences together

    @property
    def error_rate(self) -> float:
        """Character error rate: edits over the source's characters (the variant inventing text where the
        source has none counts as edits over one character)."""
        return self.edits / max(self.characters, 1)


def sequence_agreement(ref_frames: np.ndarray, test_frames: np.ndarray) -> SequenceAgreement:
    ref = ctc_collapse(ref_frames)
    test = ctc_collapse(test_frames)
    edits = [edit_distance(a, b) for a, b in zip(ref, test)]
    return SequenceAgreement(len(ref), sum(e == 0 for e in edits), sum(edits), sum(len(a) for a in ref))
