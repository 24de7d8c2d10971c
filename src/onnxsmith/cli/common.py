"""Options and output shared by several commands."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.status import Status
from rich.text import Text

from onnxsmith.core.errors import GateFailed, UsageError
from onnxsmith.core.options import add_arguments, from_args, to_json
from onnxsmith.core.text import for_terminal
from onnxsmith.settings.gate import GATE_TITLE, GateOptions
from onnxsmith.settings.inputs import INPUTS_TITLE, InputOptions
from onnxsmith.settings.run import FP16_MODES


class SafeConsole(Console):
    """A console that shows every string as the characters it is, whoever wrote it.

    Names and metadata come from the model: rich's markup and emoji codes are off (a tensor named
    ``logits[/]`` is text, not a closing tag that crashes the print), and control characters are shown
    escaped (core/text.py: ``ESC[2J`` cannot clear the screen). Our own styling is given as
    :class:`rich.text.Text` styles, never as markup inside a string.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(markup=False, emoji=False, highlight=False, **kwargs)

    def render_str(self, text: str, **kwargs) -> Text:
        return super().render_str(for_terminal(text), **kwargs)  # before measuring: tables stay aligned

    def render(self, renderable, options=None):
        # A Text built from a name skips render_str: its segments are made visible here (rich's own
        # cursor and colour codes are control segments, or come later from styles, and stay).
        for segment in super().render(renderable, options):
            text = segment.text if segment.control else for_terminal(segment.text)
            yield segment if text == segment.text else Segment(text, segment.style)

    def status(self, status, **kwargs) -> Status:
        return _Status(status, console=self, **kwargs)


class _Status(Status):
    """rich's spinner reads a string as markup whatever its console says: it is given Text instead."""

    def __init__(self, status, **kwargs) -> None:
        super().__init__(_plain(status), **kwargs)

    def update(self, status=None, **kwargs) -> None:
        super().update(None if status is None else _plain(status), **kwargs)


def _plain(text):
    return Text(for_terminal(text)) if isinstance(text, str) else text


#: Tables and results; progress and notes go to stderr so stdout stays pipeable.
out = SafeConsole(soft_wrap=False, width=200)
err = SafeConsole(stderr=True)


def made_and_saved(
    make: Callable[[Callable[[str], None]], Any], output: str | None, *, report: str | None = None
) -> Any:
    """What ``make(progress)`` stages (an api call: a variant, piece or folder), made under a status line and
    saved; a result that fails its gate is not saved but raised as :class:`GateFailed` naming ``output``.
    ``report`` (``--report``) is committed with it: one that cannot be written leaves no variant. Refused,
    the report is still written, saying so, with the measurements that refused it: what the user decides on."""
    with err.status("") as status, make(status.update) as made:
        if not made.ok:
            if report is not None:
                made.write_report(report)
            raise GateFailed(made.failure + ("" if report is None else f"; its measurements are in {report}"), output)
        made.save(report=report)
    return made


def flag_keywords(args: argparse.Namespace, call: Callable, **given) -> dict[str, Any]:
    """The keywords of ``call`` (an api call) that a command's flags give: each keyword-only parameter
    from the flag of the same name (``--max-windows`` is ``max_windows=``), ``given`` in place of any."""
    names = [p.name for p in inspect.signature(call).parameters.values() if p.kind is p.KEYWORD_ONLY]
    return {**{name: getattr(args, name) for name in names if hasattr(args, name)}, **given}


def add_input_options(
    parser: argparse.ArgumentParser,
    *,
    samples: int | None = None,
    title: str = INPUTS_TITLE,
    flags: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """The API's ``feeds``, ``samples``, ``seed``, ``shape``, ``input_role`` as flags (settings/inputs.py declares
    them; read back by :func:`input_keywords`).

    ``samples``: the command's default (None: the declared one); ``flags``: the command's own names for a flag
    (``extract``: ``{"feeds": ("--input-data",)}``, its ``--inputs`` naming tensors).
    """
    add_arguments(
        parser, InputOptions, title=title, flags=flags, defaults=None if samples is None else {"samples": samples}
    )


#: The gate's bounds: one flag each (settings/gate.py declares them).
GATE_OPTIONS = tuple(f.name for f in dataclasses.fields(GateOptions))


def add_gate_options(parser: argparse.ArgumentParser, *, taken: frozenset[str] = frozenset()) -> None:
    """The one gate's bounds (verify/gate.py); unset, they follow the number format the models differ in.

    ``taken``: option names the command already has (a transform's own ``--min-cosine``, which it hands
    the gate through ``Transform.gate_settings``): not added twice.
    """
    add_arguments(parser, GateOptions, title=GATE_TITLE, skip=taken)


def gate_keywords(args: argparse.Namespace, taken: frozenset[str] = frozenset()) -> dict:
    """The API's gate bounds (:data:`GATE_OPTIONS`) from :func:`add_gate_options`' flags (not those in ``taken``)."""
    return {name: getattr(args, name, None) for name in GATE_OPTIONS if name not in taken}


def input_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The API's input keywords (:class:`InputOptions`' fields) from :func:`add_input_options`' flags."""
    return to_json(from_args(args, InputOptions))


def add_fp16_mode_option(parser: argparse.ArgumentParser) -> None:
    """``--fp16-mode``: how a model with fp16 tensors is run (the API's ``fp16_mode``)."""
    parser.add_argument(
        "--fp16-mode",
        choices=FP16_MODES,
        default="auto",
        help="auto: models with fp16 tensors run storage-faithfully (every fp16 tensor really rounded "
        "to fp16, as a GPU holds it); native: as onnxruntime's CPU provider runs them, which upcasts "
        "and hides fp16 overflow",
    )


def add_verify_options(parser: argparse.ArgumentParser, *, taken: frozenset[str] = frozenset(), **inputs) -> None:
    """The flags of the API's ``VerifySettings``: the inputs the models are run on
    (:func:`add_input_options`, ``inputs`` its keywords) and the gate's bounds (:func:`add_gate_options`)."""
    add_input_options(parser, **inputs)
    add_gate_options(parser, taken=taken)


def verify_keywords(args: argparse.Namespace, taken: frozenset[str] = frozenset()) -> dict:
    """The API's ``VerifySettings`` keywords from :func:`add_verify_options`' flags."""
    return {**input_keywords(args), **gate_keywords(args, taken)}


def session_config(items: list[str] | None) -> dict[str, str]:
    """``--session-config KEY=VALUE`` (repeatable) as the API's ``session_config``."""
    config = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--session-config {item}: expected KEY=VALUE")
        config[key.strip()] = value.strip()
    return config


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
