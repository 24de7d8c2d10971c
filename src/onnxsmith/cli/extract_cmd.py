"""``onnxsmith extract SRC OUT --inputs a,b --outputs c,d``: the subgraph between named tensors, verified."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from onnxsmith.cli.common import err, out
from onnxsmith.cli.render import comparison_table
from onnxsmith.io.files import human_bytes, write_text_atomic
from onnxsmith.io.load import load_model, source_files
from onnxsmith.io.paths import check_outputs
from onnxsmith.release.extract import extract_piece
from onnxsmith.runtime.inputs import DEFAULT_SEED, load_npz, parse_shape_options, random_inputs
from onnxsmith.verify.compare import DEFAULT_ATOL, DEFAULT_RTOL


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "extract",
        help="the subgraph between named tensors as a model of its own, typed and verified against the source",
    )
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
    data = parser.add_argument_group("inputs the source is run on (to verify the piece and type what inference cannot)")
    data.add_argument(
        "--shape",
        action="append",
        metavar="NAME:D0,D1|DIM=N",
        help="shape of a source input with symbolic dims (repeatable), or a size for a named dim",
    )
    data.add_argument("--input-data", metavar="NPZ", help="run on these arrays (named like the source's inputs)")
    data.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the random inputs (default %(default)s)")
    data.add_argument("--samples", type=int, default=2, help="how many random input sets (default %(default)s)")
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL, help="absolute tolerance (default %(default)g)")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="relative tolerance (default %(default)g)")
    parser.add_argument(
        "--external-data",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="store weights in OUT.data (default: as the source does, and always past 2 GB)",
    )
    parser.add_argument("--report", metavar="JSON", help="also write what was done and measured as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    source = load_model(args.source)
    check_outputs([args.output, args.report], protect=source_files(source, args.source))
    if args.input_data:
        feeds = [load_npz(args.input_data, source)]
    else:
        shapes, dims = parse_shape_options(args.shape)
        feeds = [
            random_inputs(source, shapes=shapes, dims=dims, seed=args.seed + i) for i in range(max(1, args.samples))
        ]
    del source
    with err.status("") as status:
        result = extract_piece(
            args.source,
            args.output,
            args.inputs,
            args.outputs,
            feeds=feeds,
            atol=args.atol,
            rtol=args.rtol,
            external_data=args.external_data,
            progress=lambda message: status.update(message),
        )
    out.print(
        f"[bold]extract[/]  {result.nodes_piece} of {result.nodes_source} nodes; {result.initializers} initializers "
        f"({human_bytes(result.initializer_bytes)} of the source's {human_bytes(result.source_initializer_bytes)})"
    )
    for note in result.notes:
        out.print(f"  - {note}")
    out.print(_io_table(Path(args.output)))
    out.print(comparison_table(result.comparison))
    for f in result.files:
        out.print(f"wrote {f.path} ({human_bytes(f.bytes)}, sha256 {f.sha256})")
    if args.report:
        write_text_atomic(args.report, json.dumps(result.to_json(), indent=2, default=str) + "\n")
    return 0


def _io_table(path: Path) -> Table:
    piece = load_model(path)
    table = Table(title="the piece's inputs and outputs", title_justify="left")
    for column in ("", "name", "dtype", "dims"):
        table.add_column(column)
    for kind, values in (("input", piece.graph.inputs), ("output", piece.graph.outputs)):
        for v in values:
            dims = [d if isinstance(d, int) else (d.value or "?") for d in v.shape] if v.shape is not None else ["?"]
            table.add_row(kind, v.name, v.dtype.name if v.dtype else "?", escape("[" + ", ".join(map(str, dims)) + "]"))
    return table
