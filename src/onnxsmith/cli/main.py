"""``onnxsmith``: the entry point that dispatches to one module per command.

Each command module exposes ``register(parser)``, which adds the command's flags to the
parser made for it here and sets ``func`` to a callable taking the parsed arguments and
returning an exit status. Errors the user can fix are :class:`~onnxsmith.core.errors.OnnxsmithError`:
they become one line on stderr and exit status 2 (1 for a failed gate).

Only the module of the command being run is imported, and a command module imports the
engines (onnx, onnx-ir, onnxruntime: about a second) only when it runs: ``--help`` reads
the light declarations of :mod:`onnxsmith.settings` (docs/benchmarks.md, "--help").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

from onnxsmith.core.errors import OnnxsmithError
from onnxsmith.core.text import for_terminal
from onnxsmith.core.version import __version__
from onnxsmith.settings.fp16 import FP16
from onnxsmith.settings.fuse import FUSE
from onnxsmith.settings.int8 import INT8
from onnxsmith.settings.quantize import QUANTIZE
from onnxsmith.settings.run import DEFAULT_RUN_TIMEOUT, RUN_TIMEOUT_ENV
from onnxsmith.settings.shrink import SHRINK

#: Command modules under onnxsmith.cli (``eval_lm_cmd`` is ``eval-lm``) and their lines, in the order
#: ``--help`` lists them.
COMMANDS = {
    "inspect_cmd": "IR, opsets, I/O, ops, parameters, largest tensors, warnings",
    "compare_cmd": "run two models on the same inputs and judge every output with the gate the transforms use "
    "(exit 1 when it fails)",
    "fp16_cmd": FP16.summary,
    "fuse_cmd": FUSE.summary,
    "int8_cmd": INT8.summary,
    "build_cmd": "build a validated, benchmarked, carded release from a recipe (exit 1 if a variant fails)",
    "validate_cmd": "judge a variant against its source on a task's real data (exit 1 when a gate fails)",
    "bench_cmd": "latency per batch, throughput, session load time, peak memory",
    "card_cmd": "write a release's README.md (files, hashes, validation, benchmark)",
    "predict_cmd": "run a model on one input and decode its answer (faceage)",
    "quantize_cmd": QUANTIZE.summary,
    "eval_lm_cmd": "a language model's loss, perplexity, KL and top-1 agreement on held-out text",
    "extract_cmd": "the subgraph between named tensors as a model of its own, typed and verified against the source",
    "shrink_cmd": SHRINK.summary,
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line like every other error (its usage text is in --help);
    the command's subparsers are of this class too (argparse makes them of their parent's)."""

    #: Called with the command's words before they are parsed: flags that depend on another flag's value are
    #: added then (validate's and predict's task options, on --task: cli/task_args.py).
    prepare: Callable[[argparse.ArgumentParser, list[str]], None] | None = None

    def parse_known_args(self, args=None, namespace=None):
        if self.prepare is not None and args is not None:
            self.prepare(self, list(args))
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        command = self.prog.removeprefix("onnxsmith").strip()
        where = f"{command}: " if command else ""
        hint = f"onnxsmith {command} --help" if command else "onnxsmith --help"
        self.exit(2, f"onnxsmith: error: {where}{' '.join(message.split())} (see {hint})\n")


def command_name(module: str) -> str:
    """``eval_lm_cmd`` -> ``eval-lm``."""
    return module.removesuffix("_cmd").replace("_", "-")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the flags of the command ``argv`` names (of every command without ``argv``); the
    others are listed by name and line only, their modules not imported."""
    parser = _Parser(
        prog="onnxsmith",
        description="Turn a source ONNX model into deployment variants proven against their source.",
        epilog=f"environment: {RUN_TIMEOUT_ENV}=SECONDS stops any one run of a model in onnxruntime after "
        f"that long (default {DEFAULT_RUN_TIMEOUT:g}; 0: no limit)",
    )
    parser.add_argument("--version", action="version", version=f"onnxsmith {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    # The top-level parser takes no option with a value: the first word that is not an option is the command.
    chosen = next((word for word in argv if not word.startswith("-")), None) if argv is not None else None
    for module, summary in COMMANDS.items():
        name = command_name(module)
        command = subparsers.add_parser(name, help=summary)
        if argv is None or name == chosen:
            importlib.import_module(f"onnxsmith.cli.{module}").register(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a file name need not be UTF-8: print it escaped, never crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)  # a task's flag may be refused as it is read (cli/task_args.py)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        with _sigterm_unwinds():
            from onnxsmith.runtime.runner import run_timeout  # here: the engines load when a command runs

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
