"""A command for every transform: ``onnxsmith NAME SRC OUT [options]``.

Loads SRC, applies the transform, verifies the result against SRC on the
calibration inputs (storage-faithfully for fp16) and writes OUT only if it
passes. Prints what the transform did and a before/after table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from onnxsmith.cli.common import add_input_options, err, feeds_from_args, out
from onnxsmith.cli.render import comparison_table
from onnxsmith.core import options as opts
from onnxsmith.core.transform import Transform
from onnxsmith.io.files import human_bytes, write_text_atomic
from onnxsmith.io.load import load_model, source_files
from onnxsmith.io.paths import check_outputs
from onnxsmith.release.variant import VariantResult, produce_variant


def register_transform(subparsers, transform_cls: type[Transform], *, samples: int = 4) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(transform_cls.name, help=transform_cls.summary)
    parser.add_argument("source", help="the source .onnx model (never modified)")
    parser.add_argument("output", help="where to write the variant")
    opts.add_arguments(parser, transform_cls.Options)
    add_input_options(parser, samples=samples)
    gate = parser.add_argument_group("verification gate")
    gate.add_argument("--atol", type=float, help="absolute tolerance (default: the transform's own)")
    gate.add_argument("--rtol", type=float, help="relative tolerance (default: the transform's own)")
    parser.add_argument(
        "--external-data", action="store_true", help="store weights in OUT.data even if they fit one file"
    )
    parser.add_argument("--report", metavar="JSON", help="also write what was done and measured as JSON")
    parser.add_argument(
        "--explain", action="store_true", help="also show each change and why, with before/after breakdowns"
    )
    parser.set_defaults(func=lambda args: run_transform_command(args, transform_cls))
    return parser


def run_transform_command(args: argparse.Namespace, transform_cls: type[Transform]) -> int:
    options = opts.from_args(args, transform_cls.Options)
    model = load_model(args.source)
    data = args.output + ".data" if args.external_data else None
    check_outputs([args.output, data, args.report], protect=source_files(model, args.source))
    feeds = feeds_from_args(args, model)
    del model
    with err.status("") as status:
        result = produce_variant(
            args.source,
            args.output,
            [(transform_cls.name, options)],
            feeds=feeds,
            atol=args.atol,
            rtol=args.rtol,
            external_data=True if args.external_data else None,
            progress=lambda message: status.update(message),
        )
    print_result(Path(args.source), result, explain=getattr(args, "explain", False))
    if args.report:
        write_text_atomic(args.report, json.dumps(result_json(result), indent=2, default=str) + "\n")
    return 0


def print_result(source: Path, result: VariantResult, *, explain: bool = False) -> None:
    for report in result.reports:
        out.print(f"[bold]{report.step}[/]")
        for note in report.notes:
            out.print(f"  - {note}")
        for title, rows in {**report.tables, **(report.details if explain else {})}.items():
            if rows:
                out.print(rows_table(title, rows))
    table = Table(title="before / after", title_justify="left")
    for column in ("", "source", "variant"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("nodes", str(result.nodes_before), str(result.nodes_after))
    table.add_row("bytes", human_bytes(_model_bytes(source)), human_bytes(sum(f.bytes for f in result.files)))
    for report in result.reports:
        for key, (before, after) in report.stats.get("before_after", {}).items():
            table.add_row(key, str(before), str(after))
    out.print(table)
    out.print(comparison_table(result.comparison))
    for f in result.files:
        out.print(f"wrote {f.path} ({human_bytes(f.bytes)}, sha256 {f.sha256})")


def rows_table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in rows[0]:
        table.add_column(str(column))
    for row in rows:
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()))
    return table


def _model_bytes(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def result_json(result: VariantResult) -> dict:
    return {
        "files": [f.to_json() for f in result.files],
        "nodes": {"before": result.nodes_before, "after": result.nodes_after},
        "steps": [r.to_json() for r in result.reports],
        "verification": result.comparison.to_json(),
    }
