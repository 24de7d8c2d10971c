"""The one gate (verify/gate.py): bounds from the number format two models differ in, each output against its
own magnitude, one verdict in every command; deliberately broken variants fail in each of them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxsmith.analysis.number_formats import FP16, FP32, FP64, INT8, compared_format, formats_of
from onnxsmith.core.errors import GateFailed
from onnxsmith.core.transform import StepReport, Transform, register
from onnxsmith.io.load import load_model
from onnxsmith.release.variant import produce_variant
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.transforms.fp16 import Options as Fp16Options
from onnxsmith.verify.gate import Bounds, GateOptions, judge_output, verdict
from tests.support.defects import DEFECTS, break_ir, broken_proto
from tests.support.models import mlp, tiny_detector
from tests.support.realmodels import real_model

# ---------------------------------------------------------------- bounds and formats


def test_bounds_scale_with_the_format():
    fp16, fp32 = Bounds.for_format(FP16), Bounds.for_format(FP32)
    assert fp16.min_cosine == pytest.approx(1 - 2**-11) and fp16.rtol == 0.25 and fp16.atol is None
    assert fp16.magnitude == pytest.approx(2**-5)
    # fp32 counts as 17-bit (reordered fp32 arithmetic in an ill-conditioned model), fp64 too.
    fp64 = Bounds.for_format(FP64)
    assert fp32.rtol == pytest.approx(2**-8) and (fp64.min_cosine, fp64.rtol) == (fp32.min_cosine, fp32.rtol)
    assert Bounds.for_format(INT8).min_cosine == pytest.approx(1 - 2**-5)
    mine = Bounds.for_format(FP16, GateOptions(min_cosine=0.9, atol=0.5))
    assert (mine.min_cosine, mine.rtol, mine.atol, mine.explicit) == (0.9, 0.25, 0.5, ("atol", "min_cosine"))
    with pytest.raises(ValueError, match="rtol must be a non-negative"):
        GateOptions(rtol=-1)


def test_compared_format_is_where_the_two_differ():
    fp32, fp16, fp64, int8 = frozenset({FP32}), frozenset({FP32, FP16}), frozenset({FP64, FP32}), frozenset({INT8})
    assert compared_format(fp32, fp16) == FP16 == compared_format(fp16, fp32)  # either way round
    assert compared_format(fp32, fp32) == FP32
    assert compared_format(fp16, fp16) == FP16  # an fp16 model reordered differs by fp16 rounding
    assert compared_format(fp64, fp32) == FP32  # fp64 narrowed to fp32: fp32 rounding, not fp64's
    assert compared_format(fp32 | int8, fp16 | int8) == FP16  # both quantise the same way: fp16 decides
    assert compared_format(fp32, fp32 | int8) == INT8  # an int8 variant


def test_formats_of_reads_weights_casts_and_quantizing_ops(save_proto, tmp_path):
    source = save_proto(mlp())
    assert formats_of(load_model(source)) == {FP32}
    produce_variant(source, tmp_path / "half.onnx", [("fp16", Fp16Options())], feeds=_feeds(source))
    assert formats_of(load_model(tmp_path / "half.onnx")) == {FP32, FP16}


# ---------------------------------------------------------------- one output


def test_fp16_rounding_noise_passes_and_a_scaled_output_does_not():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 64, 10)) * 5
    noisy = ref * (1 + rng.standard_normal(ref.shape) * 2e-3)
    assert judge_output("y", ref, noisy, Bounds.for_format(FP16)).passed
    scaled = judge_output("y", ref, ref * 1.1, Bounds.for_format(FP16))
    assert scaled.cosine == pytest.approx(1.0) and scaled.failed == ["magnitude"]  # cosine cannot see it
    assert not judge_output("y", ref, noisy, Bounds.for_format(FP32)).passed  # fp16 noise in an fp32 variant


def test_each_value_is_judged_against_its_channel_not_the_largest_output():
    """Box coordinates up to 320 beside scores in 0..1: shifting every score by 0.3 keeps the cosine at
    0.9999 (the boxes dominate the norm) but is far outside what fp16 rounding does to a score."""
    rng = np.random.default_rng(1)
    boxes = rng.uniform(0, 320, (1, 4, 400))
    scores = rng.uniform(0, 0.2, (1, 3, 400))
    ref = np.concatenate([boxes, scores], axis=1)[None]
    shifted = ref.copy()
    shifted[:, :, 4:] += 0.3
    diff = judge_output("output0", ref, shifted, Bounds.for_format(FP16))
    assert diff.cosine > 0.999 and "cosine" not in diff.failed
    assert diff.failed == ["values"] and diff.worst_at[2] >= 4  # a score row
    rounded = ref.astype(np.float16).astype(np.float64)
    assert judge_output("output0", ref, rounded, Bounds.for_format(FP16)).passed


def test_nan_inf_never_pass_and_all_zero_outputs_need_zeros():
    ref = np.ones((1, 3, 4))
    test = ref.copy()
    test[0, 0, 0] = np.inf
    anything = GateOptions(min_cosine=-1, rtol=1e9, atol=1e9)
    diff = judge_output("y", ref, test, Bounds.for_format(FP16, anything))
    assert not diff.passed and diff.failed[0] == "nonfinite"
    assert "no bound accepts NaN/inf" in verdict([diff], Bounds.for_format(FP16, anything))
    same_nan = np.where(ref > 0, np.nan, 0.0)
    assert judge_output("y", same_nan, same_nan.copy(), Bounds.for_format()).passed  # where the source has them
    zeros = np.zeros((1, 8))
    same = judge_output("y", zeros, zeros.copy(), Bounds.for_format())
    assert same.passed and same.cosine == 1.0  # identical
    off = judge_output("y", zeros, zeros + 1e-3, Bounds.for_format(FP16))
    assert off.cosine is None and off.failed == ["values"] and off.needed == {"atol": pytest.approx(1e-3)}


def test_integer_outputs_must_be_equal():
    ref = np.arange(6).reshape(1, 2, 3)
    assert judge_output("ids", ref, ref.copy(), Bounds.for_format(FP16)).passed
    assert not judge_output("ids", ref, ref + (ref == 5), Bounds.for_format(FP16)).passed


@pytest.mark.parametrize("options", [GateOptions(), GateOptions(atol=1e-3)])
def test_the_option_a_refusal_names_accepts_the_variant(options):
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((3, 20, 37)) * 4
    test = ref + rng.standard_normal(ref.shape) * 0.3
    test[0, 5, 7] += 3
    bounds = Bounds.for_format(FP16, options)
    diff = judge_output("logits", ref, test, bounds)
    line = verdict([diff], bounds)
    assert not diff.passed and "\n" not in line
    assert f"cosine {diff.cosine:.5f}" in line and "argmax" in line and "rows" in line and "would accept it" in line
    accepted = Bounds.for_format(FP16, GateOptions(**{**vars(options), **diff.needed}))
    assert judge_output("logits", ref, test, accepted).passed


# ---------------------------------------------------------------- every command


@dataclass
class DefectOptions:
    defect: str = field(default="flipped sign", metadata={"choices": sorted(DEFECTS)})
    weight: str = "w_mid"


@register
class TestOnlyDefect(Transform):
    """A faulty conversion: one weight broken (tests/support/defects.py)."""

    name = "test-only-defect"
    Options = DefectOptions

    def apply(self, model, options, context):
        break_ir(model, options.defect, options.weight)
        return StepReport(self.name, {"defect": options.defect, "weight": options.weight})


CASES = [("flipped sign", "w_mid"), ("shifted bias", "b_score"), ("overflow", "w_stem")]


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """The tiny detector, its fp16 variant (written by `fp16`), and random inputs for both."""
    folder = tmp_path_factory.mktemp("detector")
    source = folder / "source.onnx"
    onnx.save(tiny_detector(), source)
    feeds = _feeds(source, samples=2)
    produce_variant(source, folder / "fp16.onnx", [("fp16", Fp16Options())], feeds=feeds)
    np.savez(folder / "inputs.npz", **feeds[0])
    return folder, feeds


@pytest.mark.parametrize(("defect", "weight"), CASES)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_broken_variant_fails_in_every_command(detector, cli, tmp_path, defect, weight, precision):
    folder, feeds = detector
    source = folder / "source.onnx"
    good = source if precision == "fp32" else folder / "fp16.onnx"
    broken = tmp_path / "broken.onnx"
    onnx.save(broken_proto(onnx.load(good), defect, weight), broken)
    inputs = ["--inputs", folder / "inputs.npz"]
    # compare and validate of the written file
    assert cli("compare", source, good, *inputs).returncode == 0
    compared = cli("compare", source, broken, *inputs, "--json")
    assert compared.returncode == 1 and not json.loads(compared.stdout)["passed"]
    text = cli("compare", source, broken, *inputs)
    # a bound that would accept it, or none (a flipped sign: cosine 0.59, no bound short of accepting anything)
    assert "fails the gate" in text.stdout and any(
        why in text.stdout for why in ("would accept it", "NaN/inf", "far from the source")
    )
    validated = cli("validate", source, broken, "--task", "generic", "--data", folder / "inputs.npz")
    assert validated.returncode == 1 and "gate failed" in validated.stdout, validated.stdout
    # a transform (and a chain after fp16) that breaks it: refused, nothing written
    steps = [("fp16", Fp16Options())] if precision == "fp16" else []
    steps.append(("test-only-defect", DefectOptions(defect, weight)))
    with pytest.raises(GateFailed, match="variant not written") as refused:
        produce_variant(source, tmp_path / "made.onnx", steps, feeds=feeds)
    assert not (tmp_path / "made.onnx").exists()
    message = refused.value.one_line()
    assert "\n" not in message
    if defect == "overflow":
        assert "NaN/inf" in message and "the first non-finite tensor is" in message
    else:
        assert "cosine" in message or "|Δ|" in message
        assert "would accept it" in message or "far from the source" in message
        if "--min-cosine" in message:  # never a bound that accepts anything
            assert float(message.split("--min-cosine ")[1].split()[0]) >= 0.9


def test_compare_and_the_transform_agree_on_a_good_fp16_variant(detector, cli):
    folder, _ = detector
    report = cli("compare", folder / "source.onnx", folder / "fp16.onnx", "--samples", "2", "--json")
    assert report.returncode == 0
    verdict_json = json.loads(report.stdout)
    assert verdict_json["gate"]["format"] == "fp16" and verdict_json["gate"]["explicit"] == []
    validated = cli(
        "validate", folder / "source.onnx", folder / "fp16.onnx", "--task", "generic", "--data", folder / "inputs.npz"
    )
    assert validated.returncode == 0 and "all gates hold" in validated.stdout


def test_a_refused_variant_is_accepted_with_the_options_it_names(detector, tmp_path):
    folder, feeds = detector
    source = folder / "source.onnx"
    steps = [("test-only-defect", DefectOptions("shifted bias", "b_mid"))]
    with pytest.raises(GateFailed) as refused:
        produce_variant(source, tmp_path / "v.onnx", steps, feeds=feeds)
    options = dict(item.split(" ") for item in _flags(refused.value.problem))
    result = produce_variant(
        source,
        tmp_path / "v.onnx",
        steps,
        feeds=feeds,
        gate=GateOptions(**{k[2:].replace("-", "_"): float(v) for k, v in options.items()}),
    )
    assert result.comparison.passed and (tmp_path / "v.onnx").exists()
    assert set(result.comparison.bounds.explicit) == {k[2:].replace("-", "_") for k in options}


def _flags(problem: str) -> list[str]:
    """'... ; --min-cosine 0.99 --rtol 0.4 would accept it' -> ['--min-cosine 0.99', '--rtol 0.4']"""
    words = problem.rsplit("; ", 1)[1].removesuffix(" would accept it").split()
    return [f"{words[i]} {words[i + 1]}" for i in range(0, len(words), 2)]


def _feeds(path, samples: int = 2):
    model = load_model(path)
    return [random_inputs(model, seed=s) for s in range(samples)]


def test_cosine_is_shown_with_its_distance_from_one():
    from onnxsmith.verify.gate import format_cosine

    assert format_cosine(0.99871) == "0.99871" and format_cosine(1 - 3e-8) == "0.9999999700"
    assert format_cosine(0.5) == "0.5000" and not math.isnan(float(format_cosine(1.0)))


def test_ir_defect_matches_the_proto_defect():
    proto = tiny_detector()
    model = ir.serde.deserialize_model(proto)
    break_ir(model, "flipped sign", "w_mid")
    a = ir.serde.serialize_model(model)
    b = broken_proto(proto, "flipped sign", "w_mid")
    pick = lambda m: next(t for t in m.graph.initializer if t.name == "w_mid")  # noqa: E731
    assert onnx.numpy_helper.to_array(pick(a)).tolist() == onnx.numpy_helper.to_array(pick(b)).tolist()


# ---------------------------------------------------------------- real models (issue 11 item 6)


@pytest.mark.realmodel
def test_a_detector_gets_one_verdict_from_fp16_fuse_and_compare(cli, tmp_path):
    """nudenet's YOLOv8n: box coordinates in pixels (up to ~320) beside class scores in one output.
    `fuse --precision fp16` refused it (|Δ| 0.369 > atol 0.05) where `fp16` accepted it."""
    source = real_model("nudenet_320n")
    shape = ["--shape", "images:1,3,320,320"]
    for name, command in (("fp16", ["fp16"]), ("fuse16", ["fuse", "--precision", "fp16"])):
        made = cli(*command, source, tmp_path / f"{name}.onnx", *shape, "--report", tmp_path / f"{name}.json")
        assert made.returncode == 0, made.stderr
        gate = json.loads((tmp_path / f"{name}.json").read_text())["verification"]["gate"]
        assert gate["format"] == "fp16" and gate["explicit"] == []
        compared = cli("compare", source, tmp_path / f"{name}.onnx", *shape, "--json")
        assert compared.returncode == 0 and json.loads(compared.stdout)["gate"] == gate


@pytest.mark.realmodel
def test_compare_judges_an_fp16_variant_at_fp16(cli, tmp_path):
    """ddddocr's recogniser (logits up to ~30): its fp16 variant passes `compare` with no option, and
    the same variant with one weight's sign flipped is refused with its cosine (and the option that would
    accept it, unless only a bound that accepts anything would)."""
    source = real_model("ddddocr_common")
    assert cli("fp16", source, tmp_path / "half.onnx").returncode == 0
    assert cli("compare", source, tmp_path / "half.onnx").returncode == 0
    proto = onnx.load(tmp_path / "half.onnx")
    weight = max(proto.graph.initializer, key=lambda t: len(t.raw_data)).name
    onnx.save(broken_proto(proto, "flipped sign", weight), tmp_path / "broken.onnx")
    refused = cli("compare", source, tmp_path / "broken.onnx")
    assert refused.returncode == 1
    text = " ".join(refused.stdout.split())  # rich wraps the line
    assert "cosine" in text and "argmax" in text
    assert "would accept it" in text or "far from the source: no bound short of accepting anything" in text
