"""``onnxsmith card RELEASE``: write a release's README.md again from its measurements.json.

The files it pins are re-hashed first: a card never lists a hash its file no
longer has. ``--recipe`` takes the card's title, description and license from a
(possibly edited) recipe.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxsmith.cli.common import out


def register(subparsers) -> None:
    parser = subparsers.add_parser("card", help="write a release's README.md (files, hashes, validation, benchmark)")
    parser.add_argument("release", help="a folder made by `onnxsmith build`")
    parser.add_argument("--recipe", help="take title, description, homepage and license from this recipe's [card]")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith.release.build import rewrite_card  # matplotlib & co: only when writing
    from onnxsmith.release.recipe import load_recipe

    fields = None
    if args.recipe:
        recipe = load_recipe(args.recipe)
        fields = {
            "title": recipe.card.title or recipe.source.stem,
            "description": recipe.card.description,
            "homepage": recipe.card.homepage,
            "license": recipe.license_text(),
        }
    record = rewrite_card(Path(args.release), fields)
    out.print(f"wrote {record.path} ({record.bytes:,} bytes)")
    return 0
