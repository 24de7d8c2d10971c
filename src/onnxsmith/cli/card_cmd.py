"""``onnxsmith card RELEASE``: write a release's README.md again from its measurements.json.

The files it pins are re-hashed first: a card never lists a hash its file no
longer has. ``--recipe`` takes the card's title, description and license from a
(possibly edited) recipe.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxsmith.cli.common import out


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("release", help="a folder made by `onnxsmith build`")
    parser.add_argument("--recipe", help="take title, description, homepage and license from this recipe's [card]")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    record = api.card(Path(args.release), recipe=args.recipe)
    out.print(f"wrote {record.path} ({record.bytes:,} bytes)")
    return 0
