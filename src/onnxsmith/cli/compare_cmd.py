"""``onnxsmith compare A B``: run both on the same inputs and judge every output (:func:`onnxsmith.api.compare`)."""

from __future__ import annotations

import argparse

from rich.text import Text

from onnxsmith.cli.common import add_fp16_mode_option, add_verify_options, out, print_json, verify_keywords
from onnxsmith.cli.render import comparison_table


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reference", help="the model taken as right (usually the source)")
    parser.add_argument("candidate", help="the model checked against it")
    add_verify_options(parser, samples=1)
    add_fp16_mode_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    comparison = api.compare(
        args.reference,
        args.candidate,
        **verify_keywords(args),
        fp16_mode=args.fp16_mode,
    )
    if args.json:
        print_json(comparison.to_json())
    else:
        out.print(comparison_table(comparison))
        if comparison.passed:
            out.print("passes the gate", style="green")
        else:
            out.print(Text.assemble(("fails the gate:", "red"), f" {comparison.verdict()}"))
    return 0 if comparison.passed else 1
