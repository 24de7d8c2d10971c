#!/usr/bin/env python
"""How long ``onnxsmith --help`` and each command's ``--help`` take (issue 25: <= 0.3 s, median of 10).

Each help is run as a fresh process, 10 times, interleaved with the same help of another checkout (``--before
REV``, default the commit before the lazy command line: every command module imported its engines) and an
empty Python start, so the machine's noise falls on all alike. Printed as a Markdown table.

    .venv/bin/python benchmarks/cli_help.py [--before 34dd916] [--runs 10]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.checkout import checkout  # noqa: E402

COMMANDS = [
    [],
    ["fp16"],
    ["fuse"],
    ["int8"],
    ["quantize"],
    ["shrink"],
    ["compare"],
    ["build"],
    ["validate"],
    ["validate", "--task", "generic"],  # a task's options: its group alone, from settings/ (no engine)
    ["predict", "--task", "faceage"],
]


def seconds(argv: list[str], src: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import sys; from onnxsmith.cli.main import main; sys.exit(main())", *argv],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="34dd916", help="the checkout to compare with (a git revision)")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with checkout(args.before) as before:
        times: dict[tuple[str, str], list[float]] = {}
        python = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            python.append(time.perf_counter() - start)
            for argv in COMMANDS:
                for label, src in (("now", REPO / "src"), ("before", before / "src")):
                    times.setdefault((" ".join(argv), label), []).append(seconds([*argv, "--help"], src))
    print(
        f"{platform.machine()}, Python {platform.python_version()}, median of {args.runs} fresh processes; "
        f"an empty Python start: {statistics.median(python):.3f} s\n"
    )
    print(f"| command | now | before ({args.before}) |")
    print("|---|---|---|")
    for argv in COMMANDS:
        name = " ".join(["onnxsmith", *argv, "--help"])
        now, old = (statistics.median(times[(" ".join(argv), label)]) for label in ("now", "before"))
        print(f"| `{name}` | {now:.3f} s | {old:.3f} s |")


if __name__ == "__main__":
    main()
