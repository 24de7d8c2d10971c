"""``onnxsmith quantize SRC OUT``: a 4-bit (8-bit) language model in the layout transformers.js loads.

Over :func:`onnxsmith.api.quantize`; the folder's layout, the gates and the staging are
release/lm_folder.py's. Everything is staged beside OUT and moved into place only when
every variant has passed: a failure leaves OUT as it was.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from onnxsmith.cli.common import flag_keywords, made_and_saved, out
from onnxsmith.cli.render import comparison_table
from onnxsmith.cli.transform_cmd import print_headline, rows_table
from onnxsmith.core import options as opts
from onnxsmith.core.options import non_negative_int, positive_int
from onnxsmith.io.files import human_bytes
from onnxsmith.settings.quantize import QuantizeOptions

if TYPE_CHECKING:
    from onnxsmith import api


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Quantize a language model's weights (4-bit blocks, int8 head) into a folder transformers.js loads."
    )
    parser.add_argument("source", help="a model folder with onnx/model.onnx, or an .onnx file (never modified)")
    parser.add_argument(
        "output", help="the folder to write (onnx/model_q4.onnx, model_q4_full.onnx, config, tokenizer)"
    )
    opts.add_arguments(parser, QuantizeOptions)
    gate = parser.add_argument_group("verification gate (see docs/quantize.md)")
    gate.add_argument(
        "--gate-samples", type=positive_int, default=4, help="sequences sampled from the source (default %(default)s)"
    )
    gate.add_argument("--gate-length", type=positive_int, default=32, help="tokens per sequence (default %(default)s)")
    gate.add_argument("--seed", type=non_negative_int, default=0, help="seed of the sampling (default %(default)s)")
    parser.add_argument(
        "--report",
        metavar="JSON",
        help="also write the report here (it is always in OUT); refused by the gate, it is written, saying so",
    )
    parser.add_argument(
        "--allow-outside",
        action="store_true",
        help="copy config/tokenizer files that symbolic links take outside SRC's folder (a Hugging Face cache); "
        "the output and the report name each (default: refused)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    options = opts.from_args(args, QuantizeOptions)
    api.check_outputs([args.report], sources=[args.source], model_folders=True)
    folder = made_and_saved(
        lambda progress: api.quantize(
            args.source,
            **opts.to_json(options),
            **flag_keywords(args, api.quantize, out=args.output, progress=progress),
        ),
        args.output,
        report=args.report,
    )
    _print(folder, Path(args.output))
    return 0


def _print(folder: api.QuantizedFolder, output: Path) -> None:
    from onnxsmith.release.lm_folder import REPORT_FILE

    report = folder.summary
    step = folder.report.steps[0]
    print_headline(folder.report.headline)
    out.print(Text.assemble(("quantize", "bold"), f" {folder.report.source.path}"))
    for note in step.notes:
        out.print(f"  - {note}")
    rows = step.tables.get("weights", [])
    if rows:
        out.print(rows_table("weights", rows))
    table = Table(title="size", title_justify="left")
    for column in ("file", "bytes", "vs source", "logits"):
        table.add_column(column, justify="left" if column in ("file", "logits") else "right")
    source = report["source"]
    table.add_row(source["file"] + " (source)", human_bytes(source["bytes"]), "100%", "every position")
    for variant in report["variants"]:
        table.add_row(
            variant["file"], human_bytes(variant["bytes"]), f"{variant['size_vs_source']:.1%}", variant["logits"]
        )
    out.print(table)
    out.print(comparison_table(folder.comparison))
    for file_name, _, comparison in folder.variants:
        out.print(f"  {file_name} gate passed: {comparison.summary()}")
    for target, info in report["targets"].items():
        settings = ", ".join(f"{k}={v}" for k, v in info["session_options"].items()) or "default session options"
        out.print(f"  {target}: {settings} — {info['why']}")
    for record in folder.files:
        out.print(f"wrote {record.path} ({human_bytes(record.bytes)}, sha256 {record.sha256})")
    for name in folder.copied:
        outside = " (from outside the model folder, through a symbolic link: --allow-outside)"
        out.print(f"copied {name}{outside if name in folder.copied_outside else ''}")
    if "changed_on_copy" in report:
        out.print(report["changed_on_copy"])
    out.print(f"wrote {output / REPORT_FILE}")
