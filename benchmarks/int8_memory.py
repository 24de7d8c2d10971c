#!/usr/bin/env python
"""Peak memory of ``onnxsmith int8`` on the corpus's 2 GB model: this checkout against another, side by side.

minilm_2gb (MiniLM with its word-embedding table tiled 46x: 2.2 GB of external data, past protobuf's 2 GB; built
by the test setup, tests/support/corpus_builds.py) goes through ``onnxsmith int8 SOURCE OUT --report REPORT`` as the
corpus test runs it, once with the source of ``--before REV`` (a temporary git worktree) and once with this
checkout's, alternating ``--runs`` times, each in its own process. Printed as a Markdown table: the peak resident
memory of the process tree (sampled every 20 ms, or the kernel's ru_maxrss where higher: benchmarks/fp16_vitl.py),
the wall time, and the variant's sha256, the same for both (exit 1 when not, or when a run failed).

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/int8_memory.py [--before 2f27416] [--runs 1]
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.checkout import checkout  # noqa: E402
from benchmarks.fp16_vitl import measure  # noqa: E402
from tests.support.realmodels import real_model  # noqa: E402

MODEL = "minilm_2gb"


def int8_run(src: Path, model: Path, work: Path) -> dict:
    """``onnxsmith int8`` of ``model`` by the onnxsmith in ``src``: :func:`measure`'s numbers and the variant's sha256."""
    out, report = work / "int8.onnx", work / "int8.json"
    command = [sys.executable, "-m", "onnxsmith", "int8", str(model), str(out), "--report", str(report)]
    result = measure(command, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    result["sha256"] = _sha256(out) if result["exit"] == 0 else f"exit {result['exit']}: {result['tail'][-1:]}"
    out.unlink(missing_ok=True)  # 0.5 GB: not kept for the next run
    return result


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="2f27416", help="the checkout to compare with (a git revision)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each, alternating")
    args = parser.parse_args()
    model = real_model(MODEL)
    results: dict[str, list[dict]] = {"before": [], "now": []}
    with checkout(args.before) as before, tempfile.TemporaryDirectory(prefix="int8-memory-") as tmp:
        for _ in range(args.runs):
            for label, src in (("before", before / "src"), ("now", REPO / "src")):
                results[label].append(int8_run(src, model, Path(tmp)))
    print(f"{platform.machine()}, Python {platform.python_version()}; `onnxsmith int8` on {MODEL} ({model.name})\n")
    print("| checkout | peak RSS | wall | variant sha256 |")
    print("|---|---|---|---|")
    for label, name in (("before", f"before ({args.before})"), ("now", "now")):
        runs = results[label]
        peak = max(r["peak_rss_gb"] for r in runs)
        wall = statistics.median(r["wall_s"] for r in runs)
        print(f"| {name} | {peak:.2f} GB | {wall:.0f} s | {', '.join(sorted({r['sha256'][:16] for r in runs}))} |")
    hashes = {r["sha256"] for runs in results.values() for r in runs}
    same = len(hashes) == 1 and len(next(iter(hashes))) == 64
    print(f"\nsame bytes: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
