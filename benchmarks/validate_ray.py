#!/usr/bin/env python
"""Validation of the bundled face-age example's fp16 variant on many face crops: this process vs Ray.

Makes ``--faces`` face crops from the example's two portraits (each of their 6 boxes shifted, scaled and
mirrored at random, seeded: real faces, each crop different), then runs ``onnxsmith validate`` on them with the
local engine and with ``--engine ray --workers 2`` (a Ray cluster started on this machine), each in its own
process, at two dataset sizes. Reported: wall time, the driver's own peak resident memory (its VmHWM, sampled
until it exits: Ray's workers are other processes) and whether the validation JSON is the same byte for byte,
and, from the measured per-sample cost, the time 84,000 faces (LAGENDA's count) would take on N workers.

    .venv/bin/python benchmarks/validate_ray.py [--faces 10000] [--work /tmp/validate_ray]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fp16_vitl import measure  # noqa: E402

EXAMPLE = REPO / "examples" / "faceage"
SOURCE = REPO / "tests" / "fixtures" / "faceage_dynamo.onnx"
ONNXSMITH = [sys.executable, "-m", "onnxsmith"]
LAGENDA = 84_000


def _boxes() -> list[tuple[Path, tuple[float, float, float, float]]]:
    found, lines = [], (EXAMPLE / "images" / "boxes.txt").read_text().split("\n")
    i = 0
    while i < len(lines) and lines[i].strip():
        name, count = lines[i].strip(), int(lines[i + 1])
        for line in lines[i + 2 : i + 2 + count]:
            x, y, w, h = (float(v) for v in line.split()[:4])
            found.append((EXAMPLE / "images" / name, (x, y, w, h)))
        i += 2 + count
    return found


def make_faces(folder: Path, count: int) -> None:
    """``count`` crops: a box of the example, moved by up to 15 % and scaled 0.8-1.25, mirrored half the time."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    boxes = _boxes()
    images = {path: Image.open(path).convert("RGB") for path, _ in boxes}
    for i in range(count):
        path, (x, y, w, h) = boxes[i % len(boxes)]
        scale = rng.uniform(0.8, 1.25)
        cx, cy = x + w / 2 + rng.uniform(-0.15, 0.15) * w, y + h / 2 + rng.uniform(-0.15, 0.15) * h
        half_w, half_h = w * scale / 2, h * scale / 2
        crop = images[path].crop((int(cx - half_w), int(cy - half_h), int(cx + half_w), int(cy + half_h)))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        crop.save(folder / f"face{i:06d}.jpg", quality=92)


def _vm_hwm_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(command: list[str]) -> dict:
    """Wall time and the process's own peak RSS (its VmHWM: not the Ray workers it starts)."""
    measured = measure(command, rss=_vm_hwm_kb)
    if measured["exit"] != 0:
        raise SystemExit(f"{' '.join(command)} exited {measured['exit']}: {measured['tail']}")
    return {"wall_s": measured["wall_s"], "peak_mb": measured["peak_rss_gb"] * 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faces", type=int, default=10_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/validate_ray"))
    args = parser.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    variant = args.work / "faceage-fp16.onnx"
    subprocess.run([*ONNXSMITH, "fp16", str(SOURCE), str(variant)], check=True, capture_output=True)
    sizes = [args.faces // 4, args.faces]
    rows, per_sample = [], {}
    for size in sizes:
        faces = args.work / f"faces{size}"
        make_faces(faces, size)
        results = {}
        for engine, extra in (("local", []), ("ray, 2 workers", ["--engine", "ray", "--workers", "2"])):
            out = args.work / f"{size}-{engine.split(',')[0]}.json"
            command = [*ONNXSMITH, "validate", str(SOURCE), str(variant), "--task", "faceage", "--data", str(faces)]
            measured = run([*command, "--json", str(out), *extra])
            # All but where it ran (ran_on: the engines say it differently, and nothing else differs).
            shown = {k: v for k, v in json.loads(out.read_text()).items() if k != "ran_on"}
            results[engine] = json.dumps(shown, sort_keys=True)
            rows.append((size, engine, measured))
            per_sample[engine] = measured["wall_s"] / size
            print(
                f"{size} faces, {engine}: {measured['wall_s']:.1f} s, driver peak {measured['peak_mb']:.0f} MB",
                file=sys.stderr,
            )
        same = len(set(results.values())) == 1
        rows.append((size, "same JSON, byte for byte", {"same": same}))

    print(
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.\n"
    )
    print("| faces | engine | wall (s) | driver peak RSS (MB) |")
    print("|---:|---|---:|---:|")
    for size, engine, measured in rows:
        if "same" in measured:
            print(f"| {size} | validation JSON local = ray (but ran_on) | {'yes' if measured['same'] else 'NO'} | |")
        else:
            print(f"| {size} | {engine} | {measured['wall_s']:.1f} | {measured['peak_mb']:.0f} |")
    cost = per_sample["ray, 2 workers"] * 2  # seconds of one worker per face (both models), at the largest size
    print(f"\nOne worker spends {cost * 1000:.1f} ms a face (source and variant). {LAGENDA:,} faces would take:\n")
    print("| workers | projected wall |")
    print("|---:|---:|")
    for workers in (1, 2, 8, 32):
        print(f"| {workers} | {LAGENDA * cost / workers / 60:.1f} min |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
