"""`onnxsmith bench` over models that cannot all be measured: what can be benchmarked is, the rest is said.

A model whose inputs have a fixed batch is measured at that batch (and the table says so), a batch
size that fails to run is named with onnxruntime's error, a model onnxruntime cannot load is named
while the others are measured; exit 0 / 1 / 2 for all / some / none measured (cli/bench_cmd.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxsmith.release.bench import BenchSettings, bench_models
from tests.conftest import assert_one_line_error
from tests.support.models import mlp

QUICK = ["--runs", "1", "--warmup", "0"]


def _reshape_to_one_row() -> onnx.ModelProto:
    """x[batch, 8] -> Reshape to a constant [1, 8]: runs at batch 1 only."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "one_row",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor("s", TensorProto.INT64, [2], [1, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _unknown_op() -> onnx.ModelProto:
    """A valid model (onnx.checker passes it) with an op onnxruntime has no kernel for."""
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


@pytest.fixture
def models(tmp_path) -> dict[str, Path]:
    protos = {
        "good": mlp(),  # x[batch, 8]
        "unnamed": mlp(batch=None),  # x[?, 8]: a batch dim without a name is still the batch
        "fixed": mlp(batch=2),  # x[2, 8]
        "one_row": _reshape_to_one_row(),
        "custom": _unknown_op(),
    }
    paths = {}
    for name, proto in protos.items():
        paths[name] = tmp_path / f"{name}.onnx"
        onnx.save(proto, paths[name])
    return paths


def test_a_mix_of_models_benchmarks_what_it_can_and_names_the_rest(models, tmp_path, cli):
    order = ["good", "custom", "fixed", "one_row", "unnamed"]
    out = tmp_path / "out"
    out.mkdir()
    result = cli(
        "bench",
        *(models[n] for n in order),
        "--batch",
        "1,4",
        *QUICK,
        "--json",
        out / "b.json",
        "--plot",
        out / "b.svg",
    )
    assert_one_line_error(result, "not benchmarked: custom.onnx (onnxruntime cannot load the model", code=1)
    error = result.stderr.strip()
    assert "one_row.onnx at batch 4 (onnxruntime failed to run it" in error and "Reshape" in error
    assert "fixed.onnx" not in error  # measured at its own batch: not a failure

    data = json.loads((out / "b.json").read_text())
    measured = {r["name"]: [b["batch"] for b in r["batches"]] for r in data["results"]}
    assert measured == {"good.onnx": [1, 4], "fixed.onnx": [2], "one_row.onnx": [1], "unnamed.onnx": [1, 4]}
    fixed = next(r for r in data["results"] if r["name"] == "fixed.onnx")
    assert fixed["note"] == "its inputs have a fixed batch of 2: measured at batch 2, not at 1, 4"
    one_row = next(r for r in data["results"] if r["name"] == "one_row.onnx")
    assert list(one_row["errors"]) == ["4"] and "Reshape" in one_row["errors"]["4"]
    assert [(f["name"], f["file"]) for f in data["failures"]] == [("custom.onnx", "custom.onnx")]
    assert "Frobnicate" in data["failures"][0]["reason"]
    assert all(b["median_ms"] > 0 for r in data["results"] for b in r["batches"])

    for line in (
        "fixed.onnx: its inputs have a fixed batch of 2: measured at batch 2, not at 1, 4",
        "one_row.onnx: batch 4 failed: onnxruntime failed to run it",
        "custom.onnx: not benchmarked: onnxruntime cannot load the model",
    ):
        assert line in result.stdout, result.stdout
    assert "latency vs batch" in (out / "b.svg").read_text()


def test_only_a_fixed_batch_is_a_complete_run(models, cli):
    result = cli("bench", models["fixed"], "--batch", "2", *QUICK)
    assert result.returncode == 0, result.stderr
    assert "fixed batch" not in result.stdout  # asked for what it takes: nothing to say
    result = cli("bench", models["fixed"], *QUICK)
    assert result.returncode == 0, result.stderr
    assert "fixed.onnx: its inputs have a fixed batch of 2: measured at batch 2, not at 1" in result.stdout


