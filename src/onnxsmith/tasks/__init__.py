"""Task adapters for validation (``--task NAME``, a recipe's ``[validation] task``).

A task makes a model's inputs from real data, decodes its outputs and measures
how far a variant is from its source; see :mod:`onnxsmith.tasks.base`. A task
may also be the gate a transform's variants are judged by (``lm`` for ``quantize``).
Importing this package registers every task module it imports here.
"""

from onnxsmith.tasks import faceage, generic, lm  # noqa: F401  (importing registers them)
from onnxsmith.tasks.base import TASKS, Task


def tasks() -> dict[str, type[Task]]:
    return TASKS.classes()


def get_task(name: str) -> Task:
    return TASKS.create(name)
