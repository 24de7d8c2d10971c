"""``onnxsmith``: the entry point that dispatches to one module per command.

Each command module exposes ``register(subparsers)``, which adds its parser and
sets ``func`` to a callable taking the parsed arguments and returning an exit
status. Errors the user can fix are :class:`~onnxsmith.core.errors.OnnxsmithError`:
they become one line on stderr and exit status 2 (1 for a failed gate).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from onnxsmith.core.errors import OnnxsmithError
from onnxsmith.core.version import __version__

#: Command modules under onnxsmith.cli, in the order ``--help`` lists them.
COMMANDS = [
    "inspect_cmd",
    "compare_cmd",
    "fp16_cmd",
    "fuse_cmd",
    "build_cmd",
    "validate_cmd",
    "bench_cmd",
    "card_cmd",
    "predict_cmd",
    "quantize_cmd",
    "eval_lm_cmd",
    "extract_cmd",
    "shrink_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnxsmith",
        description="Turn a source ONNX model into deployment variants proven against their source.",
    )
    parser.add_argument("--version", action="version", version=f"onnxsmith {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"onnxsmith.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except OnnxsmithError as err:
        print(f"onnxsmith: error: {err.one_line()}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("onnxsmith: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
