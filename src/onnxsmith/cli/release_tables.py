"""Tables of the release commands: validation metrics, per-sample rows, benchmarks."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from onnxsmith.io.files import human_bytes

if TYPE_CHECKING:
    from onnxsmith.release.bench import BenchResult
    from onnxsmith.release.validate import Validation


def validation_table(validations: list[Validation]) -> Table:
    """One column per variant, one row per metric: value, its 95 % interval where it has one, and whether its
    gate holds."""
    from onnxsmith.release.confidence import interval_text  # here: --help loads no engine (numpy)

    first = validations[0]
    modes = "; ".join(sorted({f"{v.candidate} {v.modes['candidate']}" for v in validations}))
    table = Table(
        title=f"validation against {first.reference} ({first.task}: {first.data}; {modes})", title_justify="left"
    )
    table.add_column("metric")
    table.add_column("gate", justify="right")
    for v in validations:
        table.add_column(v.candidate, justify="right")
    for i, m in enumerate(first.metrics):
        cells = []
        for v in validations:
            mv = v.metrics[i]
            mark = "" if mv.passed is None else ((" ✓", "green") if mv.passed else (" ✗", "red"))
            interval = interval_text(mv.interval)
            cells.append(Text.assemble(mv.display, f" ({interval})" if interval else "", mark))
        table.add_row(m.label, "-" if m.gate is None else _gate(m), *cells)
    return table


def _gate(m) -> str:
    return f"{'≤' if m.better == 'lower' else '≥'} {m.gate:g}"


def rows_table(validation: Validation) -> Table:
    table = Table(title=f"{validation.candidate}: per sample", title_justify="left")
    if not validation.rows:
        return table
    for column in validation.rows[0]:
        table.add_column(str(column))
    for row in validation.rows:
        table.add_row(*(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row.values()))
    return table


def worst_table(validation: Validation) -> Table:
    """The samples that fare worst (``Validation.worst``), worst first: their ids and the metric's value on each
    sample alone (a mean's, the sample's own value)."""
    label = validation.metric(validation.worst[0]["metric"]).label if validation.worst else ""
    table = Table(title=f"{validation.candidate}: worst samples ({label} of each alone)", title_justify="left")
    table.add_column("sample")
    table.add_column("value", justify="right")
    for w in validation.worst:
        value = w["value"]
        table.add_row(w["sample"], f"{value:.4g}" if math.isfinite(value) else "NaN/inf")
    return table


def bench_table(results: list[BenchResult]) -> Table:
    provider = results[0].provider if results else "cpu"
    table = Table(title=f"latency ({provider}; median and p90 of timed runs after warm-up)", title_justify="left")
    for column in ("model", "load", "batch", "median", "p90", "throughput", "peak RSS"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in results:
        for i, b in enumerate(r.batches):
            table.add_row(
                r.name if i == 0 else "",
                f"{r.load_ms:.0f} ms" if i == 0 else "",
                str(b.batch),
                f"{b.median_ms:.2f} ms",
                f"{b.p90_ms:.2f} ms",
                f"{b.throughput:.1f}/s",
                human_bytes(r.peak_rss_bytes) if i == 0 else "",
            )
    return table
