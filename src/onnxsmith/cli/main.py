"""``onnxsmith``: the entry point that dispatches to one module per command.

Each command module exposes ``register(subparsers)``, which adds its parser and
sets ``func`` to a callable taking the parsed arguments and returning an exit
status. Errors the user can fix are :class:`~onnxsmith.core.errors.OnnxsmithError`:
they become one line on stderr and exit status 2 (1 for a failed gate).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Iterator

from onnxsmith.core.errors import OnnxsmithError
from onnxsmith.core.text import for_terminal
from onnxsmith.core.version import __version__
from onnxsmith.runtime.runner import DEFAULT_RUN_TIMEOUT, RUN_TIMEOUT_ENV, run_timeout

#: Command modules under onnxsmith.cli, in the order ``--help`` lists them.
COMMANDS = [
    "inspect_cmd",
    "compare_cmd",
    "fp16_cmd",
    "fuse_cmd",
    "int8_cmd",
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


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line like every other error (its usage text is in --help);
    the command's subparsers are of this class too (argparse makes them of their parent's)."""

    def error(self, message: str):
        command = self.prog.removeprefix("onnxsmith").strip()
        where = f"{command}: " if command else ""
        hint = f"onnxsmith {command} --help" if command else "onnxsmith --help"
        self.exit(2, f"onnxsmith: error: {where}{' '.join(message.split())} (see {hint})\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="onnxsmith",
        description="Turn a source ONNX model into deployment variants proven against their source.",
        epilog=f"environment: {RUN_TIMEOUT_ENV}=SECONDS stops any one run of a model in onnxruntime after "
        f"that long (default {DEFAULT_RUN_TIMEOUT:g}; 0: no limit)",
    )
    parser.add_argument("--version", action="version", version=f"onnxsmith {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"onnxsmith.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a file name need not be UTF-8: print it escaped, never crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with _sigterm_unwinds():
            run_timeout()  # a bad ONNXSMITH_RUN_TIMEOUT is refused before any work
            return int(args.func(args) or 0)
    except OnnxsmithError as err:
        # The message quotes names from the model: shown, never obeyed by the terminal (core/text.py).
        print(f"onnxsmith: error: {for_terminal(err.one_line())}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("onnxsmith: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("onnxsmith: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM


class Terminated(BaseException):
    """SIGTERM arrived: unwind like Ctrl-C, so staging folders are removed on the way out."""


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # only the main thread takes signals
        yield
        return

    def terminate(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
