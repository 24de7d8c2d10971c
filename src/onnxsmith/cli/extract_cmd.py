"""``onnxsmith extract SRC OUT --inputs a,b --outputs c,d``: the subgraph between named tensors, verified
(:func:`onnxsmith.api.extract`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from onnxsmith.cli.common import add_verify_options, made_and_saved, out, verify_keywords
from onnxsmith.cli.render import comparison_table
from onnxsmith.cli.transform_cmd import print_headline
from onnxsmith.io.files import human_bytes

if TYPE_CHECKING:
    from onnxsmith import api


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="the source .onnx model (never modified)")
    parser.add_argument("output", help="where to write the piece")
    parser.add_argument(
        "--inputs",
        type=_names,
        metavar="A,B",
        help="tensors that become the piece's inputs (default: the source's inputs that the outputs read)",
    )
    parser.add_argument(
        "--outputs", type=_names, required=True, metavar="C,D", help="tensors that become the piece's outputs"
    )
    add_verify_options(
        parser,
        samples=2,
        title="inputs the source is run on (to verify the piece and type what inference cannot)",
        flags={"feeds": ("--input-data",)},  # its --inputs names the piece's input tensors
    )
    parser.add_argument(
        "--external-data",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="store weights in OUT.data (default: as the source does, and always past 2 GB)",
    )
    parser.add_argument(
        "--report",
        metavar="JSON",
        help="also write what was done and measured as JSON (refused by the gate too: it says so)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    api.check_outputs([args.output, args.report], sources=[args.source])
    piece = made_and_saved(
        lambda progress: api.extract(
            args.source,
            inputs=args.inputs,
            outputs=args.outputs,
            **verify_keywords(args),
            external_data=args.external_data,
            out=args.output,
            progress=progress,
        ),
        args.output,
        report=args.report,
    )
    report = piece.report
    kept = report.steps[0].stats["initializers"]
    print_headline(report.headline)
    out.print(
        Text.assemble(
            ("extract", "bold"),
            f"  {report.nodes_after} of {report.nodes_before} nodes; {kept['count']} initializers "
            f"({human_bytes(kept['bytes'])} of the source's {human_bytes(kept['source_bytes'])})",
        )
    )
    for note in report.steps[0].notes:
        out.print(f"  - {note}")
    out.print(_io_table(piece))
    out.print(comparison_table(piece.comparison))
    for f in piece.files:
        out.print(f"wrote {f.path} ({human_bytes(f.bytes)}, sha256 {f.sha256})")
    return 0


def _io_table(piece: api.Piece) -> Table:
    table = Table(title="the piece's inputs and outputs", title_justify="left")
    for column in ("", "name", "dtype", "dims"):
        table.add_column(column)
    for kind, values in (("input", piece.inputs), ("output", piece.outputs)):
        for v in values:
            table.add_row(kind, v["name"], v["dtype"], "[" + ", ".join(map(str, v["dims"])) + "]")
    return table
