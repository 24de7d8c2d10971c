"""The first lines of every variant's report: what was achieved, and why not more.

The first two are the same for every transform: the size against the source's and the
nodes; the gate's verdict with its key number. The lines after it are the transforms'
own (``StepReport.why_not_more``): what they left as it was, and why; the last says what each input was
taken to be where onnxsmith made the inputs or converted a folder of files into them. The console,
the ``--report`` JSON, the API's ``Variant.report``, the card and report.html all
show these lines first.
"""

from __future__ import annotations

from onnxsmith.core.transform import StepReport
from onnxsmith.io.files import human_bytes
from onnxsmith.verify.compare import Comparison


def headline(
    *,
    what: str,
    source_bytes: int,
    variant_bytes: int,
    nodes: tuple[int, int],
    comparison: Comparison,
    reports: list[StepReport],
    inputs: tuple[str, ...] | list[str] = (),
) -> list[str]:
    """``what`` (the steps, e.g. "fp16") made a variant of ``variant_bytes`` from ``source_bytes``; ``inputs``:
    what each input of made-up or converted input sets was taken to be (a user corrects it with --input-role)."""
    ratio = variant_bytes / source_bytes if source_bytes else float("nan")
    size = f"{ratio:.2f}x the source's size ({human_bytes(source_bytes)} -> {human_bytes(variant_bytes)})"
    before, after = nodes
    shape = f"{before:,} -> {after:,} nodes" if before != after else f"{after:,} nodes as before"
    if comparison.passed:
        verdict = f"verified: {comparison.summary()}"
    else:
        verdict = "REFUSED by its gate: " + comparison.verdict()
    lines = [f"{what}: {size}, {shape}", verdict]
    chained = len(reports) > 1
    for report in reports:
        lines += [f"{report.step}: {line}" if chained else line for line in report.why_not_more]
    if inputs:
        lines.append("inputs taken to be: " + "; ".join(inputs))
    return lines
