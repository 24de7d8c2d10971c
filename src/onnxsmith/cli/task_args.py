"""Every task's options as flags of one command (``validate``, ``predict``).

The task is chosen by ``--task`` at run time, so each option field of every task
becomes one flag (tasks share ``--data``); the values of the chosen task's
fields are converted by their dataclass types and checked by
:func:`onnxsmith.core.options.build`, like a recipe's keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing

from onnxsmith.core import options as opts
from onnxsmith.core.errors import UsageError
from onnxsmith.tasks import tasks
from onnxsmith.tasks.base import Task

_PREFIX = "task_option_"


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    owners: dict[str, list[tuple[str, dataclasses.Field]]] = {}
    for name, cls in sorted(tasks().items()):
        for f in dataclasses.fields(cls.Options):
            owners.setdefault(f.name, []).append((name, f))
    parser.add_argument("--task", required=True, choices=sorted(tasks()), help="what the model does")
    group = parser.add_argument_group("task options (the tasks each applies to in brackets)")
    for field_name, users in owners.items():
        helps = {task: f.metadata.get("help", "") for task, f in users}
        if len(set(helps.values())) == 1:
            help_text = f"{users[0][1].metadata.get('help', '')} [{', '.join(helps)}]"
        else:
            help_text = "; ".join(f"[{task}] {text}" for task, text in helps.items())
        many = any(_is_list(typing.get_type_hints(tasks()[task].Options)[field_name]) for task, _ in users)
        group.add_argument(
            "--" + field_name.replace("_", "-"),
            dest=_PREFIX + field_name,
            metavar=field_name.upper(),
            help=help_text.replace("%", "%%") + (" (repeatable)" if many else ""),  # argparse formats help with %
            action="append" if many else "store",
        )


def task_options_from_args(args: argparse.Namespace, task: Task):
    fields = {f.name: f for f in dataclasses.fields(task.Options)}
    hints = typing.get_type_hints(task.Options)
    given = {}
    for key, value in vars(args).items():
        if not key.startswith(_PREFIX) or value is None:
            continue
        name = key[len(_PREFIX) :]
        flag = "--" + name.replace("_", "-")
        if name not in fields:
            raise UsageError(f"{flag} is not an option of task '{task.name}'")
        given[name] = _convert(value, hints[name], flag)
    return opts.build(task.Options, given, where="command line")


def _is_list(annotation) -> bool:
    return typing.get_origin(annotation) is list or annotation is list


def _convert(text: str | list[str], annotation, flag: str):
    kind = annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kind = next(a for a in typing.get_args(annotation) if a is not type(None))
    if _is_list(kind):  # repeatable, and each may be comma-separated
        return [x.strip() for item in ([text] if isinstance(text, str) else text) for x in item.split(",") if x.strip()]
    if isinstance(text, list):  # a flag repeated for a task whose field of that name is not a list
        text = text[-1]
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "yes", "no", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "yes", "1")
        if kind in (int, float):
            return opts.ARGUMENT_TYPES[kind](text)
    except (ValueError, argparse.ArgumentTypeError):
        what = "a finite number" if kind is float else kind.__name__
        raise UsageError(f"{flag} expects {what}, got '{text}'") from None
    return text


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
