#!/usr/bin/env python
"""Does a refactoring change what users get? Variants made by another checkout and by this one, byte for byte.

Each model is converted by ``onnxsmith int8 --no-speed``, ``fp16``, ``fuse`` and ``shrink`` (and the GPT-2
fixture by ``quantize``) twice, once with the source of ``--before REV`` (a temporary git worktree) and once
with this checkout's, and the sha256 of the two files are compared (variants are deterministic: same input and
options, same bytes); a refusal must be the same refusal. Printed as a Markdown table; exit 1 when any pair
differs. The models are the test fixture and corpus models installed by the test setup.

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
COMMANDS = {"int8": ["--no-speed"], "fp16": [], "fuse": [], "shrink": []}
#: The language-model quantizer, on the model folder it is for (its variant is a folder: every file's bytes).
LM = (REPO / "tests" / "fixtures" / "gpt2", "quantize", [])


def made(src: Path, command: str, model: Path, out: Path, options: list[str]) -> str:
    """The sha256 of the variant ``src``'s onnxsmith makes, or what went wrong."""
    done = subprocess.run(
        [sys.executable, "-m", "onnxsmith", command, str(model), str(out), *options],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1].replace(str(out), 'OUT')[:60]}"
    if out.is_dir():  # a model folder: its files' paths and bytes, in order
        digest = hashlib.sha256()
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            digest.update(path.relative_to(out).as_posix().encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()
    return hashlib.sha256(out.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="34dd916", help="the checkout to compare with (a git revision)")
    args = parser.parse_args()
    rows, differ = [], 0
    runs = [(model, command, options) for model in MODELS for command, options in COMMANDS.items()] + [LM]
    with checkout(args.before) as before, tempfile.TemporaryDirectory() as tmp:
        for model, command, options in runs:
            out = {side: Path(tmp) / side / f"{model.stem}.{command}.onnx" for side in ("before", "now")}
            for path in out.values():
                path.parent.mkdir(exist_ok=True)
            old = made(before / "src", command, model, out["before"], options)
            new = made(REPO / "src", command, model, out["now"], options)
            refused = len(new) != 64
            differ += old != new
            same = "NO" if old != new else "same refusal" if refused else "yes"
            rows.append(f"| {model.name} | {command} | {old[:16]} | {new[:16]} | {same} |")
    print(f"| model | command | sha256 before ({args.before}) | sha256 now | same bytes |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
