"""onnxsmith: turn a source ONNX model into deployment variants proven against their source.

The calls (``onnxsmith.fp16``, ``fuse``, ``shrink``, ``int8``, ``extract``, ``quantize``, ``compare``,
``build``, ...) are :mod:`onnxsmith.api`'s, see docs/api.md. They are imported on first use:
``import onnxsmith`` (and ``onnxsmith --version``) does not load onnxruntime and the rewriter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from onnxsmith.core.version import __version__

if TYPE_CHECKING:
    from onnxsmith.api import (
        Piece,
        QuantizedFolder,
        Report,
        Variant,
        bench,
        build,
        build_all,
        card,
        check_outputs,
        compare,
        eval_lm,
        extract,
        fp16,
        fuse,
        inspect,
        int8,
        predict,
        quantize,
        shrink,
        transform,
        validate,
    )

__all__ = [
    "Piece",
    "QuantizedFolder",
    "Report",
    "Variant",
    "__version__",
    "bench",
    "build",
    "build_all",
    "card",
    "check_outputs",
    "compare",
    "eval_lm",
    "extract",
    "fp16",
    "fuse",
    "inspect",
    "int8",
    "predict",
    "quantize",
    "shrink",
    "transform",
    "validate",
]
_API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module("onnxsmith.api"), name)
    raise AttributeError(f"module 'onnxsmith' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(__all__)
