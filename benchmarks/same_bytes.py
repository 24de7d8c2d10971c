#!/usr/bin/env python
"""Does a refactoring change what users get? Variants made by another checkout and by this one, byte for byte.

Each model is converted by ``onnxsmith int8 --no-speed`` and ``onnxsmith fp16`` twice, once with the source of
``--before REV`` (a temporary git worktree) and once with this checkout's, and the sha256 of the two files are
compared (variants are deterministic: same input and options, same bytes). Printed as a Markdown table; exit 1
when any pair differs. The models are the test fixture and corpus models installed by the test setup.

    .venv/bin/python benchmarks/same_bytes.py [--before 34dd916]
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.checkout import checkout  # noqa: E402

MODELS = [
    REPO / "tests" / "fixtures" / "faceage_dynamo.onnx",
    REPO / ".cache" / "realmodels" / "minilm" / "paraphrase-MiniLM-L3-v2.onnx",
    REPO / ".cache" / "realmodels" / "nudenet_320n" / "320n.onnx",
    REPO / ".cache" / "realmodels" / "captcha_crnn" / "captcha_crnn.onnx",
]
COMMANDS = {"int8": ["--no-speed"], "fp16": []}


def made(src: Path, command: str, model: Path, out: Path) -> str:
    """The sha256 of the variant ``src``'s onnxsmith makes, or what went wrong."""
    done = subprocess.run(
        [sys.executable, "-m", "onnxsmith", command, str(model), str(out), *COMMANDS[command]],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1][:80]}"
    return hashlib.sha256(out.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="34dd916", help="the checkout to compare with (a git revision)")
    args = parser.parse_args()
    rows, differ = [], 0
    with checkout(args.before) as before, tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            for command in COMMANDS:
                old = made(before / "src", command, model, Path(tmp) / f"{model.stem}.{command}.before.onnx")
                new = made(REPO / "src", command, model, Path(tmp) / f"{model.stem}.{command}.now.onnx")
                same = old == new and len(new) == 64
                differ += not same
                rows.append(f"| {model.name} | {command} | {old[:16]} | {new[:16]} | {'yes' if same else 'NO'} |")
    print(f"| model | command | sha256 before ({args.before}) | sha256 now | same bytes |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
