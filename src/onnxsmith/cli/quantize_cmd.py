"""``onnxsmith quantize SRC OUT``: a 4-bit (8-bit) language model in the layout transformers.js loads.

SRC is an optimum/transformers.js model folder (``onnx/model.onnx`` beside config and
tokenizer files) or an .onnx file. OUT becomes such a folder::

    OUT/onnx/model_q4.onnx        the published model (last-position logits; q8: model_quantized.onnx)
    OUT/onnx/model_q4_full.onnx   the same weights with every position's logits, for evaluation
    OUT/config.json, tokenizer.json, ...   copied from the source folder
    OUT/quantize_report.json      what was done, the gates, the session options each runtime needs

Each .onnx is made by ``produce_variant`` and judged by the LM gate (tasks/lm/gate.py) on
sequences sampled from the source. Everything is staged beside OUT and moved into
place only when every variant has passed: a failure leaves OUT as it was.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from onnxsmith.cli.common import err, out
from onnxsmith.cli.render import comparison_table
from onnxsmith.cli.transform_cmd import rows_table
from onnxsmith.core import options as opts
from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.core.transform import Progress
from onnxsmith.io.files import (
    FileRecord,
    commit_files,
    human_bytes,
    same_file,
    sha256_file,
    staging_dir,
    write_text_atomic,
)
from onnxsmith.io.load import files_read_by, load_model, source_files
from onnxsmith.io.paths import check_output, check_outputs
from onnxsmith.release.variant import VariantResult, produce_variant
from onnxsmith.tasks import lm
from onnxsmith.tasks.lm import FOLDER_FILES
from onnxsmith.transforms.quantize import Quantize, QuantizeOptions, prepare

REPORT_FILE = "quantize_report.json"
#: transformers.js's file suffix per dtype (model{suffix}.onnx).
SUFFIX = {"q4": "_q4", "q8": "_quantized"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "quantize",
        help=Quantize.summary,
        description="Quantize a language model's weights (4-bit blocks, int8 head) into a folder transformers.js loads.",
    )
    parser.add_argument("source", help="a model folder with onnx/model.onnx, or an .onnx file (never modified)")
    parser.add_argument(
        "output", help="the folder to write (onnx/model_q4.onnx, model_q4_full.onnx, config, tokenizer)"
    )
    opts.add_arguments(parser, QuantizeOptions)
    gate = parser.add_argument_group("verification gate (see docs/quantize.md)")
    gate.add_argument(
        "--gate-samples", type=int, default=4, help="sequences sampled from the source (default %(default)s)"
    )
    gate.add_argument("--gate-length", type=int, default=32, help="tokens per sequence (default %(default)s)")
    gate.add_argument("--seed", type=int, default=0, help="seed of the sampling (default %(default)s)")
    parser.add_argument("--report", metavar="JSON", help="also write the report here (it is always in OUT)")
    parser.set_defaults(func=run)


def source_model(source: Path) -> tuple[Path, Path | None]:
    """(the .onnx to quantize, the model folder whose files are copied, if it is one)."""
    if source.is_dir():
        model = source / "onnx" / "model.onnx"
        if not model.is_file():
            found = sorted(p.name for p in (source / "onnx").glob("*.onnx")) if (source / "onnx").is_dir() else []
            raise InputError(
                f"no onnx/model.onnx in the folder (found: {', '.join(found) or 'no .onnx files'})", source
            )
        return model, source
    if not source.exists():
        raise InputError("no such file or folder", source)
    return source, (source.parent.parent if source.parent.name == "onnx" else None)


def run(args: argparse.Namespace) -> int:
    options = opts.from_args(args, QuantizeOptions)
    source, _ = source_model(Path(args.source))
    check_outputs([args.report], protect=files_read_by(source))
    with err.status("") as status:
        source, results, report = quantize_folder(
            Path(args.source),
            Path(args.output),
            options,
            gate_samples=args.gate_samples,
            gate_length=args.gate_length,
            seed=args.seed,
            progress=status.update,
        )
    if args.report:
        write_text_atomic(args.report, json.dumps(report, indent=2, default=str) + "\n")
    _print(source, results, report, Path(args.output))
    return 0


def quantize_folder(
    source: Path,
    output: Path,
    options: QuantizeOptions,
    *,
    gate_samples: int = 4,
    gate_length: int = 32,
    seed: int = 0,
    progress: Progress = lambda _: None,
) -> tuple[Path, list[tuple[str, VariantResult]], dict]:
    """Write OUT (see the module doc); return (the source .onnx, the variants, the report)."""
    if gate_samples < 1 or gate_length < 2:
        raise UsageError("--gate-samples must be >= 1 and --gate-length >= 2")
    source, folder = source_model(source)
    model = load_model(source)
    protect = source_files(model, source)
    check_output(output, protect=protect, folder=True)
    signature = lm.lm_signature(model, source)
    prepare(model, options, source)  # fail on a model without a head or weights before any work
    name = f"model{SUFFIX[options.scheme]}"
    plan = [(f"{name}.onnx", options)]
    if options.last_token:
        plan.append((f"{name}_full.onnx", opts.build(QuantizeOptions, {**opts.to_json(options), "last_token": False})))
    logging.getLogger("onnxscript").setLevel(logging.ERROR)  # the version converter's fallback notice

    results: list[tuple[str, VariantResult]] = []
    with staging_dir(output.resolve().parent) as tmp:
        progress(f"sampling {gate_samples} sequences of {gate_length} tokens from the source")
        ids = lm.sample_sequences(source, count=gate_samples, length=gate_length, seed=seed)
        feeds = [lm.lm_feeds(signature, ids)]
        for file_name, variant_options in plan:
            result = produce_variant(
                source,
                tmp / "onnx" / file_name,
                [(Quantize.name, variant_options)],
                feeds=feeds,
                progress=lambda message, f=file_name: progress(f"{f}: {message}"),
            )
            results.append((file_name, result))
        copied = _copy_folder_files(folder, tmp, output)
        report = _report(source, folder, options, results, copied)
        (tmp / REPORT_FILE).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        pairs = [(f.path, output / "onnx" / f.path.name) for _, result in results for f in result.files]
        pairs += [(tmp / f, output / f) for f in copied] + [(tmp / REPORT_FILE, output / REPORT_FILE)]
        (output / "onnx").mkdir(parents=True, exist_ok=True)
        commit_files(pairs, protect=protect)
    return source, results, report


def _copy_folder_files(folder: Path | None, tmp: Path, output: Path) -> list[str]:
    if folder is None:
        return []
    copied = []
    for name in FOLDER_FILES:
        src = folder / name
        if not src.is_file():
            continue
        if (output / name).exists() and same_file(src, output / name):
            continue  # OUT is the source folder: the file is already there
        shutil.copyfile(src, tmp / name)
        copied.append(name)
    return copied


def _report(source: Path, folder: Path | None, options: QuantizeOptions, results, copied) -> dict:
    source_bytes = _bytes(source)
    first = results[0][1]
    step = first.reports[0]
    return {
        "source": {"file": source.name, "bytes": source_bytes, "sha256": sha256_file(source)},
        "options": opts.to_json(options),
        "variants": [
            {
                "file": f"onnx/{file_name}",
                "bytes": sum(f.bytes for f in result.files),
                "sha256": result.files[0].sha256,
                "size_vs_source": sum(f.bytes for f in result.files) / source_bytes,
                "logits": "last position" if result.reports[0].options["last_token"] else "every position",
                "gate": result.comparison.to_json(),
            }
            for file_name, result in results
        ],
        "notes": step.notes,
        "weights": step.tables.get("weights", []),
        "weight_bytes": step.stats.get("weight_bytes"),
        "nodes": step.stats.get("nodes"),
        "session_options": step.runtime,
        "targets": step.stats.get("targets", {}),
        "copied": copied if folder is not None else "nothing: the source is not in a model folder",
    }


def _bytes(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def _print(source: Path, results, report: dict, output: Path) -> None:
    step = results[0][1].reports[0]
    out.print(f"[bold]quantize[/] {source}")
    for note in step.notes:
        out.print(f"  - {escape(note)}")
    rows = step.tables.get("weights", [])
    if rows:
        out.print(rows_table("weights", rows))
    table = Table(title="size", title_justify="left")
    for column in ("file", "bytes", "vs source", "logits"):
        table.add_column(column, justify="left" if column in ("file", "logits") else "right")
    table.add_row(source.name + " (source)", human_bytes(report["source"]["bytes"]), "100%", "every position")
    for variant in report["variants"]:
        table.add_row(
            variant["file"], human_bytes(variant["bytes"]), f"{variant['size_vs_source']:.1%}", variant["logits"]
        )
    out.print(table)
    out.print(comparison_table(results[0][1].comparison))
    for file_name, result in results:
        out.print(f"  {file_name} gate passed: {escape(result.comparison.summary())}")
    for target, info in report["targets"].items():
        settings = ", ".join(f"{k}={v}" for k, v in info["session_options"].items()) or "default session options"
        out.print(f"  {escape(target)}: {escape(settings)} — {escape(info['why'])}")
    for file_name, result in results:
        record: FileRecord = result.files[0]
        out.print(f"wrote {output / 'onnx' / file_name} ({human_bytes(record.bytes)}, sha256 {record.sha256})")
    for name in report["copied"] if isinstance(report["copied"], list) else []:
        out.print(f"copied {name}")
    out.print(f"wrote {output / REPORT_FILE}")
