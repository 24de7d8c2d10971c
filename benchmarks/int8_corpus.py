#!/usr/bin/env python
"""int8 with no options on the real-model corpus: is the variant faster than its source, and does it agree?

For every corpus model (tests/support/realmodels.py) this runs ``onnxsmith int8 SOURCE OUT`` as a new user does
(no options: onnxsmith makes its own inputs), then, for a written variant:

- judges it independently: ``onnxsmith validate --task generic`` on the manifest's plausible inputs (pictures
  onnxsmith does not ship, text pages, 3 seeded sets: tests/support/corpus.py), and, over the same inputs, the
  agreement of every output's decision (argmax over the last axis of a float output with >= 2 classes, equality
  of an integer output) and the worst cosine;
- times source and variant side by side at batch 1 with 2 threads (onnxruntime CPU), interleaved rounds, the
  median of each: the ratio is the source's time over the variant's.

It also reports the share of each source's weight bytes that Convs, MatMuls and Gemms read in fp32: the models
int8 is for (share >= 0.5). The summary line counts those with a variant faster than the source with decision
agreement >= 99 % (issue 24's acceptance: >= 80 % of them); every other one must have said why in one line.

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/int8_corpus.py [--models a,b] [--out docs/int8_corpus.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.corpus import cli, make_feeds, model_bytes  # noqa: E402
from tests.support.realmodels import CORPUS, MODELS, real_model  # noqa: E402

#: Ops whose weights int8 makes int8 (the Linears and Convs), and the ops a weight may pass through to them.
WEIGHT_READERS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
PASS_THROUGH = {"Identity", "Transpose", "Reshape", "Cast", "Unsqueeze", "Squeeze", "Flatten"}
ROUNDS, PER_ROUND = 7, 5


def conv_matmul_share(path: Path) -> float:
    """The share of the source's float weight bytes (initializers and Constants) that Convs/MatMuls/Gemms read."""
    import onnx_ir as ir

    model = ir.load(path)
    total = read = 0
    weights = [v for v in model.graph.initializers.values() if v.const_value is not None]
    weights += [n.outputs[0] for n in model.graph if n.op_type == "Constant" and n.attributes.get("value")]
    for value in weights:
        tensor = value.const_value if value.const_value is not None else value.producer().attributes["value"].value
        if tensor.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
            continue
        nbytes = tensor.nbytes
        total += nbytes
        frontier, seen = [value], set()
        while frontier:
            v = frontier.pop()
            for user, _ in v.uses():
                if user.op_type in WEIGHT_READERS:
                    read += nbytes
                    frontier = []
                    break
                if user.op_type in PASS_THROUGH and id(user) not in seen:
                    seen.add(id(user))
                    frontier.extend(user.outputs)
    return read / total if total else 0.0


def decisions(source_out: list[np.ndarray], variant_out: list[np.ndarray]) -> tuple[float | None, float | None]:
    """(worst decision agreement, worst cosine) over the outputs of one input set."""
    agreements, cosines = [], []
    for ref, test in zip(source_out, variant_out):
        ref, test = np.asarray(ref), np.asarray(test)
        if ref.dtype.kind in "iub":
            agreements.append(float(np.mean(ref == test)) if ref.size else 1.0)
            continue
        if ref.dtype.kind != "f" or ref.size == 0:
            continue
        if not np.all(np.isfinite(test)):
            return 0.0, 0.0
        a, b = ref.astype(np.float64).ravel(), test.astype(np.float64).ravel()
        norm = np.linalg.norm(a) * np.linalg.norm(b)
        cosines.append(float(a @ b / norm) if norm else float(np.array_equal(a, b)))
        if ref.ndim >= 2 and ref.shape[-1] >= 2:
            agreements.append(float(np.mean(ref.argmax(-1) == test.argmax(-1))))
    return (min(agreements) if agreements else None), (min(cosines) if cosines else None)


def judge(source: Path, variant: Path, feeds: Path) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    sessions = [ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in (source, variant)]
    sets = [dict(np.load(p)) for p in sorted(feeds.glob("*.npz"))]
    worst_agreement, worst_cosine = None, None
    for feed in sets:
        agreement, cosine = decisions(sessions[0].run(None, feed), sessions[1].run(None, feed))
        if agreement is not None:
            worst_agreement = agreement if worst_agreement is None else min(worst_agreement, agreement)
        if cosine is not None:
            worst_cosine = cosine if worst_cosine is None else min(worst_cosine, cosine)
    times: list[list[float]] = [[], []]
    for session in sessions:  # warm up
        for _ in range(2):
            session.run(None, sets[0])
    for _ in range(ROUNDS):  # interleaved: the machine's noise falls on both alike
        for which, session in enumerate(sessions):
            started = time.perf_counter()
            for _ in range(PER_ROUND):
                session.run(None, sets[0])
            times[which].append((time.perf_counter() - started) / PER_ROUND)
    source_s, variant_s = float(np.median(times[0])), float(np.median(times[1]))
    return {
        "agreement": worst_agreement,
        "cosine": worst_cosine,
        "source_ms": source_s * 1e3,
        "variant_ms": variant_s * 1e3,
        "speed": source_s / variant_s,
    }


