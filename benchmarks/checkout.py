"""Another revision of this repository as a temporary git worktree: what a before/after benchmark runs."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """The tree of ``revision``, detached in a temporary folder, removed (and unregistered) afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), revision],
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)
