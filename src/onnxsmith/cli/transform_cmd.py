"""A command for every transform: ``onnxsmith NAME SRC OUT [options]``, over :func:`onnxsmith.api.transform`.

Loads SRC, applies the transform, verifies the result against SRC on the
calibration inputs (storage-faithfully for fp16) and writes OUT only if it
passes. Prints what was achieved and why not more first, then what the
transform did and a before/after table.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from rich.table import Table

from onnxsmith.cli.common import add_verify_options, made_and_saved, out, verify_keywords
from onnxsmith.cli.render import comparison_table
from onnxsmith.core import options as opts
from onnxsmith.io.files import human_bytes
from onnxsmith.settings import TransformSettings
from onnxsmith.settings.execution import ENGINE_TITLE, EngineOptions

if TYPE_CHECKING:
    from onnxsmith import api


def register_transform(parser: argparse.ArgumentParser, transform: TransformSettings, *, samples: int = 4) -> None:
    parser.add_argument("source", help="the source .onnx model (never modified)")
    parser.add_argument("output", help="where to write the variant")
    opts.add_arguments(parser, transform.options)
    add_verify_options(parser, samples=samples, taken=_own_options(transform))
    if transform.on_engines:
        opts.add_arguments(parser, EngineOptions, title=ENGINE_TITLE)
    parser.add_argument(
        "--external-data", action="store_true", help="store weights in OUT.data even if they fit one file"
    )
    parser.add_argument(
        "--report",
        metavar="JSON",
        help="also write what was done and measured as JSON (refused by the gate too: it says so)",
    )
    parser.add_argument(
        "--explain", action="store_true", help="also show each change and why, with before/after breakdowns"
    )
    parser.set_defaults(func=lambda args: run_transform_command(args, transform))


def run_transform_command(args: argparse.Namespace, transform: TransformSettings) -> int:
    from onnxsmith import api

    options = opts.from_args(args, transform.options)
    data = args.output + ".data" if args.external_data else None
    api.check_outputs([args.output, data, args.report], sources=[args.source])
    variant = made_and_saved(
        lambda progress: api.transform(
            args.source,
            transform.name,
            **opts.to_json(options),
            **verify_keywords(args, taken=_own_options(transform)),
            **(opts.given_args(args, EngineOptions) if transform.on_engines else {}),
            external_data=True if args.external_data else None,
            out=args.output,
            progress=progress,
        ),
        args.output,
        report=args.report,
    )
    print_variant(variant, explain=getattr(args, "explain", False))
    return 0


def _own_options(transform: TransformSettings) -> frozenset[str]:
    """The transform's option names: a gate bound among them (int8's ``min_cosine``) reaches the gate as
    the transform's setting (``Transform.gate_settings``), not as a second flag."""
    return frozenset(f.name for f in dataclasses.fields(transform.options))


def print_headline(lines: list[str]) -> None:
    """What was achieved and why not more: the first thing every variant command prints."""
    first, *rest = lines
    out.print(first, style="bold")
    for line in rest:
        out.print(f"  {line}")


def print_variant(variant: api.Variant, *, explain: bool = False) -> None:
    report = variant.report
    print_headline(report.headline)
    for step in report.steps:
        out.print(step.step, style="bold")
        for note in step.notes:
            out.print(f"  - {note}")
        for title, rows in {**step.tables, **(step.details if explain else {})}.items():
            if rows:
                out.print(rows_table(title, rows))
    table = Table(title="before / after", title_justify="left")
    for column in ("", "source", "variant"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("nodes", str(report.nodes_before), str(report.nodes_after))
    table.add_row("bytes", human_bytes(report.source.bytes), human_bytes(sum(f.bytes for f in variant.files)))
    for step in report.steps:
        for key, (before, after) in step.stats.get("before_after", {}).items():
            table.add_row(key, str(before), str(after))
    out.print(table)
    out.print(comparison_table(variant.comparison))
    for f in variant.files:
        out.print(f"wrote {f.path} ({human_bytes(f.bytes)}, sha256 {f.sha256})")


def rows_table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in rows[0]:
        table.add_column(str(column))
    for row in rows:
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()))
    return table
