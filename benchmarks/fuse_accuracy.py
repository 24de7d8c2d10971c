#!/usr/bin/env python
"""How far ``onnxsmith fuse`` moves the ViT-L face-age network's answers, on CPU.

Ages (sum of sigmoids of the CORAL logits) and genders of the fused fp32 and fused
fp16 variants against the source, on seeded random faces. The fp16 variant runs
storage-faithfully (every fp16 tensor rounded to fp16, as a GPU holds it; see
runtime/fp16_storage.py), so overflow or precision loss a GPU would see shows here.

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/fuse_accuracy.py [--faces 8]

Variants are built into --work unless already there (benchmarks/fuse_cpu.py's fused_fp32.onnx is reused).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from onnxsmith.io.load import load_model  # noqa: E402
from onnxsmith.release.variant import produce_variant  # noqa: E402
from onnxsmith.runtime.inputs import random_inputs  # noqa: E402
from onnxsmith.runtime.runner import prepare_session, run_all  # noqa: E402
from onnxsmith.transforms.fuse import Fuse  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from fuse_cpu import DEFAULT_MODEL  # noqa: E402


def ages(path: Path, feeds):
    session, model, mode = prepare_session(path)
    out = run_all(session, model, feeds, path)
    logits = out["age_logits"].astype(np.float64)
    return (1 / (1 + np.exp(-logits))).sum(-1).ravel(), out["gender_logits"].argmax(-1).ravel(), mode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--work", type=Path, default=Path("/tmp/onnxsmith-bench-fuse"))
    ap.add_argument("--faces", type=int, default=8)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    source = load_model(args.model)
    calibration = [random_inputs(source, seed=0)]
    faces = [random_inputs(source, dims={"batch": 4}, seed=100 + s) for s in range((args.faces + 3) // 4)]
    del source
    variants = {"fuse fp32": args.work / "fused_fp32.onnx", "fuse fp16": args.work / "fused_fp16.onnx"}
    for name, path in variants.items():
        if not path.exists():
            t0 = time.perf_counter()
            precision = name.split()[-1]
            produce_variant(args.model, path, [("fuse", Fuse.Options(precision=precision))], feeds=calibration)
            print(f"built {path} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    ref_age, ref_gender, _ = ages(args.model, faces)
    print(
        f"{len(ref_age)} random faces (N(0,1), seeds 100..), ages of the source: "
        f"mean {ref_age.mean():.2f}, std {ref_age.std():.2f} years\n"
    )
    print("| variant | run as | mean \\|Δage\\| (years) | max \\|Δage\\| | gender identical |")
    print("|---|---|---:|---:|---|")
    for name, path in variants.items():
        age, gender, mode = ages(path, faces)
        delta = np.abs(age - ref_age)
        print(f"| {name} | {mode} | {delta.mean():.4f} | {delta.max():.4f} | {bool((gender == ref_gender).all())} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
