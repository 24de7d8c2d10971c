"""``onnxsmith bench MODEL... --batch 1,5,10``: latency, throughput and memory side by side.

Each model runs in its own process (no shared memory or caches); prints a table
and optionally writes JSON and an SVG plot of latency against batch size.

A file that is not a valid model is refused before any work, like every command
refuses it. Of valid models, what can be benchmarked is: one whose inputs have a fixed
batch is measured at that batch (the table says so); one onnxruntime cannot load or
run, or a batch size that fails, is named under the table with onnxruntime's reason.
Exit status: 0 when every model was measured; 1 when some could not be (or a batch
size failed) and the rest were (the table, --json and --plot hold those); 2 when none
could be, a file is not a model, or an option is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from onnxsmith.cli.common import err, out, session_config
from onnxsmith.cli.release_tables import bench_table
from onnxsmith.core.errors import Incomplete, InputError
from onnxsmith.core.options import add_arguments, given_args
from onnxsmith.io.files import write_text_atomic
from onnxsmith.settings.bench import BenchOptions


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="+", help=".onnx files (each runs in its own process)")
    add_arguments(parser, BenchOptions, title="what is measured")
    parser.add_argument(
        "--session-config",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="a session config entry every model gets (repeatable)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="SVG", help="also draw latency and throughput against batch size")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    api.check_outputs([args.json, args.plot], sources=args.models)  # a file that is no model: exit 2
    with err.status("") as status:
        config = session_config(args.session_config)
        options = given_args(args, BenchOptions)
        run = api.bench(args.models, **options, session_config=config, progress=status.update)
    if not run.results:
        only = run.failures[0] if len(run.failures) == 1 else None
        raise InputError(only.reason, only.path) if only else InputError(run.shortfall())
    out.print(bench_table(run.results))
    for note in run.notes():
        out.print(note, markup=False, soft_wrap=True)
    if args.json:
        write_text_atomic(
            args.json, json.dumps({"settings": dataclasses.asdict(run.settings), **run.to_json()}, indent=1) + "\n"
        )
    if args.plot:
        from onnxsmith.release import plots  # matplotlib: only when plotting

        write_text_atomic(args.plot, plots.latency_figure(run.to_json()["results"]))
        out.print(f"wrote {args.plot}")
    if run.shortfall():
        raise Incomplete(run.shortfall())
    return 0
