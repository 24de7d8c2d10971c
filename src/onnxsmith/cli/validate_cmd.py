"""``onnxsmith validate SRC VARIANT --task NAME --data ...``: judge a variant on real data.

Runs both models on the task's samples (storage-faithfully for fp16), in shards here
or on a Ray cluster (``--ray``), prints the task's metrics against their gates,
optionally writes them as JSON, and exits 1 when a gate fails.
"""

from __future__ import annotations

import argparse
import json

from rich.text import Text

from onnxsmith.cli.common import add_fp16_mode_option, err, out
from onnxsmith.cli.release_tables import rows_table, validation_table, worst_table
from onnxsmith.cli.task_args import add_task_arguments, parse_gates, task_options_from_args
from onnxsmith.core import options as opts
from onnxsmith.core.text import for_terminal
from onnxsmith.io.files import write_text_atomic
from onnxsmith.settings.execution import EXECUTION_TITLE, ExecutionOptions


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="the source model (taken as right)")
    parser.add_argument("variant", help="the variant judged against it")
    add_task_arguments(parser)
    parser.add_argument(
        "--gate",
        action="append",
        metavar="METRIC=BOUND",
        help="bound a metric (repeatable; replaces the task's default for that metric)",
    )
    add_fp16_mode_option(parser)
    opts.add_arguments(parser, ExecutionOptions, title=EXECUTION_TITLE)
    parser.add_argument("--json", metavar="FILE", help="also write the metrics and per-sample rows as JSON")
    parser.add_argument("--details", action="store_true", help="print one row per sample")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api  # here: --help loads no engine
    from onnxsmith.tasks import get_task

    options = opts.to_json(task_options_from_args(args, get_task(args.task)))
    options.update(opts.given_args(args, ExecutionOptions))
    gates = parse_gates(args.gate)
    api.check_outputs([args.json], sources=[args.source, args.variant])
    with err.status("") as status:
        validation = api.validate(
            args.source,
            args.variant,
            task=args.task,
            gates=gates,
            fp16_mode=args.fp16_mode,
            progress=status.update,
            **options,
        )
    out.print(validation_table([validation]))
    out.print(Text(f"samples run in {for_terminal(validation.ran_on)}", style="dim"))
    if validation.worst:
        out.print(worst_table(validation))
    if args.details:
        out.print(rows_table(validation))
    if args.json:
        write_text_atomic(args.json, json.dumps(validation.to_json(), indent=1) + "\n")
    if validation.passed:
        out.print("all gates hold", style="green")
        return 0
    for line in validation.failures():
        out.print(Text.assemble(("gate failed:", "red"), f" {line}"))
    return 1
