"""The fuse transform's steps on a model, recorded once per test session.

Each rule test reads the graph just before and just after its own rule, as
the transform runs it (the rules before it have shaped the graph it sees), and
compares the two in onnxruntime.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.fuse_engine.fusions import FUSIONS, apply_fusion
from onnxsmith.fuse_engine.shapes import input_dims, prepare_shapes
from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.prune_rows import PruneRowsPass
from onnxsmith.rules.apply import RuleOutcome, apply_rules
from onnxsmith.runtime.inputs import random_inputs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FACEAGE = {"dynamo": FIXTURES / "faceage_dynamo.onnx", "torchscript": FIXTURES / "faceage_torchscript.onnx"}


@dataclass(frozen=True)
class Step:
    name: str
    outcome: RuleOutcome | None
    before: bytes  # serialized ModelProto
    after: bytes

    def model_before(self) -> ir.Model:
        return ir.serde.deserialize_model(_proto(self.before))

    def model_after(self) -> ir.Model:
        return ir.serde.deserialize_model(_proto(self.after))


def _proto(data: bytes):
    import onnx

    return onnx.load_from_string(data)


def snapshot(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()


@functools.cache
def fusion_trace(path: str) -> dict[str, Step]:
    """Every step of ``fuse`` (fp32) on ``path``: "shapes", each FUSIONS name, "prune rows"."""
    model = load_model(path)
    feeds = random_inputs(model)
    input_dims(model, feeds)
    steps: dict[str, Step] = {}
    start = snapshot(model)
    _, noop = prepare_shapes(model)
    steps["shapes"] = Step("shapes", noop, start, snapshot(model))
    for name, stages in FUSIONS:
        before = snapshot(model)
        outcome = apply_fusion(model, name, stages)
        steps[name] = Step(name, outcome, before, snapshot(model))
    RemoveUnusedNodesPass()(model)
    infer_types(model)
    before = snapshot(model)
    PruneRowsPass()(model)
    steps["prune rows"] = Step("prune rows", None, before, snapshot(model))
    return steps


def op_count(model: ir.Model, op_type: str) -> int:
    return sum(1 for node in model.graph if node.op_type == op_type)


def assert_same_outputs(
    before: bytes, after: bytes, tmp_path: Path, *, atol: float = 5e-3, rtol: float = 1e-3, batch: int = 2
):
    """The two graphs agree in onnxruntime on seeded random faces.

    The face-age fixture is ill-conditioned on purpose (a 1.4e5 residual channel under
    LayerNorms calibrated around it): any reordering of its fp32 arithmetic moves the
    logits by up to ~3e-3 (onnxruntime's own graph optimisations do), while a wrong
    rewrite (a sign, a scale, a dropped bias) moves them by 0.1 or more.
    """
    from tests.support.check import assert_pass_preserves_outputs

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "before.onnx").write_bytes(before)
    (tmp_path / "after.onnx").write_bytes(after)
    model = load_model(tmp_path / "before.onnx")
    feeds = [random_inputs(model, dims={"batch": batch}, seed=s) for s in range(2)]
    return assert_pass_preserves_outputs(
        tmp_path / "before.onnx", tmp_path / "after.onnx", tmp_path, feeds=feeds, atol=atol, rtol=rtol
    )


def prepared_mlp() -> ir.Model:
    """tests/support/models.mlp() as the fuse transform hands it to the rules: nothing for them to match."""
    from tests.support.models import mlp

    model = ir.serde.deserialize_model(mlp())
    prepare_shapes(model)
    infer_types(model)
    return model


def assert_untouched(model: ir.Model, name: str, *rule_sets) -> RuleOutcome:
    """Applying the rules changes nothing and says why."""
    before = snapshot(model)
    outcome = apply_rules(model, name, *rule_sets)
    assert outcome.matched == 0
    assert outcome.reason
    assert snapshot(model) == before
    return outcome