def test_when_nothing_can_be_benchmarked_it_is_exit_2_and_nothing_is_written(models, tmp_path, cli):
    result = cli("bench", models["custom"], *QUICK, "--json", tmp_path / "b.json")
    assert_one_line_error(result, "custom.onnx: onnxruntime cannot load the model", code=2)
    other = tmp_path / "other.onnx"
    other.write_bytes(models["custom"].read_bytes())
    result = cli("bench", models["custom"], other, *QUICK, "--json", tmp_path / "b.json")
    assert_one_line_error(
        result, "none of the 2 models could be benchmarked: custom.onnx (onnxruntime", "; other.onnx (", code=2
    )
    assert not (tmp_path / "b.json").exists()


def test_a_shape_a_model_cannot_take_is_that_models_failure(models, cli):
    """--shape is parsed once for every model; a model whose inputs it does not fit is named, the rest measured."""
    result = cli("bench", models["good"], models["one_row"], "--shape", "x:1,8", *QUICK)
    assert result.returncode == 0, result.stderr
    result = cli("bench", models["good"], models["custom"], "--shape", "x:1,9", *QUICK)
    assert_one_line_error(
        result, "none of the 2 models could be benchmarked", "dim 9 conflicts with the model's fixed 8"
    )
    assert_one_line_error(cli("bench", models["good"], "--shape", "x:1,a"), "--shape x:1,a: dims must be integers")


def test_the_library_call_returns_results_and_failures(models):
    run = bench_models(
        [("good", models["good"], {}), ("custom", models["custom"], {}), ("fixed", models["fixed"], {})],
        BenchSettings(batches=[3], runs=1, warmup=0),
    )
    assert [(r.name, [b.batch for b in r.batches], r.note) for r in run.results] == [
        ("good", [3], ""),
        ("fixed", [2], "its inputs have a fixed batch of 2: measured at batch 2, not at 3"),
    ]
    assert [f.name for f in run.failures] == ["custom"]
    assert run.shortfall().startswith("not benchmarked: custom (onnxruntime cannot load the model")


def test_a_build_benchmarks_a_fixed_batch_source_at_its_batch(tmp_path):
    """The build's bench feeds real samples: a fixed-batch model gets one sample, at its own batch."""
    from onnxsmith.release.build import build
    from onnxsmith.release.recipe import load_recipe
    from tests.support.release import recipe_text

    source = tmp_path / "fixed.onnx"
    onnx.save(mlp(batch=2), source)
    (tmp_path / "recipe.toml").write_text(
        recipe_text(
            source,
            '[[variants]]\nname = "small"\nsteps = [{ pass = "shrink" }]\n',
            validation='[validation]\ntask = "generic"\nsamples = 2\n',
            bench="[bench]\nbatch = [1, 3]\nruns = 1\nwarmup = 0",
        )
    )
    out = build(load_recipe(tmp_path / "recipe.toml"), tmp_path / "release").out
    bench = json.loads((out / "measurements.json").read_text())["bench"]
    assert [(r["name"], [b["batch"] for b in r["batches"]]) for r in bench["results"]] == [
        ("source", [2]),
        ("small", [2]),
    ]
    assert bench["failures"] == []
    card = (out / "README.md").read_text()
    assert "- small: its inputs have a fixed batch of 2: measured at batch 2, not at 1, 3" in card


def test_unsized_image_sides_get_the_sizes_the_transforms_pick(tmp_path, cli):
    """x[batch, 1, height, width] -> Reshape(-1, 640) runs at 320 x 320, not at 1 x 1 (issue 11 class 3):
    bench sizes it as the transforms do (runtime/sizing.py), at every batch size."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"])],
        "image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([-1, 640], np.int64), "target")],
    )
    path = tmp_path / "image.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    run = bench_models([("image", path, {})], BenchSettings(batches=[1, 2], runs=1, warmup=0))
    assert not run.failures, run.shortfall()
    assert [b.batch for b in run.results[0].batches] == [1, 2] and not run.results[0].errors
    result = cli("bench", path, *QUICK, "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    # What the user sized stays as given: 1 x 1 does not run, and that is said.
    result = cli("bench", path, *QUICK, "--shape", "height=1", "--shape", "width=1")
    assert_one_line_error(result, "image.onnx", code=2)
