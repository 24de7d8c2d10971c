"""``onnxsmith build recipe.toml [--out DIR]``: the release a recipe describes.

Exit 0 when every variant is published; 1 when a variant failed its gate (the
others are still published, the card says why it is missing); 2 for a bad
recipe (``recipe.toml:LINE: problem``) or an ``--out`` holding files no build
made (``--force`` keeps them), before any work starts.
"""

from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from onnxsmith.cli.common import err, out
from onnxsmith.core.errors import GateFailed


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="the recipe (TOML)")
    parser.add_argument("--out", help="the release folder (default: release/<recipe folder name>)")
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    with err.status(f"building {args.out or 'the release'}") as status:
        result = api.build(
            args.recipe, args.out, progress=status.update, log=err.print, bench=not args.no_bench, force=args.force
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
