"""``onnxsmith compare A B``: run both on the same inputs and judge every output (:func:`onnxsmith.api.compare`)."""

from __future__ import annotations

import argparse

from onnxsmith import api
from onnxsmith.cli.common import add_gate_options, add_input_options, gate_keywords, input_keywords, out, print_json
from onnxsmith.cli.render import comparison_table
from onnxsmith.runtime.runner import FP16_MODES


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="run two models on the same inputs and judge every output with the gate the transforms use "
        "(exit 1 when it fails)",
    )
    parser.add_argument("reference", help="the model taken as right (usually the source)")
    parser.add_argument("candidate", help="the model checked against it")
    add_input_options(parser)
    add_gate_options(parser)
    parser.add_argument(
        "--fp16-mode",
        choices=FP16_MODES,
        default="auto",
        help="auto: models with fp16 tensors run storage-faithfully (every fp16 tensor really rounded "
        "to fp16, as a GPU holds it); native: as onnxruntime's CPU provider runs them, which upcasts "
        "and hides fp16 overflow",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    comparison = api.compare(
        args.reference,
        args.candidate,
        **input_keywords(args),
        **gate_keywords(args),
        fp16_mode=args.fp16_mode,
    )
    if args.json:
        print_json(comparison.to_json())
    else:
        out.print(comparison_table(comparison))
        if comparison.passed:
            out.print("[green]passes the gate[/]")
        else:
            out.print(f"[red]fails the gate:[/] {comparison.verdict()}")
    return 0 if comparison.passed else 1
