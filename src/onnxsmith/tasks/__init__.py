"""Task adapters for validation (``--task NAME``, a recipe's ``[validation] task``).

A task makes a model's inputs from real data, decodes its outputs and measures
how far a variant is from its source; see :mod:`onnxsmith.tasks.base`.
Importing this package registers every task module listed here.
"""

import importlib

#: Task modules under onnxsmith.tasks.
MODULES: list[str] = ["generic", "faceage", "lm_task"]

for _name in MODULES:
    importlib.import_module(f"onnxsmith.tasks.{_name}")
