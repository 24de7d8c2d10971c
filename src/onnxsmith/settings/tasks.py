"""Every task's settings by name: what ``validate --help`` lists and ``--task NAME`` adds flags from.

The task classes (:mod:`onnxsmith.tasks`) take their name, line and options from these
(``class FaceAge(Task, settings=FACEAGE)``); a test keeps the two lists the same.
"""

from __future__ import annotations

from onnxsmith.settings import TaskSettings
from onnxsmith.settings.faceage import FACEAGE
from onnxsmith.settings.generic import GENERIC
from onnxsmith.settings.lm import LM

TASK_SETTINGS: dict[str, TaskSettings] = {task.name: task for task in (FACEAGE, GENERIC, LM)}
