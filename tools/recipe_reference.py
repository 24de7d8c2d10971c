"""Rewrite the key reference in docs/recipe.md from the recipe's schema.

    python -m tools.recipe_reference

The reference lies between the ``<!-- recipe-keys -->`` markers; tests/test_recipe.py fails while
it differs from what src/onnxsmith/release/recipe_schema.py renders.
"""

from __future__ import annotations

import re
from pathlib import Path

from onnxsmith.release.recipe_schema import reference

DOC = Path(__file__).resolve().parent.parent / "docs" / "recipe.md"
BLOCK = re.compile(r"(<!-- recipe-keys:[^\n]*-->\n)(.*?)(<!-- /recipe-keys -->)", re.S)


def documented(text: str) -> str:
    """The reference as docs/recipe.md holds it."""
    found = BLOCK.search(text)
    if found is None:
        raise SystemExit(f"{DOC} has no <!-- recipe-keys --> block")
    return found.group(2)


def main() -> None:
    text = DOC.read_text(encoding="utf-8")
    documented(text)
    DOC.write_text(BLOCK.sub(lambda m: m.group(1) + "\n" + reference() + "\n" + m.group(3), text), encoding="utf-8")
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
