"""Run two models on the same inputs and judge every output with the one gate.

This is the harness every pass is verified with: the CLI's ``compare``, each
transform's gate, and the tests all call :func:`compare_models`; the verdict is
:mod:`onnxsmith.verify.gate`'s, at the number format the two models differ in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxsmith.analysis.lm_signature import cache_layout
from onnxsmith.analysis.number_formats import NumberFormat, compared_format, formats_of
from onnxsmith.core.errors import InputError
from onnxsmith.core.text import format_cosine
from onnxsmith.io.load import load_model
from onnxsmith.irutil.walk import outputs_no_input_reaches
from onnxsmith.runtime.inputs import adapt_feeds
from onnxsmith.runtime.runner import NATIVE, prepare_session, run, run_all
from onnxsmith.verify import cache
from onnxsmith.verify.evidence import Evidence, check_feeds, check_reference
from onnxsmith.verify.gate import Bounds, GateOptions, OutputDiff, judge_all, verdict

__all__ = ["Comparison", "Judgement", "OutputDiff", "compare_models", "judge_outputs"]


@dataclass(frozen=True)
class Judgement:
    """A verdict on the whole model beside the outputs' (a decoder's greedy generation: tasks/lm/gate.py)."""

    name: str
    passed: bool
    summary: str  # what was measured, for the verdict's line
    problem: str  # why it failed, in one line ("" when it passed)
    measured: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "passed": self.passed, "summary": self.summary, **self.measured}


@dataclass
class Comparison:
    reference: str
    candidate: str
    modes: dict[str, str]  # "reference"/"candidate" -> how it was run
    samples: int
    bounds: Bounds | None = None  # None: judged by something else (a task's gate)
    outputs: list[OutputDiff] = field(default_factory=list)
    evidence: Evidence | None = None  # what the inputs exercised (None: not checked, a task judged)
    judgements: list[Judgement] = field(default_factory=list)  # of the whole model, after the outputs'

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and all(j.passed for j in self.judgements)

    def summary(self) -> str:
        """The verdict's key numbers in one line: the worst output's cosine and largest difference."""
        if not self.outputs:
            return "no outputs compared"
        worst = min(self.outputs, key=lambda o: (o.passed, 2.0 if o.cosine is None else o.cosine, -o.worst))
        parts = [f"cosine {format_cosine(worst.cosine)}"] if worst.cosine is not None else []
        parts.append(f"max |Δ| {worst.max_abs:.3g}")
        if worst.argmax_agreement is not None:
            parts.append(f"argmax {worst.argmax_agreement:.0%}")
        elif worst.agreement is not None:  # labels equal, detections matched
            parts.append(f"{worst.kind} {worst.agreement:.0%} {'matched' if worst.kind == 'detections' else 'equal'}")
        where = (
            f"output '{worst.name}'"
            if len(self.outputs) == 1
            else f"worst of {len(self.outputs)} outputs '{worst.name}'"
        )
        gate = f"{self.bounds.format} gate; " if self.bounds is not None else ""
        idle = ""
        if self.evidence is not None and self.evidence.idle:
            idle = "; not evidence: " + ", ".join(f"'{name}' ({why})" for name, why in self.evidence.idle)
        step = cache.describe(self.outputs)
        step = f"; {step}" if step else ""
        judged = "".join(f"; {j.summary}" for j in self.judgements)
        return f"{where}: {', '.join(parts)}{step} ({gate}{self.samples} input set(s){idle}){judged}"

    def failures(self) -> list[str]:
        """One line per failing output, then per failing judgement."""
        outputs = [o.problem(self.bounds) for o in self.outputs if not o.passed]
        return outputs + [j.problem for j in self.judgements if not j.passed]

    def verdict(self) -> str:
        """Why it failed, in one line: the worst output and the options that would accept it; else the
        judgement that failed."""
        if self.bounds is not None and not all(o.passed for o in self.outputs):
            return verdict(self.outputs, self.bounds)
        return "; ".join(self.failures())

    def to_json(self) -> dict:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "modes": self.modes,
            "gate": None if self.bounds is None else self.bounds.to_json(),
            "samples": self.samples,
            "evidence": None if self.evidence is None else self.evidence.to_json(),
            "passed": self.passed,
            "outputs": [o.to_json() for o in self.outputs],
            "judgements": [j.to_json() for j in self.judgements],
        }


def judge_outputs(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], bounds: Bounds, label=None
) -> list[OutputDiff]:
    """Every output of ``reference`` judged against ``candidate``'s (each stacked over the input sets), each
    for what it is (:func:`onnxsmith.verify.gate.judge_all`: labels, detection lists, tensors)."""
    missing = [name for name in reference if name not in candidate]
    if missing:
        raise InputError(f"has no output named '{missing[0]}' (the reference has it)", label)
    return judge_all(reference, candidate, bounds)


def compare_models(
    reference: str | os.PathLike,
    candidate: str | os.PathLike,
    feeds_list: list[dict[str, np.ndarray]],
    *,
    min_cosine: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    min_agreement: float | None = None,
    fp16_mode: str = "auto",
    reference_outputs: dict[str, np.ndarray] | None = None,
    reference_mode: str = NATIVE,
    reference_formats: frozenset[NumberFormat] | None = None,
) -> Comparison:
    """Compare ``candidate`` against ``reference`` output by output on every feed.

    The bounds are the gate's for the number format the two differ in, unless set
    (``min_cosine``, ``rtol``, ``atol``, ``min_agreement``). ``reference_outputs``: the reference's outputs
    on these feeds, already computed (as :func:`run_all` stacks them) and how it was run;
    the reference is then not run again. ``reference_formats``: its number formats, if
    known (:func:`formats_of` of the model as loaded), else read from the file.

    Before anything is judged, the feeds and the source's outputs must be evidence
    (:mod:`onnxsmith.verify.evidence`): an empty, all-NaN or constant comparison is refused.
    """
    check_feeds(feeds_list, reference)
    if reference_outputs is not None:
        ref_out, ref_mode = reference_outputs, reference_mode
        if reference_formats is None:
            reference_formats = formats_of(load_model(reference))
    else:
        ref_session, ref_model, ref_mode = prepare_session(reference, fp16_mode)
        reference_formats = reference_formats or formats_of(ref_model)
        ref_out = run_all(ref_session, ref_model, feeds_list, reference)
        del ref_session
    cand_session, cand_model, cand_mode = prepare_session(candidate, fp16_mode)
    evidence = check_reference(feeds_list, ref_out, reference, constant_outputs=outputs_no_input_reaches(cand_model))
    fmt = compared_format(reference_formats, formats_of(cand_model))
    cand_out = run_all(cand_session, cand_model, feeds_list, candidate)
    layout = cache_layout(cand_model)
    if not cache.applies(layout, feeds_list, ref_out):
        layout = None
    steps = None
    if layout is not None:  # a cached decoder: its present.* are judged by one more step of each model
        cand_next = _next_step(layout, cand_session, cand_model, feeds_list, ref_out, cand_out, candidate)
        del cand_session, cand_model
        # run as the source's outputs were: storage-faithful fp16 or natively
        mode = fp16_mode if reference_outputs is None else ("native" if ref_mode == NATIVE else "auto")
        ref_session, ref_model, _ = prepare_session(reference, mode)
        if cache_layout(ref_model) == layout:
            steps = (_next_step(layout, ref_session, ref_model, feeds_list, ref_out, ref_out, reference), cand_next)
        del ref_session, ref_model
    else:
        del cand_session, cand_model
    bounds = Bounds.for_format(
        fmt, GateOptions(min_cosine=min_cosine, rtol=rtol, atol=atol, min_agreement=min_agreement)
    )
    comparison = Comparison(
        reference=Path(reference).name,
        candidate=Path(candidate).name,
        modes={"reference": ref_mode, "candidate": cand_mode},
        samples=len(feeds_list),
        bounds=bounds,
        evidence=evidence,
    )
    if steps is None:
        comparison.outputs = judge_outputs(ref_out, cand_out, bounds, candidate)
        return comparison
    presents = set(layout.presents)
    rest = judge_outputs(
        {k: v for k, v in ref_out.items() if k not in presents},
        {k: v for k, v in cand_out.items() if k not in presents},
        bounds,
        candidate,
    )
    judged = {d.name: d for d in [*rest, *cache.judge_cache(layout, ref_out, cand_out, *steps, bounds)]}
    comparison.outputs = [judged[name] for name in ref_out]
    return comparison


def _next_step(layout, session, model, feeds_list, reference, outputs, label) -> np.ndarray:
    """The logits of one more step of a cached decoder on each input set, fed its own ``present.*``
    (``outputs``) and the source's (``reference``) greedy next token: stacked over the input sets."""
    tokens = cache.next_tokens(layout, reference)
    logits = []
    for index, feeds in enumerate(feeds_list):
        own = {name: outputs[name][index] for name in layout.presents}
        step = cache.step_feeds(layout, feeds, own, tokens[index])
        logits.append(run(session, adapt_feeds(step, model), [layout.logits], label=label)[layout.logits])
    return np.stack(logits)
