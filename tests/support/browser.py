"""Headless Chromium: a screenshot of a page, and what the page said on its console."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.release import REPO

SETUP = REPO / "tools" / "setup-chromium.sh"
_CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]? (.*)")


@dataclass
class PageRun:
    returncode: int
    screenshot: Path
    console: list[str]  # every console message, errors and uncaught exceptions included
    log: str


def chromium() -> str:
    """The chromium binary, installed by tools/setup-chromium.sh if missing."""
    found = shutil.which("chromium")
    if found is None:
        subprocess.run(["bash", str(SETUP)], check=True)
        found = shutil.which("chromium")
    assert found, "chromium is not installed and tools/setup-chromium.sh could not install it"
    return found


def screenshot(page: Path, png: Path, *, width: int = 1100, height: int = 3000) -> PageRun:
    with tempfile.TemporaryDirectory(prefix="onnxsmith-chromium-") as profile:
        done = subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "--enable-logging=stderr",
                "--v=0",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    console = [m.group(1) for line in done.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return PageRun(done.returncode, png, console, done.stderr)
