"""The model's default-domain opset raised to a version a fusion's output op needs.

LayerNormalization exists from opset 17; a model exported at opset 11 that writes its
LayerNorms out (PP-OCR, DINOv2 at opset 14) can only get one at 17 or later (onnxruntime
runs an onnx-domain LayerNormalization below 17, onnx.checker and other runtimes do not).
The conversion is onnxscript's version converter, which hands what it has no adapters for
to onnx's (Squeeze/Unsqueeze axes as inputs from 13, and so on). Only ever called for a
fusion that matched: a model the fusion leaves alone keeps its opset.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import version_converter


@dataclass
class RaiseOpsetResult(ir.passes.PassResult):
    before: int | None = None
    reason: str = ""  # why the opset stayed below the target ('' when it was raised or already there)


class RaiseOpsetPass(ir.passes.InPlacePass):
    def __init__(self, version: int):
        super().__init__()
        self.version = version

    def call(self, model: ir.Model) -> RaiseOpsetResult:
        before = default_opset(model)
        if before is None or before >= self.version:
            return RaiseOpsetResult(model, False, before)
        converter = logging.getLogger(version_converter.__name__)
        level = converter.level
        converter.setLevel(logging.ERROR)  # its warnings say which converter it used, or that it failed
        try:
            version_converter.convert_version(model, self.version, fallback=True)
        except Exception as error:  # onnx's converter raises for ops it cannot adapt
            return RaiseOpsetResult(model, False, before, f"{type(error).__name__}: {error}".splitlines()[0])
        finally:
            converter.setLevel(level)
        if default_opset(model) != self.version:
            return RaiseOpsetResult(model, False, before, "the onnx version converter could not convert it")
        return RaiseOpsetResult(model, True, before)


def default_opset(model: ir.Model) -> int | None:
    for domain in ("", "ai.onnx"):
        if domain in model.opset_imports:
            return model.opset_imports[domain]
    return None
