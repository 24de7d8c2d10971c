#!/usr/bin/env python
"""``onnxsmith fuse --precision fp16`` vs the plain fp16 graph on ONNX Runtime CUDA: one short script.

For a machine with an NVIDIA GPU and ``onnxruntime-gpu`` (no torch needed). From the repository root:

    pip install -e . onnxruntime-gpu          # onnxsmith and the CUDA build of onnxruntime
    python -m tools.fixtures --vitl      # once: the generated ViT-L face-age model (needs torch)
    python benchmarks/fuse_cuda.py            # or --model PATH; --plain/--fused to reuse variants

It builds the two variants from the source with onnxsmith (both verified on CPU when written):

* plain fp16: ``onnxsmith fp16`` (fp16 weights and compute, the residual stream fp32);
* fused fp16: ``onnxsmith fuse --precision fp16``;

then times each on CUDAExecutionProvider at batch 1, 5 and 10 (inputs and outputs bound to the
GPU with I/O binding, warm-up first, the variants interleaved run by run, median of --runs), and
checks the fused model's ages against the source's (run in fp32 on the GPU). It prints a markdown
table with the GPU's name, to paste into docs/benchmarks.md ("fuse"). Target: >= 3.9x at batch 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
DEFAULT_MODEL = Path(os.environ.get("ONNXSMITH_VITL_CACHE", Path.home() / ".cache" / "onnxsmith" / "vitl")) / (
    "faceage_vitl_dynamo.onnx"
)
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def gpu_name() -> str:
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            .stdout.strip()
            .splitlines()
        )
        return out[0] if out else "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU (nvidia-smi not found)"


def build(source: Path, work: Path, plain: Path | None, fused: Path | None) -> tuple[Path, Path]:
    """The two fp16 variants, made with onnxsmith unless given."""
    from onnxsmith.io.load import load_model
    from onnxsmith.release.variant import produce_variant
    from onnxsmith.runtime.inputs import random_inputs
    from onnxsmith.transforms import get_transform

    work.mkdir(parents=True, exist_ok=True)
    feeds = None
    for path, step, label in (
        (plain, ("fp16", get_transform("fp16").Options()), "plain_fp16.onnx"),
        (fused, ("fuse", get_transform("fuse").Options(precision="fp16")), "fused_fp16.onnx"),
    ):
        if path is not None:
            continue
        target = work / label
        if not target.exists():
            feeds = feeds or [random_inputs(load_model(source), seed=0)]
            t0 = time.perf_counter()
            produce_variant(source, target, [step], feeds=feeds)
            print(f"built {target} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return plain or work / "plain_fp16.onnx", fused or work / "fused_fp16.onnx"


class Runner:
    """A CUDA session with its input and outputs bound on the device (no host copies in the timing)."""

    def __init__(self, path: Path) -> None:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=CUDA)
        if self.session.get_providers()[0] != "CUDAExecutionProvider":
            sys.exit(f"{path}: CUDAExecutionProvider is not available (providers: {self.session.get_providers()})")
        self.input = self.session.get_inputs()[0]
        self.dtype = np.float16 if self.input.type == "tensor(float16)" else np.float32

    def bind(self, x: np.ndarray):
        binding = self.session.io_binding()
        device_x = ort.OrtValue.ortvalue_from_numpy(x.astype(self.dtype), "cuda", 0)
        binding.bind_ortvalue_input(self.input.name, device_x)
        for output in self.session.get_outputs():
            binding.bind_output(output.name, "cuda", 0)
        return binding, device_x

    def time_ms(self, binding) -> float:
        binding.synchronize_inputs()
        t0 = time.perf_counter()
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return (time.perf_counter() - t0) * 1000

    def ages(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        age, gender = self.session.run(["age_logits", "gender_logits"], {self.input.name: x.astype(self.dtype)})
        return (1 / (1 + np.exp(-age.astype(np.float64)))).sum(-1), gender.argmax(-1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the fp32 source (ViT-L face-age)")
    ap.add_argument("--work", type=Path, default=Path("bench-fuse-cuda"))
    ap.add_argument("--plain", type=Path, help="an existing plain fp16 variant")
    ap.add_argument("--fused", type=Path, help="an existing fused fp16 variant")
    ap.add_argument("--batches", default="1,5,10")
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args(argv)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        sys.exit(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider: pip install onnxruntime-gpu")
    if not args.model.exists() and not (args.plain and args.fused):
        sys.exit(f"{args.model} is missing: run python -m tools.fixtures --vitl first (or pass --plain and --fused)")
    plain, fused = build(args.model, args.work, args.plain, args.fused)

    runners = {"plain fp16": Runner(plain), "fused fp16": Runner(fused)}
    rng = np.random.default_rng(0)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
        bound = {name: r.bind(x) for name, r in runners.items()}
        for name, r in runners.items():
            for _ in range(10):
                r.time_ms(bound[name][0])
        times = {name: [] for name in runners}
        for _ in range(args.runs):
            for name, r in runners.items():
                times[name].append(r.time_ms(bound[name][0]))
        med = {name: statistics.median(t) for name, t in times.items()}
        rows.append((batch, med["plain fp16"], med["fused fp16"]))
        print(f"batch {batch}: plain {med['plain fp16']:.2f} ms, fused {med['fused fp16']:.2f} ms", file=sys.stderr)

    accuracy = ""
    if args.model.exists():  # the source in fp32 on the GPU as reference
        source = Runner(args.model)
        x = rng.standard_normal((16, 3, 224, 224)).astype(np.float32)
        ref_age, ref_gender = source.ages(x)
        lines = []
        for name, r in runners.items():
            age, gender = r.ages(x)
            delta = np.abs(age - ref_age)
            lines.append(
                f"{name} vs source (fp32, CUDA) on 16 random faces: mean |Δage| {delta.mean():.4f} years, "
                f"max {delta.max():.4f}, gender identical: {bool((gender == ref_gender).all())}"
            )
        accuracy = "\n".join(lines)

    print(
        f"GPU: {gpu_name()}; onnxruntime {ort.__version__}; CUDAExecutionProvider, I/O binding, "
        f"median of {args.runs} interleaved runs\n"
    )
    print("| batch | plain fp16 ms | fused fp16 ms | speedup |")
    print("|---:|---:|---:|---:|")
    for batch, p, f in rows:
        print(f"| {batch} | {p:.2f} | {f:.2f} | {p / f:.2f}x |")
    if accuracy:
        print("\n" + accuracy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
