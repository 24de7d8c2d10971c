#!/usr/bin/env python
"""``onnxsmith fuse`` on ORT CPU: the generated ViT-L face-age network, side by side in one run.

Three variants of ``faceage_vitl_dynamo.onnx`` (python -m tools.fixtures --vitl):

* source: the dynamo export as it is;
* fuse fp32: ``onnxsmith fuse --precision fp32`` (verified against the source when written);
* ORT optimizer: ``onnxruntime.transformers.optimizer.optimize_model(model_type="vit")``, its
  default level (ORT's basic graph optimisations, then its Python fusions).

Each variant gets its own CPU session (default graph optimisation, default threads); the
timed runs are interleaved round by round so the machine's noise hits all three alike.
Also reported: node and contrib-op counts, and the fused model's |Δage| against the source.

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/fuse_cpu.py [--rounds 5]

Prints markdown for docs/benchmarks.md ("fuse").
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from onnxsmith.io.load import load_model  # noqa: E402
from onnxsmith.release.variant import produce_variant  # noqa: E402
from onnxsmith.runtime.inputs import random_inputs  # noqa: E402
from onnxsmith.transforms.fuse import Fuse  # noqa: E402

DEFAULT_MODEL = Path(os.environ.get("ONNXSMITH_VITL_CACHE", Path.home() / ".cache" / "onnxsmith" / "vitl")) / (
    "faceage_vitl_dynamo.onnx"
)
CONTRIB = ("MultiHeadAttention", "Attention", "RotaryEmbedding", "SkipLayerNormalization", "BiasGelu", "Gelu")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--work", type=Path, default=Path("/tmp/onnxsmith-bench-fuse"))
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--rounds", type=int, default=5, help="timed runs per variant and batch (interleaved)")
    ap.add_argument("--reuse", action="store_true", help="reuse variants already in --work")
    args = ap.parse_args(argv)
    if not args.model.exists():
        sys.exit(f"{args.model} is missing: run python -m tools.fixtures --vitl (under the heavy lock) first")
    args.work.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]

    fused = args.work / "fused_fp32.onnx"
    if not (args.reuse and fused.exists()):
        t0 = time.perf_counter()
        model = load_model(args.model)
        produce_variant(
            args.model,
            fused,
            [("fuse", Fuse.Options(precision="fp32"))],
            feeds=[random_inputs(model, seed=0)],
            progress=lambda m: print(f"  fuse: {m}", file=sys.stderr),
        )
        del model
        print(f"fuse fp32 written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    ort_opt = args.work / "ort_optimizer.onnx"
    ort_stats = {}
    if not (args.reuse and ort_opt.exists()):
        from onnxruntime.transformers import optimizer

        t0 = time.perf_counter()
        optimized = optimizer.optimize_model(str(args.model), model_type="vit", num_heads=16, hidden_size=1024)
        ort_stats = optimized.get_fused_operator_statistics()
        optimized.save_model_to_file(str(ort_opt))
        del optimized
        print(f"ORT optimizer written in {time.perf_counter() - t0:.0f} s: {ort_stats}", file=sys.stderr)

    variants = {"source": args.model, "fuse fp32": fused, "ORT optimizer": ort_opt}
    counts = {name: _counts(path) for name, path in variants.items()}
    sessions = {}
    for name, path in variants.items():
        options = ort.SessionOptions()
        options.log_severity_level = 3
        sessions[name] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(0)
    times: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    ages: dict[str, np.ndarray] = {}
    for batch in batches:
        x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
        for name, session in sessions.items():  # warm-up, and the outputs compared below
            logits = session.run(["age_logits"], {"face": x})[0].astype(np.float64)
            ages.setdefault(name, np.empty(0))
            ages[name] = np.concatenate([ages[name], (1 / (1 + np.exp(-logits))).sum(-1)])
        order = list(sessions)
        for r in range(args.rounds):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                t0 = time.perf_counter()
                sessions[name].run(None, {"face": x})
                times[(name, batch)].append((time.perf_counter() - t0) * 1000)
        print(
            f"batch {batch}: " + ", ".join(f"{n} {statistics.median(times[(n, batch)]):.0f} ms" for n in order),
            file=sys.stderr,
        )

    print(
        f"ORT {ort.__version__}, CPU: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} logical cores, {args.rounds} interleaved runs per cell (median)\n"
    )
    print("| batch | source ms | fuse fp32 ms | ORT optimizer ms | fuse fp32 speedup | ORT optimizer speedup |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in batches:
        med = {n: statistics.median(times[(n, batch)]) for n in sessions}
        print(
            f"| {batch} | {med['source']:.0f} | {med['fuse fp32']:.0f} | {med['ORT optimizer']:.0f} | "
            f"{med['source'] / med['fuse fp32']:.2f}x | {med['source'] / med['ORT optimizer']:.2f}x |"
        )
    print("\n| variant | nodes | " + " | ".join(CONTRIB) + " | Shape |")
    print("|---|---:|" + "---:|" * (len(CONTRIB) + 1))
    for name, c in counts.items():
        print(
            f"| {name} | {sum(c.values())} | "
            + " | ".join(str(c.get(op, 0)) for op in CONTRIB)
            + f" | {c.get('Shape', 0)} |"
        )
    for name in ("fuse fp32", "ORT optimizer"):
        delta = np.abs(ages[name] - ages["source"])
        print(
            f"\n{name} vs source on {len(delta)} random faces: mean |Δage| {delta.mean():.2e} years, "
            f"max {delta.max():.2e}"
        )
    if ort_stats:
        print(f"\nORT optimizer fusions: {ort_stats}")
    return 0


def _counts(path: Path) -> collections.Counter:
    model = onnx.load(str(path), load_external_data=False)
    return collections.Counter(n.op_type for n in model.graph.node)


if __name__ == "__main__":
    sys.exit(main())
