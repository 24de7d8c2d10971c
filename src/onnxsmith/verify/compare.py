"""Run two models on the same inputs and compare every output.

This is the harness every pass is verified with: the CLI's ``compare``, each
transform's gate, and the tests all call :func:`compare_models`.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from onnxsmith.core.errors import InputError
from onnxsmith.runtime.runner import NATIVE, prepare_session, run_all

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


@dataclass
class OutputDiff:
    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    mean_abs: float
    max_rel: float  # max |a-b| / (|ref| + atol)
    cosine: float | None
    nonfinite_ref: int
    nonfinite_test: int
    argmax_agreement: float | None  # fraction of rows whose argmax over the last axis agrees
    passed: bool

    def to_json(self) -> dict:
        data = asdict(self)
        data["shape"] = list(self.shape)
        return data


@dataclass
class Comparison:
    reference: str
    candidate: str
    modes: dict[str, str]  # "reference"/"candidate" -> how it was run
    atol: float
    rtol: float
    samples: int
    outputs: list[OutputDiff] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def summary(self) -> str:
        """The verdict's key numbers in one line: the worst output's cosine and largest difference."""
        if not self.outputs:
            return "no outputs compared"
        worst = min(self.outputs, key=lambda o: (o.passed, 2.0 if o.cosine is None else o.cosine, -o.max_rel))
        parts = [f"cosine {worst.cosine:.9f}"] if worst.cosine is not None else []
        parts.append(f"max |Δ| {worst.max_abs:.3g}")
        if worst.argmax_agreement is not None:
            parts.append(f"argmax {worst.argmax_agreement:.0%}")
        where = (
            f"output '{worst.name}'"
            if len(self.outputs) == 1
            else f"worst of {len(self.outputs)} outputs '{worst.name}'"
        )
        bounds = (
            f"atol {self.atol:g}, rtol {self.rtol:g}; " if math.isfinite(self.atol) and math.isfinite(self.rtol) else ""
        )
        return f"{where}: {', '.join(parts)} ({bounds}{self.samples} input set(s))"

    def failures(self) -> list[str]:
        lines = []
        for o in self.outputs:
            if o.passed:
                continue
            if o.nonfinite_test > o.nonfinite_ref:
                lines.append(f"output '{o.name}' has {o.nonfinite_test} NaN/inf values (reference {o.nonfinite_ref})")
            else:
                lines.append(
                    f"output '{o.name}' differs by up to {o.max_abs:.3g} (atol {self.atol:g}, rtol {self.rtol:g})"
                )
        return lines

    def to_json(self) -> dict:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "modes": self.modes,
            "atol": self.atol,
            "rtol": self.rtol,
            "samples": self.samples,
            "passed": self.passed,
            "outputs": [o.to_json() for o in self.outputs],
        }


def diff_output(name: str, ref: np.ndarray, test: np.ndarray, atol: float, rtol: float) -> OutputDiff:
    """Compare one output; arrays carry the input sets stacked on a leading axis."""
    if ref.shape != test.shape:
        raise InputError(f"output '{name}' has shape {test.shape[1:]}, the reference {ref.shape[1:]}")
    shape = tuple(int(d) for d in ref.shape[1:])
    if ref.dtype.kind not in "fc" and test.dtype.kind not in "fc":
        mismatched = int(np.count_nonzero(ref != test))
        return OutputDiff(
            name,
            shape,
            str(test.dtype),
            float(mismatched and np.max(np.abs(ref.astype(np.float64) - test.astype(np.float64)))),
            float(mismatched / max(ref.size, 1)),
            0.0,
            None,
            0,
            0,
            None,
            mismatched == 0,
        )
    a = ref.astype(np.float64)
    b = test.astype(np.float64)
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    both = finite_a & finite_b
    delta = np.abs(a[both] - b[both])  # inf - inf is not a difference: compared below
    scale = np.abs(a)[both]
    max_abs = float(delta.max()) if delta.size else 0.0
    mean_abs = float(delta.mean()) if delta.size else 0.0
    max_rel = float((delta / (scale + atol)).max()) if delta.size else 0.0
    within = bool(np.all(delta <= atol + rtol * scale))
    # Non-finite values must match exactly (same NaN/inf places): new ones fail the comparison.
    same_nonfinite = bool(
        np.array_equal(~finite_a, ~finite_b) and np.array_equal(a[~finite_a], b[~finite_b], equal_nan=True)
    )
    cosine = None
    if delta.size:
        va, vb = a[both], b[both]
        norm = float(np.linalg.norm(va) * np.linalg.norm(vb))
        cosine = float(np.dot(va, vb) / norm) if norm > 0 else (1.0 if max_abs == 0 else 0.0)
    argmax = None
    if a.ndim >= 2 and a.shape[-1] >= 2 and both.all():  # axis 0 stacks the input sets
        argmax = float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
    return OutputDiff(
        name,
        shape,
        str(test.dtype),
        max_abs,
        mean_abs,
        max_rel,
        cosine,
        int((~finite_a).sum()),
        int((~finite_b).sum()),
        argmax,
        within and same_nonfinite,
    )


def compare_models(
    reference: str | os.PathLike,
    candidate: str | os.PathLike,
    feeds_list: list[dict[str, np.ndarray]],
    *,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    fp16_mode: str = "auto",
    reference_outputs: dict[str, np.ndarray] | None = None,
    reference_mode: str = NATIVE,
) -> Comparison:
    """Compare ``candidate`` against ``reference`` output by output on every feed.

    ``reference_outputs``: the reference's outputs on these feeds, already computed (as
    :func:`run_all` stacks them) and how it was run; the reference is then not run again.
    """
    if reference_outputs is not None:
        ref_out, ref_mode = reference_outputs, reference_mode
    else:
        ref_session, ref_model, ref_mode = prepare_session(reference, fp16_mode)
        ref_out = run_all(ref_session, ref_model, feeds_list, reference)
        del ref_session
    cand_session, cand_model, cand_mode = prepare_session(candidate, fp16_mode)
    cand_out = run_all(cand_session, cand_model, feeds_list, candidate)
    del cand_session
    missing = [name for name in ref_out if name not in cand_out]
    if missing:
        raise InputError(f"has no output named '{missing[0]}' (the reference has it)", candidate)
    comparison = Comparison(
        reference=Path(reference).name,
        candidate=Path(candidate).name,
        modes={"reference": ref_mode, "candidate": cand_mode},
        atol=atol,
        rtol=rtol,
        samples=len(feeds_list),
    )
    for name, ref_value in ref_out.items():
        comparison.outputs.append(diff_output(name, ref_value, cand_out[name], atol, rtol))
    return comparison