def measure(name: str, work: Path) -> dict:
    source = real_model(name)
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    feeds = make_feeds(MODELS[name].feeds, folder / "feeds")
    out = folder / "int8.onnx"
    entry: dict = {"model": name, "share": conv_matmul_share(source)}
    started = time.perf_counter()
    code, _stdout, stderr = cli(["int8", str(source), str(out)], isolated=True)
    entry["seconds"] = round(time.perf_counter() - started, 1)
    entry["code"] = code
    if code != 0 or not out.exists():
        lines = [line for line in stderr.splitlines() if line.strip()]
        entry["why"] = lines[-1] if lines else f"exit {code}"
        return entry
    entry["size"] = model_bytes(out) / model_bytes(source)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxsmith",
            "validate",
            str(source),
            str(out),
            "--task",
            "generic",
            "--data",
            str(feeds),
        ],
        capture_output=True,
        text=True,
    )
    entry["validate"] = done.returncode
    if done.returncode:
        entry["validate_why"] = ([line for line in done.stderr.splitlines() if line.strip()] or [""])[-1]
    entry.update(judge(source, out, feeds))
    return entry


def succeeded(entry: dict) -> bool:
    agreement = entry.get("agreement")
    agrees = agreement >= 0.99 if agreement is not None else (entry.get("cosine") or 0) >= 0.99
    return entry.get("code") == 0 and entry.get("validate") == 0 and entry.get("speed", 0) > 1.0 and agrees


def write_markdown(entries: list[dict], path: Path, seconds: float) -> None:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    int8_for = [e for e in entries if e["share"] >= 0.5]
    good = [e for e in int8_for if succeeded(e)]
    lines = [
        "# int8 with no options on the real-model corpus",
        "",
        f"Produced by `python benchmarks/int8_corpus.py` on {datetime.date.today()} ({platform.machine()}, "
        f"{seconds / 60:.0f} min, 2 threads per session on a 2-core machine). Each variant judged by `onnxsmith "
        "validate --task generic` on the corpus's own plausible inputs (pictures onnxsmith does not ship, text "
        "pages, speech-level noise: tests/support/corpus.py), and timed against its source side by side at batch 1.",
        "",
        f"**{len(good)} of {len(int8_for)}** models whose fp32 weights are mostly Conv/MatMul "
        f"({len(good) / max(1, len(int8_for)):.0%}) got a variant faster than the source with decision agreement "
        ">= 99 % that the independent validate passes; each other model's row gives the one line int8 said.",
        "",
        "| model | Conv/MatMul weights | outcome | size | speed (batch 1) | agreement | cosine | validate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        if e.get("code") == 0:
            outcome = "✓" if succeeded(e) else "✗"
            validate = "passes" if e.get("validate") == 0 else f"✗ {e.get('validate_why', '')[:160]}"
            lines.append(
                f"| {e['model']} | {e['share']:.0%} | {outcome} variant | {e['size']:.2f}× | "
                f"{e['speed']:.2f}× ({e['source_ms']:.1f} → {e['variant_ms']:.1f} ms) | "
                f"{fmt(e.get('agreement'), '.2%')} | {fmt(e.get('cosine'), '.5f')} | {validate} |"
            )
        else:
            why = e.get("why", "").replace("|", "\\|")[:220]
            lines.append(f"| {e['model']} | {e['share']:.0%} | refused (exit {e['code']}): {why} | | | | | |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated subset of the corpus (default: all)")
    parser.add_argument("--work", default=str(REPO / ".cache" / "int8_corpus"))
    parser.add_argument("--out", default=str(REPO / "docs" / "int8_corpus.md"))
    parser.add_argument("--json", default=str(REPO / "docs" / "int8_corpus.json"))
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n] or [n for n in CORPUS if not MODELS[n].heavy]
    work = Path(args.work)
    started = time.perf_counter()
    entries = []
    for name in names:
        entry = measure(name, work)
        entries.append(entry)
        print(json.dumps(entry), flush=True)
    Path(args.json).write_text(json.dumps(entries, indent=1) + "\n")
    write_markdown(entries, Path(args.out), time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
