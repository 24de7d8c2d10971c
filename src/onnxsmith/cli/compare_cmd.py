"""``onnxsmith compare A B``: run both on the same inputs and compare every output (:func:`onnxsmith.api.compare`)."""

from __future__ import annotations

import argparse

from onnxsmith import api
from onnxsmith.cli.common import add_input_options, input_keywords, out, print_json
from onnxsmith.cli.render import comparison_table
from onnxsmith.runtime.runner import FP16_MODES
from onnxsmith.verify.compare import DEFAULT_ATOL, DEFAULT_RTOL


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="run two models on the same inputs and compare every output (exit 1 outside tolerance)"
    )
    parser.add_argument("reference", help="the model taken as right (usually the source)")
    parser.add_argument("candidate", help="the model checked against it")
    add_input_options(parser)
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL, help="absolute tolerance (default %(default)g)")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="relative tolerance (default %(default)g)")
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
        atol=args.atol,
        rtol=args.rtol,
        fp16_mode=args.fp16_mode,
    )
    if args.json:
        print_json(comparison.to_json())
    else:
        out.print(comparison_table(comparison))
        verdict = "[green]within tolerance[/]" if comparison.passed else "[red]outside tolerance[/]"
        out.print(f"{verdict} (atol {args.atol:g}, rtol {args.rtol:g})")
        for line in comparison.failures():
            out.print(f"  {line}")
    return 0 if comparison.passed else 1
