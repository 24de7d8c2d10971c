"""``onnxsmith build recipe.toml [--out DIR]``: the release a recipe describes.

Exit 0 when every variant is published; 1 when a variant failed its gate (the
others are still published, the card says why it is missing); 2 for a bad
recipe (``recipe.toml:LINE: problem``) or an ``--out`` holding files no build
made (``--force`` keeps them), before any work starts.

Several recipes (or a folder of them) are built one job each, here or on a Ray
cluster (``--engine ray``, ``--ray ADDRESS``): ``--out`` is then the folder the
releases go in. Exit 1 when any variant was refused or any build stopped (the
others are built); a table says what became of each.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table
from rich.text import Text

from onnxsmith.cli.common import err, out
from onnxsmith.core import options as opts
from onnxsmith.core.errors import EXIT_INCOMPLETE, GateFailed, OnnxsmithError
from onnxsmith.core.text import for_terminal
from onnxsmith.settings.execution import EXECUTION_TITLE, ExecutionOptions


class IncompleteBuild(OnnxsmithError):
    """Some of several recipes were not wholly published; the rest were."""

    exit_code = EXIT_INCOMPLETE


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "recipe", nargs="+", help="the recipe (TOML); several, or a folder of them, build one release each"
    )
    parser.add_argument(
        "--out",
        help="the release folder (default: release/<recipe folder name>); with several recipes, the folder "
        "their releases go in",
    )
    parser.add_argument(
        "--no-bench",
        action="store_true",
        help="skip the benchmark (quicker while iterating on a recipe; the card then has no timings)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="build into a folder that also holds files no build made (a git checkout, notes): they are "
        "kept, and only the earlier release's files are replaced",
    )
    opts.add_arguments(
        parser,
        ExecutionOptions,
        title=EXECUTION_TITLE,
        description="one recipe: where its validation runs (over its [execution]); several: where each is built",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    execution = opts.given_args(args, ExecutionOptions)
    if len(args.recipe) > 1 or Path(args.recipe[0]).is_dir():
        return _run_many(args, execution)
    with err.status(f"building {args.out or 'the release'}") as status:
        result = api.build(
            args.recipe[0],
            args.out,
            progress=status.update,
            log=err.print,
            bench=not args.no_bench,
            force=args.force,
            **execution,
        )
    table = Table(title=f"release {result.out}", title_justify="left")
    for column in ("variant", "status", "file", "bytes"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    for o in result.outcomes:
        files = o.files if o.published else []
        table.add_row(
            o.variant.name,
            Text("published", "green") if o.published else Text("not published", "red"),
            ", ".join(f.path.relative_to(result.out).as_posix() for f in files) or "-",
            f"{sum(f.bytes for f in files):,}" if files else "-",
        )
    out.print(table)
    out.print(
        f"card {result.out / 'README.md'}, report {result.out / 'report.html'}, "
        f"measurements {result.out / 'measurements.json'}"
    )
    if result.failed:
        reasons = "; ".join(f"'{o.variant.name}' ({o.reason})" for o in result.failed)
        raise GateFailed(
            f"{len(result.failed)} variant(s) failed their gates and were not published: {reasons}", result.out
        )
    return 0


def _run_many(args: argparse.Namespace, execution: dict) -> int:
    from onnxsmith import api

    with err.status("building the releases") as status:
        results = api.build_all(
            args.recipe, args.out, progress=status.update, bench=not args.no_bench, force=args.force, **execution
        )
    table = Table(title="releases", title_justify="left")
    for column in ("recipe", "release", "published", "not published"):
        table.add_column(column, overflow="fold")  # a path folded, not cut short: it is what a user looks for
    for r in results:
        refused = r.error or "; ".join(f"{name} ({why})" for name, why in r.failed) or "-"
        cells = (r.recipe, r.out, ", ".join(r.published) or "-")
        table.add_row(
            *(Text(for_terminal(c)) for c in cells), Text(for_terminal(refused), "red" if refused != "-" else "")
        )
    out.print(table)
    stopped = [r for r in results if not r.ok]
    if stopped:
        names = ", ".join(Path(r.recipe).name for r in stopped)
        raise IncompleteBuild(f"{len(stopped)} of {len(results)} recipe(s) not wholly published: {names}")
    return 0
