#!/usr/bin/env python
"""int8 with no options on the real-model corpus: is the variant faster than its source, and does it agree?

For every corpus model (tests/support/realmodels.py) this runs ``onnxsmith int8 SOURCE OUT`` as a new user does
(no options: onnxsmith makes its own inputs), then, for a written variant:

- judges it independently: ``onnxsmith validate --task generic`` on the manifest's plausible inputs (pictures
  onnxsmith does not ship, text pages, 3 seeded sets: tests/support/corpus.py), and, over the same inputs, each
  output judged for what it is, as the gate judges it: the agreement of the decisions of labels, detection lists,
  CTC sequences and probabilities (a softmax's argmax, a sigmoid's side of 0.5), the cosine of any other tensor
  (an embedding, a raw detector grid: their argmax over an axis decides nothing);
- times source and variant side by side at batch 1 with 2 threads (onnxruntime CPU), interleaved rounds, the
  median of each: the ratio is the source's time over the variant's.

It also reports the share of each source's weight bytes that Convs, MatMuls and Gemms read in fp32: the models
int8 is for (share >= 0.5). The summary line counts those with a variant faster than the source with decision
agreement >= 99 % and other outputs at cosine >= 0.99 (issue 24's acceptance: >= 80 % of them); every other one
must have said why in one line.

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


def decisions(
    source_out: dict[str, np.ndarray], variant_out: dict[str, np.ndarray]
) -> tuple[float | None, float | None]:
    """(worst decision agreement, worst cosine) over the outputs, each stacked over the input sets, judged for
    what it is as the gate judges it (onnxsmith.verify.gate.judge_all, int8 bounds): labels, detection lists and
    CTC sequences by their agreement, probabilities by their decisions (a softmax's argmax, a sigmoid's side of
    0.5), any other tensor (an embedding, a raw detector grid, a spectrogram) by its cosine."""
    from onnxsmith.analysis.number_formats import INT8
    from onnxsmith.verify.gate import Bounds, judge_all

    agreements, cosines = [], []
    for diff in judge_all(source_out, variant_out, Bounds.for_format(INT8)):
        if diff.nonfinite_test > diff.nonfinite_ref:
            return 0.0, 0.0
        if diff.kind in ("labels", "detections", "sequences") and diff.agreement is not None:
            agreements.append(diff.agreement)
        elif diff.probabilities is not None:
            agreements.append(diff.probabilities["agreement"])
        elif diff.cosine is not None:
            cosines.append(diff.cosine)
    return (min(agreements) if agreements else None), (min(cosines) if cosines else None)


def judge(source: Path, variant: Path, feeds: Path) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    sessions = [ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in (source, variant)]
    sets = [dict(np.load(p)) for p in sorted(feeds.glob("*.npz"))]
    names = [o.name for o in sessions[0].get_outputs()]
    outputs = [[session.run(names, feed) for feed in sets] for session in sessions]
    stacked = [{name: np.stack([run[i] for run in runs]) for i, name in enumerate(names)} for runs in outputs]
    worst_agreement, worst_cosine = decisions(*stacked)
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
        entry["why"] = (lines[-1] if lines else f"exit {code}").replace(f"onnxsmith: error: {source}: ", "")
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
        why = ([line for line in done.stderr.splitlines() if line.strip()] or [""])[-1]
        entry["validate_why"] = why.replace(str(source), "MODEL").replace(str(out), "int8.onnx")
    entry.update(judge(source, out, feeds))
    return entry


def succeeded(entry: dict) -> bool:
    """Issue 24's acceptance: written, validated, faster, decisions agreeing in 99 % and other outputs at
    cosine >= 0.99."""
    agreement, cosine = entry.get("agreement"), entry.get("cosine")
    agrees = (agreement is None or agreement >= 0.99) and (cosine is None or cosine >= 0.99)
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
        ">= 99 % (labels, detections, CTC text, probabilities) and cosine >= 0.99 (any other output) that the "
        "independent validate passes; each other model's row gives the one line int8 said.",
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
            why = e.get("why", "").replace("|", "\\|")
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
