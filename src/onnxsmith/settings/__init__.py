"""What users set, declared apart from the engines that act on it.

Each transform's and task's name, one line and options (a dataclass: :mod:`onnxsmith.core.options`) live here, and the
constants the shared command-line groups offer, so a command's ``--help``, the recipe checker and the API's
keyword check read them without loading onnx, onnx-ir or onnxruntime (``--help`` timings: docs/benchmarks.md). Nothing here imports more than the standard library and :mod:`onnxsmith.core`;
the engines import their settings from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransformSettings:
    """A transform as users address it: ``onnxsmith NAME``, a recipe's ``transform = NAME``, ``api.transform``."""

    name: str
    #: Its line in ``onnxsmith --help``.
    summary: str
    #: Its options dataclass: one flag, one recipe key and one API keyword per field.
    options: type
    #: Whether it measures calibration statistics in shards on an engine (--engine, --ray, --workers).
    on_engines: bool = False


@dataclass(frozen=True)
class TaskSettings:
    """A task as users address it: ``validate --task NAME``, a recipe's ``[validation] task = NAME``."""

    name: str
    #: Its line in ``validate --help``.
    summary: str
    #: Its options dataclass: one flag of ``--task NAME``, one recipe key and one API keyword per field.
    options: type
