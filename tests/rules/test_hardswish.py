"""rules/hardswish.py: a written-out hard swish -> x * HardSigmoid(x), on both torch exporters and PaddleOCR."""

import numpy as np
import onnx_ir as ir
import pytest

from onnxsmith.rules.apply import apply_rules
from onnxsmith.rules.hardswish import hardswish_rules
from tests.support.check import assert_pass_preserves_outputs
from tests.support.fusion import assert_untouched, op_count, prepared_mlp
from tests.support.realmodels import real_model


def _export(tmp_path, exporter: str, spelling: str, low: float = 0.0):
    """A Conv and three hard swishes spelled as PyTorch code writes them (``spelling``)."""
    import torch
    import torch.nn.functional as F

    def hard_swish(x):
        gate = torch.clamp(x + 3.0, low, 6.0)
        if spelling == "divided":
            return x * gate / 6
        if spelling == "scaled":
            return x * gate * (1 / 6)
        return x * (gate / 6)  # the gate first: HardSigmoid, then the Mul stays

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return hard_swish(self.conv(hard_swish(F.relu6(x) - hard_swish(x))))

    torch.manual_seed(0)
    path = tmp_path / f"{exporter}-{spelling}.onnx"
    with torch.no_grad():
        torch.onnx.export(
            Block().eval(), (torch.randn(2, 8, 16, 16) * 4,), str(path), dynamo=exporter == "dynamo", opset_version=18
        )
    return path


def _rewritten(path, tmp_path):
    model = ir.load(path)
    outcome = apply_rules(model, "hard swish", hardswish_rules)
    after = tmp_path / f"{path.stem}-after.onnx"
    ir.save(model, after)
    return outcome, model, after


def _same(before, after, tmp_path, feeds):
    assert_pass_preserves_outputs(before, after, tmp_path, feeds=feeds, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spelling", ["divided", "scaled", "gate first"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_both_exporters_hard_swish_becomes_hardsigmoid_and_mul(exporter, spelling, tmp_path):
    source = _export(tmp_path, exporter, spelling)
    outcome, model, after = _rewritten(source, tmp_path)
    assert outcome.matched == 3
    assert op_count(model, "HardSigmoid") == 3 and op_count(model, "Div") == 0
    assert op_count(model, "Clip") == 1  # relu6's, not a hard swish
    rng = np.random.default_rng(0)
    feeds = [{ir.load(source).graph.inputs[0].name: (rng.standard_normal((2, 8, 16, 16)) * 4).astype(np.float32)}]
    _same(source, after, tmp_path, feeds)


def test_a_clip_that_is_not_hard_swish_is_left_alone(tmp_path):
    source = _export(tmp_path, "dynamo", "divided", low=-1.0)  # clip(x + 3, -1, 6): not a hard swish
    model = ir.load(source)
    outcome = assert_untouched(model, "hard swish", hardswish_rules)
    assert "clip(x + 3, 0, 6)" in outcome.reason
    assert_untouched(prepared_mlp(), "hard swish", hardswish_rules)


@pytest.mark.parametrize(("name", "count"), [("ppocr_rec", 28), ("ppocr_cls_mobile", 18)])
def test_real_paddleocr_hard_swishes_become_hardsigmoid(name, count, tmp_path):
    """PaddleOCR's exports (opset 11-12, constants in Constant nodes): every hard swish, outputs unchanged."""
    source = real_model(name)
    outcome, _, after = _rewritten(source, tmp_path)
    assert outcome.matched == count
    x = ir.load(source).graph.inputs[0]
    shape = (2, 3, 48, 320 if name == "ppocr_rec" else 192)
    feeds = [{x.name: np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)}]
    _same(source, after, tmp_path, feeds)
