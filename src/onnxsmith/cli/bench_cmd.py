"""``onnxsmith bench MODEL... --batch 1,5,10``: latency, throughput and memory side by side.

Each model runs in its own process (no shared memory or caches); prints a table
and optionally writes JSON and an SVG plot of latency against batch size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from onnxsmith.cli.common import err, out
from onnxsmith.cli.release_tables import bench_table
from onnxsmith.core.errors import UsageError
from onnxsmith.io.files import write_text_atomic
from onnxsmith.io.load import files_read_by
from onnxsmith.io.paths import check_outputs
from onnxsmith.release.bench import PROVIDERS, BenchSettings, bench_models


def _batches(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 1,5,10, got '{text}'") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("batch sizes must be positive integers")
    return values


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="latency per batch, throughput, session load time, peak memory")
    parser.add_argument("models", nargs="+", help=".onnx files (each runs in its own process)")
    parser.add_argument("--batch", type=_batches, default=[1], help="batch sizes, e.g. 1,5,10 (default 1)")
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu", help="execution provider")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per batch size (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (default %(default)s)")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: onnxruntime's choice)")
    parser.add_argument(
        "--shape",
        action="append",
        metavar="NAME:D0,D1|DIM=N",
        help="sizes of symbolic dims other than the batch (repeatable)",
    )
    parser.add_argument(
        "--session-config",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="a session config entry every model gets (repeatable)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="SVG", help="also draw latency and throughput against batch size")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.warmup < 0:
        raise UsageError("--runs must be >= 1 and --warmup >= 0")
    config = {}
    for item in args.session_config:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--session-config {item}: expected KEY=VALUE")
        config[key] = value
    check_outputs([args.json, args.plot], protect=files_read_by(*args.models))
    names = [Path(m).name for m in args.models]
    if len(set(names)) != len(names):  # two files of one name in different folders
        names = list(args.models)
    settings = BenchSettings(
        batches=args.batch,
        provider=args.provider,
        runs=args.runs,
        warmup=args.warmup,
        threads=args.threads,
        shape=args.shape or [],
    )
    with err.status("") as status:
        results = bench_models([(n, m, config) for n, m in zip(names, args.models)], settings, progress=status.update)
    out.print(bench_table(results))
    data = [r.to_json() for r in results]
    if args.json:
        write_text_atomic(args.json, json.dumps({"settings": vars(settings), "results": data}, indent=1) + "\n")
    if args.plot:
        from onnxsmith.release import plots  # matplotlib: only when plotting

        write_text_atomic(args.plot, plots.latency_figure(data))
        out.print(f"wrote {args.plot}")
    return 0
