"""The commands around a release: validate, predict, bench.

Each command runs once as a user runs it (``python -m onnxsmith``); the other cases call
the same entry point in-process (``main(argv)``), which is cheaper than a new interpreter.
"""

from __future__ import annotations

import json

import onnx
import pytest

from onnxsmith.cli.main import main
from tests.support.release import EXAMPLE, REPO, face_images, save_toy_faceage, toy_faceage, wider_annotations


@pytest.fixture
def run(capsys):
    """``onnxsmith ARGS`` in-process: (exit status, stdout, stderr)."""

    def call(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


@pytest.fixture
def toy(tmp_path):
    source = save_toy_faceage(tmp_path / "toy.onnx")
    shifted = toy_faceage()
    bias = next(t for t in shifted.graph.initializer if t.name == "b_age")
    bias.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(bias) + 0.05, "b_age"))
    onnx.save(shifted, tmp_path / "shifted.onnx")
    images = face_images(tmp_path / "images", count=3)
    (tmp_path / "images" / "boxes.txt").write_text(wider_annotations([(n, [b]) for n, b in images]))
    return tmp_path, source, tmp_path / "shifted.onnx"


def test_validate_prints_metrics_writes_json_and_gates(toy, cli, run):
    run_main = run
    tmp_path, source, shifted = toy
    data = ["--task", "faceage", "--data", tmp_path / "images", "--boxes", tmp_path / "images" / "boxes.txt"]
    ok = cli("validate", source, shifted, *data, "--json", tmp_path / "v.json", "--details")
    assert ok.returncode == 0, ok.stderr
    assert "max |Δage|" in ok.stdout and "3/3" in ok.stdout and "all gates hold" in ok.stdout
    assert "face2.png#0" in ok.stdout  # --details: one row per sample
    report = json.loads((tmp_path / "v.json").read_text())
    max_error = next(m for m in report["metrics"] if m["name"] == "max_abs_age_error")
    assert report["passed"] and report["samples"] == 3 and 0 < max_error["value"] < 0.5

    code, out, _ = run_main("validate", source, shifted, *data, "--gate", f"max_abs_age_error={max_error['value'] / 2}")
    assert code == 1
    assert "gate failed: max |Δage|" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "generic", "--boxes", "boxes.txt"], "--boxes is not an option of task 'generic'"),
        (["--task", "faceage", "--data", "images", "--gate", "max_age=1"], "task 'faceage' has no metric 'max_age'"),
        (["--task", "faceage", "--data", "images", "--gate", "max_abs_age_error"], "expected METRIC=NUMBER"),
        (["--task", "faceage", "--data", "images", "--min-face", "big"], "--min-face expects int, got 'big'"),
        (["--task", "faceage", "--data", "images", "--padding", "2"], "padding must be between 0 and 1"),
    ],
)
def test_validate_usage_errors(toy, run, args, message):
    _tmp_path, source, shifted = toy
    code, _, err = run("validate", source, shifted, *args)
    assert code == 2 and err.startswith("onnxsmith: error: ") and message in err


def test_predict_a_face_by_hand(toy, cli, run):
    _tmp_path, source, _ = toy
    image = EXAMPLE / "images" / "astronaut.png"
    text = cli("predict", "--task", "faceage", source, image, "--box", "180,70,95,94")
    assert text.returncode == 0, text.stderr
    code, out, _ = run("predict", "--task", "faceage", source, image, "--box", "180,70,95,94", "--json")
    prediction = json.loads(out)
    assert 0 < prediction["age"] < 100 and prediction["gender"] in ("female", "male")
    assert f"age {prediction['age']:.1f} years, {prediction['gender']}" in text.stdout
    moved = json.loads(run("predict", "--task", "faceage", source, image, "--box", "0,0,95,94", "--json")[1])
    assert moved["age"] != prediction["age"]  # a different crop, a different answer
    code, _, err = run("predict", "--task", "faceage", source, image, "--box", "1,2,3")
    assert code == 2 and "expected X,Y,W,H" in err


def test_bench_side_by_side_with_json_and_plot(toy, cli, run):
    tmp_path, source, shifted = toy
    result = cli(
        "bench",
        source,
        shifted,
        "--batch",
        "1,3",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--json",
        tmp_path / "bench.json",
        "--plot",
        tmp_path / "bench.svg",
    )
    assert result.returncode == 0, result.stderr
    assert "toy.onnx" in result.stdout and "shifted.onnx" in result.stdout
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [r["name"] for r in data["results"]] == ["toy.onnx", "shifted.onnx"]
    for r in data["results"]:
        assert [b["batch"] for b in r["batches"]] == [1, 3]
        assert all(0 < b["median_ms"] <= b["p90_ms"] and b["runs"] == 3 for b in r["batches"])
        assert r["load_ms"] > 0 and r["peak_rss_bytes"] > r["rss_before_load_bytes"] > 0
    svg = (tmp_path / "bench.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "latency vs batch" in svg and "<dc:date>" not in svg
    code, _, err = run("bench", source, "--provider", "cuda")
    assert code == 2 and "no CUDAExecutionProvider" in err


def test_validate_a_language_model_on_held_out_text(tmp_path, cli, run):
    source = REPO / "tests" / "fixtures" / "gpt2" / "onnx" / "model.onnx"
    text = REPO / "examples" / "gpt2-web" / "heldout.txt"
    args = ["--task", "lm", "--text", text, "--window", "32", "--max-windows", "3", "--json", tmp_path / "lm.json"]
    result = cli("validate", source, source, *args)
    assert result.returncode == 0, result.stderr
    assert "3 window(s) of held-out text from heldout.txt (96 tokens)" in " ".join(result.stdout.split())
    metrics = {m["name"]: m for m in json.loads((tmp_path / "lm.json").read_text())["metrics"]}
    assert metrics["kl"]["value"] == pytest.approx(0, abs=1e-9) and metrics["top1"]["value"] == 1.0
    assert metrics["loss"]["value"] > 0 and metrics["kl"]["gate"] == 0.1  # the default gates
    code, out, _ = run("validate", source, source, *args[:-2], "--gate", f"loss={metrics['loss']['value'] / 2}")
    assert code == 1 and "gate failed: loss" in out


def test_the_web_lm_example_recipe_is_valid():
    from onnxsmith.release.recipe import load_recipe

    recipe = load_recipe(REPO / "examples" / "gpt2-web" / "recipe.toml")
    assert [v.file for v in recipe.variants] == ["onnx/model_q4.onnx", "onnx/model_quantized.onnx"]
    assert [p.name for p in recipe.include] == [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert recipe.validation.task.name == "lm" and recipe.validation.gates == {"kl": 0.1, "top1": 0.85}


def test_bench_measures_each_model_in_its_own_memory(toy):
    """The benchmark process's peak RSS is its own, not the peak of the process that started it."""
    import numpy as np

    from onnxsmith.release.bench import BenchSettings, bench_models

    _, source, _ = toy
    ballast = np.ones(400 * 2**20, dtype=np.uint8)  # this process: 400 MiB more resident
    (result,) = bench_models([("toy", source, {})], BenchSettings(batches=[1], runs=1, warmup=0)).results
    assert ballast.sum() == ballast.size
    assert 0 < result.rss_before_load_bytes < result.peak_rss_bytes < 400 * 2**20
