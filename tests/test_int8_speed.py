"""``int8`` measures the speed it promises and says when it is not met; with ``keep_fast``, int8 parts that do not
make the variant faster stay fp32.

The timing itself is replaced by run times computed from what each variant holds (no timed assertions):
the variants are still made and written by int8/speed.py, the decision and the report are the
transform's, and the variant is run in onnxruntime against the source.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxsmith.core.errors import NothingGained
from onnxsmith.int8_engine import speed as int8_speed
from onnxsmith.int8_engine.speed import Int8Timer
from onnxsmith.io.load import load_model
from onnxsmith.passes.quantize_linears import LinearPlan
from onnxsmith.release.variant import produce_variant
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.runtime.runner import open_session, run
from onnxsmith.transforms.int8 import Int8
from tests.support.fusion import op_count

WIDTH = 64


def _tiny_linears(path, layers: int = 4):
    """x [8, 32, 64] -> (MatMul 64x64 -> Relu) x layers: Linears int8 can take, too small to gain from it."""
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(w, f"W{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"], name=f"fc{i}"))
        x = f"h{i}" if i == layers - 1 else f"r{i}"
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [f"h{i}"], [x], name=f"relu{i}"))
    graph = helper.make_graph(
        nodes,
        "tiny_linears",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32, WIDTH])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [8, 32, WIDTH])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _run_times(int8_cost: float, calls: list):
    """seconds_per_run as if each int8 Linear of a model cost ``int8_cost`` (negative: saved) on 1 s of fp32."""

    def seconds_per_run(paths, feeds, *, seconds):
        calls.append(len(paths))
        assert set(feeds) == {"x"}
        return {
            key: 1.0 + int8_cost * op_count(load_model(path), "MatMulIntegerToFloat") for key, path in paths.items()
        }

    return seconds_per_run


def _int8(source, out, **options):
    feeds = [random_inputs(load_model(source), seed=0)]
    return produce_variant(source, out, [("int8", Int8.Options(error_budget=0.5, **options))], feeds=feeds)


def _same_outputs(source, variant, atol):
    x = {"x": np.random.default_rng(9).standard_normal((8, 32, WIDTH)).astype(np.float32)}
    expected, got = (run(open_session(path), x)["h3"] for path in (source, variant))
    np.testing.assert_allclose(got, expected, atol=atol)


def test_by_default_a_slower_variant_is_said_to_be_slower_and_its_bytes_do_not_depend_on_the_timing(
    tmp_path, monkeypatch
):
    """The speed measured and reported first, nothing kept fp32 for it: the same bytes however the timing came out."""
    written = {}
    for cost in (+0.1, -0.1):
        calls = []
        monkeypatch.setattr(int8_speed, "seconds_per_run", _run_times(cost, calls))
        source = _tiny_linears(tmp_path / "tiny.onnx")
        out = tmp_path / f"int8-{cost}.onnx"
        report = _int8(source, out).reports[0]
        assert calls == [2] and all(r["int8"] == "yes" for r in report.tables["Linears"])
        written[cost] = out.read_bytes()
        slower = report.why_not_more[0] if report.why_not_more else ""
        assert slower.startswith("int8 measured no faster than the model given here: 0.71x") == (cost > 0)
        assert ("--keep-fast keeps fp32 the int8 parts that do not pay" in slower) == (cost > 0)
    assert written[+0.1] == written[-0.1]


def test_with_keep_fast_int8_linears_that_cost_time_are_kept_fp32_for_speed(tmp_path, monkeypatch):
    """Every int8 part kept fp32 for speed: the variant would be the source again, so none is written (exit 1),
    and the refusal says why: nothing int8 measured faster here."""
    calls = []
    monkeypatch.setattr(int8_speed, "seconds_per_run", _run_times(+0.1, calls))
    source = _tiny_linears(tmp_path / "tiny.onnx")
    out = tmp_path / "int8.onnx"
    with pytest.raises(NothingGained) as refused:
        _int8(source, out, keep_fast=True)
    assert refused.value.exit_code == 1 and not out.exists()
    line = refused.value.one_line()
    assert "nothing went int8, no variant written: no int8 part measured faster than fp32 here: all kept fp32" in line
    assert "4 Linear(s) stay fp32: not faster" in line


def test_int8_linears_that_save_time_stay_int8_and_the_speed_is_reported(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(int8_speed, "seconds_per_run", _run_times(-0.1, calls))
    source = _tiny_linears(tmp_path / "tiny.onnx")
    out = tmp_path / "int8.onnx"
    report = _int8(source, out, keep_fast=True).reports[0]
    assert all(r["int8"] == "yes" for r in report.tables["Linears"]) and calls == [2]  # one timing: 1.67x
    assert report.stats["measured_speedup"] == pytest.approx(1 / 0.6)
    assert any(n.startswith("measured speed-up on the first calibration input (batch 8)") for n in report.notes)
    assert not any("faster" in line for line in report.why_not_more)
    assert op_count(load_model(out), "MatMulIntegerToFloat") == 4
    _same_outputs(source, out, atol=0.1)


def test_without_speed_nothing_is_timed(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(int8_speed, "seconds_per_run", _run_times(+0.1, calls))
    report = _int8(_tiny_linears(tmp_path / "tiny.onnx"), tmp_path / "int8.onnx", speed=False).reports[0]
    assert calls == [] and "measured_speedup" not in report.stats
    assert all(r["int8"] == "yes" for r in report.tables["Linears"])


def test_the_timer_writes_and_runs_the_variants_it_is_asked_for(tmp_path, monkeypatch):
    """The real timing (no assertion on the times): each variant is the model with the named parts int8."""
    source = _tiny_linears(tmp_path / "tiny.onnx")
    feeds = random_inputs(load_model(source), seed=0)
    seen = {}
    real = int8_speed.seconds_per_run

    def spy(paths, feeds, *, seconds):
        seen.update({key: op_count(load_model(path), "MatMulIntegerToFloat") for key, path in paths.items()})
        return real(paths, feeds, seconds=seconds)

    monkeypatch.setattr(int8_speed, "seconds_per_run", spy)
    timer = Int8Timer(source, source, feeds, {"fc0": LinearPlan(), "fc2": LinearPlan()}, seconds=0.01)
    fp32, times = timer([set(), {"fc0"}, {"fc0", "fc2"}])
    assert fp32 > 0 and len(times) == 3 and all(t > 0 for t in times) and timer.calls == 1
    assert seen == {"fp32": 0, "variant 0": 0, "variant 1": 1, "variant 2": 2}


@pytest.mark.parametrize("rounds", [1, 3])
def test_the_side_by_side_timer_runs_each_model_the_rounds_it_is_asked_for(tmp_path, monkeypatch, rounds):
    """With ``seconds=0`` the rounds are exactly ``min_rounds`` (what the benchmarks ask for); a zero block is one run
    per round, after the first (sizing) run of each model."""
    import shutil

    from onnxsmith.runtime import runner, speed

    paths = {"a": _tiny_linears(tmp_path / "a.onnx")}
    paths["b"] = shutil.copy(paths["a"], tmp_path / "b.onnx")
    feeds = random_inputs(load_model(paths["a"]), seed=0)
    calls = {}
    real, real_timed = runner.run, runner.timed_runs

    def counting(session, feeds, *args, label, **kwargs):
        calls[Path(label).stem] = calls.get(Path(label).stem, 0) + 1
        return real(session, feeds, *args, label=label, **kwargs)

    def counting_timed(session, feeds, runs, *, label):  # timed where they run: many runs in one call
        calls[Path(label).stem] = calls.get(Path(label).stem, 0) + runs
        return real_timed(session, feeds, runs, label=label)

    monkeypatch.setattr(speed.runner, "run", counting)
    monkeypatch.setattr(speed.runner, "timed_runs", counting_timed)
    times = speed.seconds_per_run(paths, feeds, seconds=0, block_seconds=0, min_rounds=rounds, max_rounds=rounds)
    assert set(times) == {"a", "b"} and all(t > 0 for t in times.values())
    assert calls == {"a": 1 + rounds, "b": 1 + rounds}
