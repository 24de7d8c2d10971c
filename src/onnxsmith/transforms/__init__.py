"""The transforms a user asks for by name (``onnxsmith NAME`` and a recipe's ``pass = "NAME"``).

Importing this package registers every transform module listed here.
"""

import importlib

#: Transform modules under onnxsmith.transforms.
MODULES: list[str] = ["quantize", "shrink", "fp16", "fuse"]

for _name in MODULES:
    importlib.import_module(f"onnxsmith.transforms.{_name}")
