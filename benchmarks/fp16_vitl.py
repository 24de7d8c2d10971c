#!/usr/bin/env python
"""Benchmark: ``onnxsmith fp16`` vs onnxconverter-common on the full-size ViT-L face-age model.

Runs both tools, one after the other in the same invocation (the machine is shared and
noisy: compare within one run), each as its own process, and records wall time and peak
resident memory of the whole process tree (sampled every 20 ms, and the kernel's
``ru_maxrss`` of the largest process, whichever is higher).

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python -m tools.fixtures --vitl
    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/fp16_vitl.py

onnxsmith runs as a user would (``onnxsmith fp16 SRC OUT --samples 1``): calibration on one
input, conversion, writing, and the storage-faithful gate. onnxconverter-common runs
``convert_float_to_float16(model, keep_io_types=True)`` with ``onnx.load``/``onnx.save``
and no verification at all; its output is then run storage-faithfully on the same input
(not timed) to show what it gives.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path(os.environ.get("ONNXSMITH_VITL_CACHE", Path.home() / ".cache" / "onnxsmith" / "vitl")) / (
    "faceage_vitl_dynamo.onnx"
)

ONNXCONVERTER = """
import sys, warnings
import onnx
from onnxconverter_common import float16
warnings.simplefilter("ignore")
model = onnx.load(sys.argv[1])
onnx.save(float16.convert_float_to_float16(model, keep_io_types=True), sys.argv[2])
"""

CHECK = """
import sys, json
import numpy as np
from onnxsmith.io.load import load_model
from onnxsmith.runtime.runner import prepare_session, run_all
from onnxsmith.runtime.inputs import random_inputs
feeds = [random_inputs(load_model(sys.argv[1]), seed=0)]
session, model, mode = prepare_session(sys.argv[2])
out = run_all(session, model, feeds, sys.argv[2])
print(json.dumps({"mode": mode, "nonfinite": {k: int((~np.isfinite(v)).sum()) for k, v in out.items()}}))
"""


def _tree_rss_kb(root: int) -> int:
    """Resident memory of ``root`` and all its descendants, in KiB."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def measure(command: list[str], env: dict | None = None, rss=None) -> dict:
    """Run ``command``; wall time, peak RSS of its process tree, exit status, last lines of output.

    ``rss``: what is sampled instead (a pid -> kB function: validate_ray.py's driver alone, not the Ray workers it
    starts); then the kernel's ru_maxrss, which covers the children, is not taken."""
    sampled = rss or _tree_rss_kb
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sampled(process.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = process.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return {
        "wall_s": round(wall, 2),
        "peak_rss_gb": round((peak if rss else max(peak, usage.ru_maxrss)) / 2**20, 3),
        "exit": os.waitstatus_to_exitcode(status),
        "tail": output.strip().splitlines()[-3:],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="an earlier source tree of onnxsmith (e.g. a git worktree of an older commit): its `onnxsmith fp16` "
        "runs in the same invocation, alternating with this tree's, so 'nothing got slower' is measured side by side",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each onnxsmith command (the median is shown)")
    args = parser.parse_args(argv)
    if not args.model.exists():
        print(f"{args.model} is missing: run python -m tools.fixtures --vitl first", file=sys.stderr)
        return 2
    python = sys.executable
    results = {"model": str(args.model), "bytes": args.model.stat().st_size, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="fp16-bench-") as tmp:
        ours, theirs = Path(tmp) / "onnxsmith.onnx", Path(tmp) / "onnxconverter.onnx"
        command = [python, "-m", "onnxsmith", "fp16", str(args.model), str(ours), "--samples", "1"]
        trees: dict[str, dict | None] = {}
        if args.baseline:
            rev = subprocess.run(
                ["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            # ahead of this venv's editable install on sys.path
            trees[f"onnxsmith fp16 at {rev or args.baseline}"] = {
                **os.environ,
                "PYTHONPATH": str(args.baseline.resolve() / "src"),
            }
        trees["onnxsmith fp16"] = None  # last in each round: the variant checked below is this tree's
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.repeat):  # alternating, so drifting load hits both alike
            for name, env in trees.items():
                ours.unlink(missing_ok=True)
                runs[name].append(measure(command, env))
                runs[name][-1]["output_bytes"] = ours.stat().st_size if ours.exists() else None
        for name, measured in runs.items():
            median = sorted(measured, key=lambda r: r["wall_s"])[len(measured) // 2]
            results[name] = {**median, "walls_s": [r["wall_s"] for r in measured]}
        results["onnxconverter-common"] = measure([python, "-c", ONNXCONVERTER, str(args.model), str(theirs)])
        results["onnxconverter-common"]["output_bytes"] = theirs.stat().st_size if theirs.exists() else None
        for name, path in (("onnxsmith fp16", ours), ("onnxconverter-common", theirs)):
            if path.exists():  # not timed: what each variant gives, storage-faithfully
                check = subprocess.run(
                    [python, "-c", CHECK, str(args.model), str(path)], capture_output=True, text=True, cwd=REPO
                )
                results[name]["storage_faithful_nonfinite"] = (
                    json.loads(check.stdout.strip().splitlines()[-1])["nonfinite"]
                    if check.returncode == 0
                    else check.stderr.strip().splitlines()[-1:]
                )
    print(f"model: {args.model} ({results['bytes'] / 1e9:.2f} GB), {results['cpus']} CPUs")
    print("| tool | wall (s) | peak RSS (GB) | output (MB) | NaN/inf outputs (storage-faithful fp16) |")
    print("|---|---:|---:|---:|---|")
    for name in [*runs, "onnxconverter-common"]:
        r = results[name]
        size = f"{r['output_bytes'] / 2**20:.0f}" if r.get("output_bytes") else "-"
        walls = f" (runs: {', '.join(f'{w:.1f}' for w in r['walls_s'])})" if len(r.get("walls_s", [])) > 1 else ""
        print(
            f"| {name} | {r['wall_s']:.1f}{walls} | {r['peak_rss_gb']:.2f} | {size} | "
            f"{r.get('storage_faithful_nonfinite', r['tail'] if r['exit'] else '-')} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results["onnxsmith fp16"]["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
