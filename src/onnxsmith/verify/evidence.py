"""Whether a comparison is evidence at all: inputs that exercise the model, outputs that say something.

Two models agree on anything when nothing reaches them: an empty batch gives empty outputs, an
all-NaN input gives NaN on both sides, a length of 0 masks every frame and both models output the
same zeros. A gate that passes there proves nothing, so before any output is judged:

* every feed must hold values: not empty where every output is empty too, no float input all
  NaN/inf, not every float input one constant value (a mask of ones is a mask, and a state of zeros
  beside a real input is how a stream starts, but a constant image alone exercises nothing);
* the source's float outputs must say something: finite somewhere, not one constant value, and
  not the same in every input set when the input sets differ (then the varied inputs never
  reached them). An output that fails this is not evidence; when no float output is evidence,
  the comparison is refused with one line naming the output and the inputs that may mask it.

Integer outputs (labels, lengths, indices) may legitimately be constant; they are judged but do
not count as evidence on their own unless there is no float output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxsmith.core.errors import InputError

#: Inputs whose name says they gate other inputs: the first suspects when nothing is exercised.
_GATING_WORDS = ("len", "mask", "valid", "count", "num_", "size")


@dataclass(frozen=True)
class Evidence:
    """What a comparison exercised: the outputs that are evidence and those that are not (with why)."""

    samples: int
    exercised: tuple[str, ...]
    idle: tuple[tuple[str, str], ...] = ()  # (output, why it is not evidence)

    def describe(self) -> str:
        line = f"{len(self.exercised)} of {len(self.exercised) + len(self.idle)} output(s) exercised"
        line += f" on {self.samples} input set(s)"
        if self.idle:
            line += "; not evidence: " + ", ".join(f"'{name}' ({why})" for name, why in self.idle)
        return line

    def to_json(self) -> dict:
        return {"samples": self.samples, "exercised": list(self.exercised), "idle": dict(self.idle)}


def check_feeds(feeds_list: list[dict[str, np.ndarray]], label=None) -> None:
    """Refuse feeds that cannot exercise a model: no input set, a float input all NaN/inf, or float inputs that
    are each one constant value (a cache or state of zeros beside a real input is how a stream starts; a
    mask of ones is a mask: neither is refused while another float input varies)."""
    if not feeds_list:
        raise InputError("no input sets to compare on: a comparison needs at least one", label)
    for index, feeds in enumerate(feeds_list):
        where = f" (input set {index + 1})" if len(feeds_list) > 1 else ""
        constant = []
        varied = False
        for name, value in feeds.items():
            array = np.asarray(value)
            if array.dtype.kind not in "fc" or array.size == 0:
                continue
            if not np.isfinite(array).any():
                raise InputError(f"input '{name}'{where} is all NaN/inf: a comparison on it proves nothing", label)
            if array.size > 1 and _constant(array):
                constant.append((name, array))
            elif array.size > 1:
                varied = True
        data = [(name, array) for name, array in constant if not _mask_like(name, array)]
        if data and not varied:
            name, array = data[0]
            raise InputError(
                f"input '{name}'{where} holds one value ({_value(array)}) everywhere: "
                "a comparison on it proves nothing; give inputs that vary",
                label,
            )


def check_reference(
    feeds_list: list[dict[str, np.ndarray]],
    outputs: dict[str, np.ndarray],
    label=None,
    *,
    constant_outputs: frozenset[str] | set[str] = frozenset(),
) -> Evidence:
    """Which of the source's outputs (stacked over the input sets on axis 0) are evidence; refuse when none is.

    ``constant_outputs``: outputs no input reaches (computed from constants alone): the same in every input set
    by construction, and still evidence of that computation."""
    samples = len(feeds_list)
    if outputs and all(value[0].size == 0 for value in outputs.values()):
        empty = _empty_inputs(feeds_list[0])
        cause = f": input '{empty[0]}' is empty" if empty else ""
        raise InputError(f"every output of the source is empty{cause}; a comparison on it proves nothing", label)
    sets_differ = samples > 1 and not all(_same_feeds(feeds_list[0], other) for other in feeds_list[1:])
    exercised: list[str] = []
    idle: list[tuple[str, str]] = []
    for name, value in outputs.items():
        why = _why_idle(value, sets_differ and name not in constant_outputs)
        if why:
            idle.append((name, why))
        else:
            exercised.append(name)
    floats = [name for name, value in outputs.items() if value.dtype.kind in "fc"]
    counted = [name for name in exercised if name in floats] if floats else exercised
    if outputs and not counted:
        name, why = next((item for item in idle if item[0] in floats), idle[0])
        suspects = _gating_inputs(feeds_list[0])
        hint = (
            f"; input {', '.join(repr(s) for s in suspects)} may mask everything: give real values"
            if suspects
            else "; give inputs that exercise it"
        )
        raise InputError(
            f"the source's output '{name}' is {why} on the {samples} input set(s): "
            f"the inputs do not exercise the model{hint} (--inputs)",
            label,
        )
    return Evidence(samples, tuple(exercised), tuple(idle))


def _why_idle(value: np.ndarray, sets_differ: bool) -> str:
    """Why an output (stacked over input sets) is not evidence, or '' when it is."""
    if value[0].size == 0:
        return "empty"
    if value.dtype.kind in "fc":
        finite = np.isfinite(value)
        if not finite.any():
            return "all NaN/inf"
        if value.size > 1 and _constant(value[finite]):  # one value in one input set: nothing to tell
            return f"the constant {_value(value[finite])}"
    elif value.size > 1 and _constant(value):
        return f"the constant {_value(value)}"
    if sets_differ and value.shape[0] > 1 and all(np.array_equal(value[0], v, equal_nan=True) for v in value[1:]):
        return "the same in every input set"
    return ""


def _constant(array: np.ndarray) -> bool:
    flat = array.reshape(-1)
    return bool(flat.size) and bool(np.all(flat == flat[0]))


def _mask_like(name: str, array: np.ndarray) -> bool:
    return "mask" in name.lower() and bool(np.all((array == 0) | (array == 1)))


def _value(array: np.ndarray) -> str:
    return f"{array.reshape(-1)[0].item():.6g}"


def _same_feeds(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def _empty_inputs(feeds: dict[str, np.ndarray]) -> list[str]:
    return [name for name, value in feeds.items() if np.asarray(value).size == 0]


def _gating_inputs(feeds: dict[str, np.ndarray]) -> list[str]:
    """Integer or boolean inputs named like lengths or masks: what can switch a whole output off."""
    return [
        name
        for name, value in feeds.items()
        if np.asarray(value).dtype.kind in "iub" and any(word in name.lower() for word in _GATING_WORDS)
    ]
