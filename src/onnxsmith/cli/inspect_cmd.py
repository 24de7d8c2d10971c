"""``onnxsmith inspect MODEL``: what a model is made of, and what looks wrong with it."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table
from rich.text import Text

from onnxsmith.cli.common import out, print_json
from onnxsmith.cli.render import bytes_table
from onnxsmith.core.options import non_negative_int
from onnxsmith.io.files import human_bytes


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--top", type=non_negative_int, default=10, help="how many of the largest tensors to list")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    path = Path(args.model)
    summary = api.inspect(path, top=args.top)
    if args.json:
        print_json(summary.to_json())
        return 0
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in summary.opsets.items())
    out.print(
        Text.assemble(
            (path.name, "bold"), f"  IR {summary.ir_version}; opsets {opsets}; producer {summary.producer or '-'}"
        )
    )
    out.print(
        f"{summary.node_count} nodes ({summary.subgraphs} subgraphs), {summary.parameters:,} parameters, "
        f"file {human_bytes(summary.file_bytes or 0)}"
    )
    io = Table(title="inputs and outputs", title_justify="left")
    for column in ("", "name", "dtype", "dims"):
        io.add_column(column)
    for kind, values in (("input", summary.inputs), ("output", summary.outputs)):
        for v in values:
            io.add_row(kind, v["name"], v["dtype"], "[" + ", ".join(str(d) for d in v["dims"]) + "]")
    out.print(io)
    ops = Table(title="nodes by op type (subgraphs included)", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, count in summary.ops.items():
        ops.add_row(op, str(count))
    out.print(ops)
    out.print(
        bytes_table(
            "parameters by dtype (initializers and Constant nodes)", summary.bytes_by_dtype, summary.params_by_dtype
        )
    )
    largest = Table(title=f"largest {len(summary.largest)} tensors", title_justify="left")
    for column in ("name", "dtype", "shape", "bytes", "held in", "read by"):
        largest.add_column(column, justify="right" if column == "bytes" else "left")
    for t in summary.largest:
        readers = ", ".join(t.readers[:3]) + (f" (+{len(t.readers) - 3})" if len(t.readers) > 3 else "")
        largest.add_row(t.name, t.dtype, "x".join(map(str, t.shape)), human_bytes(t.bytes), t.kind, readers)
    out.print(largest)
    for warning in summary.warnings:
        out.print(Text.assemble(("warning:", "yellow"), f" {warning}"))
    return 0
