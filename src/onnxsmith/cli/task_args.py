"""A task's options as flags of one command (``validate``, ``predict``): those of the task ``--task`` names.

The command's words are read for ``--task NAME`` before they are parsed, and only that task's options are
added: one group, rendered from its settings by :func:`onnxsmith.core.options.add_arguments` and converted
and checked by :func:`onnxsmith.core.options.from_args`, like a transform's. The settings load no engine
(:mod:`onnxsmith.settings.tasks`), so ``--help`` is quick; without ``--task`` it lists the tasks.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import textwrap
from typing import Any

from onnxsmith.core import options as opts
from onnxsmith.core.errors import UsageError
from onnxsmith.settings.tasks import TASK_SETTINGS


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """``--task NAME``; the named task's options are added when the command's words are parsed (``prepare``:
    cli/main.py's parser calls it first), so the command shows and takes that task's flags only."""
    parser.add_argument(
        "--task",
        required=True,
        choices=sorted(TASK_SETTINGS),
        metavar="NAME",
        help=f"what the model does: {', '.join(sorted(TASK_SETTINGS))} (below)",
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the tasks' list keeps its lines
    parser.epilog = _task_list(parser.prog)
    parser.prepare = _add_chosen_task  # type: ignore[attr-defined]  # main._Parser calls it


def _task_list(prog: str) -> str:
    lines = [f"tasks ({prog} --task NAME --help shows that task's options):"]
    for name, task in sorted(TASK_SETTINGS.items()):
        lines.append(textwrap.fill(task.summary, 79, initial_indent=f"  {name:<9}", subsequent_indent=" " * 11))
    return "\n".join(lines)


def _flags(options_cls: type) -> set[str]:
    return {"--" + f.name.replace("_", "-") for f in dataclasses.fields(options_cls)}


def _add_chosen_task(parser: argparse.ArgumentParser, words: list[str]) -> None:
    name = _chosen_task(words)
    if name is None or getattr(parser, "task_added", None):  # no task: argparse says --task is required
        return
    task = TASK_SETTINGS[name]
    own = _flags(task.options)
    others = set().union(*(_flags(t.options) for t in TASK_SETTINGS.values())) - own
    for word in words[: words.index("--")] if "--" in words else words:
        flag = word.split("=", 1)[0]
        if flag in others:  # refused before parsing: argparse would take lm's --batch as faceage's --batch-size
            raise UsageError(
                f"{flag} is not an option of task '{name}' (its options: {parser.prog} --task {name} --help)"
            )
    summary = textwrap.fill(task.summary, 77)  # the formatter keeps the lines it is given (the tasks' list's)
    opts.add_arguments(parser, task.options, title=f"task '{name}' options", description=summary, named_errors=True)
    parser.epilog = None
    parser.task_added = name  # type: ignore[attr-defined]


def _chosen_task(words: list[str]) -> str | None:
    """The task ``--task NAME`` or ``--task=NAME`` names (the last, as argparse takes it); None if none is known."""
    name = None
    for i, word in enumerate(words):
        if word == "--":
            break
        if word == "--task" and i + 1 < len(words):
            name = words[i + 1]
        elif word.startswith("--task="):
            name = word.partition("=")[2]
    return name if name in TASK_SETTINGS else None


def task_options_from_args(args: argparse.Namespace, task: Any) -> Any:
    """The task's options from the flags its group added (a task's own ``Options``: the engine may check more)."""
    return opts.from_args(args, task.Options)


def parse_gates(items: list[str] | None) -> dict[str, float]:
    """``--gate NAME=VALUE`` (repeatable)."""
    gates = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            gates[name.strip()] = float(value)
            if not math.isfinite(gates[name.strip()]):  # a gate of nan holds for nothing, of inf for anything
                raise ValueError
        except ValueError:
            raise UsageError(f"--gate {item}: expected METRIC=NUMBER, e.g. max_abs_age_error=0.1") from None
    return gates
