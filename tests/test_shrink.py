"""`onnxsmith shrink`: guarded folding, int64 -> int32 at the producer, fp64 -> fp32, dedup; verified."""

from __future__ import annotations

import fcntl
import json
import resource
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import onnxsmith
from onnxsmith.cli.transform_cmd import print_variant
from onnxsmith.core import options as opts
from onnxsmith.core.errors import UsageError
from onnxsmith.io.load import load_model
from onnxsmith.release.variant import produce_variant
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.settings.shrink import parse_bytes
from onnxsmith.transforms.shrink import Shrink
from tests.support.corpus import plausible_feeds
from tests.support.realmodels import MODELS, real_model
from tests.support.surgery_models import hitnet_bloat, hitnet_bloat_elements


def _shrink(source, output, samples: int = 2, **options):
    model = load_model(source)
    feeds = [random_inputs(model, seed=i) for i in range(samples)]
    return produce_variant(source, output, [("shrink", opts.build(Shrink.Options, options))], feeds=feeds)


def _initializers(path) -> dict[str, tuple[int, int]]:
    """name -> (onnx dtype, bytes)."""
    return {t.name: (t.data_type, len(t.raw_data)) for t in onnx.load(path).graph.initializer}


def test_explain_says_what_changed_and_why(cli, save_proto, tmp_path):
    # Expand makes a 2 MB int64 grid from a few bytes (over the 4 KB limit); the Tiles make 12 MB of indices at run time.
    source = save_proto(hitnet_bloat(height=128, width=256, tile1=3, tile2=2), "grid.onnx")
    out = tmp_path / "small.onnx"
    result = cli("shrink", source, out, "--explain", "--report", tmp_path / "report.json")
    assert result.returncode == 0, result.stderr
    for needle in (
        "kept computed",
        "expand (Expand)",
        "computed from 96 bytes of constants: +2097056 bytes, over the 4096-byte limit",
        "int64 -> int32",
        "values in 0..7: static bounds",
        "stored bytes by dtype",
        "nodes by op (changed)",
        "largest stored tensors after",
    ):
        assert needle in result.stdout, needle
    report = json.loads((tmp_path / "report.json").read_text())
    outputs = {o["name"]: o for o in report["verification"]["outputs"]}
    assert outputs["index_head"]["dtype"] == "int64" and outputs["index_head"]["max_abs"] == 0  # exact
    assert outputs["cost_max"]["max_abs"] == 0 and report["verification"]["passed"]
    model = onnx.shape_inference.infer_shapes(onnx.load(out))  # inferred shapes are not written (never grow)
    gather = next(n for n in model.graph.node if n.op_type == "GatherElements")
    index = next(v for v in model.graph.value_info if v.name == gather.input[1])
    assert index.type.tensor_type.elem_type == TensorProto.INT32  # the indices are made int32


def test_same_source_same_bytes_and_the_growth_option(save_proto, tmp_path, capsys):
    source = save_proto(hitnet_bloat(height=128, width=256, tile1=3, tile2=2), "grid.onnx")
    with onnxsmith.shrink(source) as variant:
        variant.save(tmp_path / "a.onnx")
    print_variant(variant)
    assert "kept computed" not in capsys.readouterr().out  # the details are for --explain only
    print_variant(variant, explain=True)
    assert "kept computed" in capsys.readouterr().out
    first = variant.files[0]
    second = _shrink(source, tmp_path / "b.onnx").files[0]
    assert first.sha256 == second.sha256
    assert first.bytes < 4096  # the grid stays computed
    # Allowed to grow by 64 MB, folding stores the grid; it is then stored as int32 (by value).
    grown = _shrink(source, tmp_path / "grown.onnx", max_fold_growth="64MB")
    stored = _initializers(grown.files[0].path)
    grid_elements = hitnet_bloat_elements(height=128, width=256, tile1=3, tile2=2)
    assert max(stored.values(), key=lambda t: t[1]) == (TensorProto.INT32, grid_elements * 4)
    assert grown.comparison.passed


def test_bad_options(save_proto):
    assert parse_bytes("1MB") == 2**20 and parse_bytes("512kb") == 512 * 1024 and parse_bytes("0") == 0
    with pytest.raises(UsageError, match="'lots' is not a size"):
        opts.build(Shrink.Options, {"max_fold_growth": "lots"})


@pytest.mark.realmodel
def test_real_model_passes_the_gate(tmp_path):
    """PP-OCRv4 (weights in Constant nodes): duplicates merge, everything else computes the same."""
    result = _shrink(real_model("ppocr_rec"), tmp_path / "ppocr.onnx", samples=1)
    [report] = result.reports
    assert any("merged" in note for note in report.notes)
    assert result.comparison.passed and result.nodes_after < result.nodes_before


# -- HITNet's bloat at full size ------------------------------------------------------------------

#: onnxslim folds the grid in memory; without a cap it needs ~11 GB. Its child gets this much.
_SIMPLIFIER_ADDRESS_SPACE = 6 * 2**30


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (_SIMPLIFIER_ADDRESS_SPACE, _SIMPLIFIER_ADDRESS_SPACE))


@pytest.fixture
def heavy():
    """The machine is shared: one memory-heavy job at a time (see the team notes)."""
    with open("/tmp/onnxsmith-heavy.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _written_bytes(path) -> int:
    data = path.with_name(path.name + ".data")
    return sum(p.stat().st_size for p in (path, data) if p.exists())


@pytest.mark.slow
def test_hitnet_bloat_full_size(cli, save_proto, tmp_path, heavy):
    """720x1280-class HITNet: naive folding stores a 2.2 GB int64 grid; shrink keeps it computed, as int32."""
    shape = dict(depth=8, height=256, width=512, tile1=33, tile2=8)
    assert hitnet_bloat_elements(**shape) * 8 > 2**31  # what folding would store: past protobuf's limit
    source = save_proto(hitnet_bloat(**shape), "hitnet.onnx")

    slim_out = tmp_path / "slim.onnx"
    slim = subprocess.run(
        [sys.executable, "-m", "onnxslim", str(source), str(slim_out)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_memory,
    )
    assert slim.returncode != 0 or _written_bytes(slim_out) > 2**31, (slim.returncode, _written_bytes(slim_out))
    for leftover in tmp_path.glob("slim.onnx*"):
        leftover.unlink()

    out = tmp_path / "hitnet_shrunk.onnx"
    result = cli("shrink", source, out, "--samples", "1", "--explain", "--report", tmp_path / "report.json")
    assert result.returncode == 0, result.stderr
    assert _written_bytes(out) < 2**30
    # --explain reuses inspect's analysis: the chain that would have bloated the file, then at half the size.
    assert "node 'tile2' (Tile) builds a 2112 MB INT64 tensor" in result.stdout
    assert "node 'tile2' (Tile) builds a 1056 MB INT32 tensor" in result.stdout
    onnx.checker.check_model(onnx.load(out), full_check=True)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verification"]["passed"]
    assert all(o["max_abs"] == 0 for o in report["verification"]["outputs"])  # identical outputs
    model = onnx.shape_inference.infer_shapes(onnx.load(out))  # inferred shapes are not written (never grow)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    gather = next(n for n in model.graph.node if n.op_type == "GatherElements")
    assert types[gather.input[1]] == TensorProto.INT32  # 1.1 GB of indices at run time instead of 2.2
    assert np.prod([d.dim_value for d in model.graph.output[1].type.tensor_type.shape.dim]) == 64


def _model_bytes(path) -> int:
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + ".data")) if p.exists())


@pytest.mark.realmodel
def test_int8_weights_stay_int8(tmp_path):
    """MiniLM with int8 weights (dequantised at run time): folding the dequantisation made it 1.49x."""
    source = real_model("minilm_int8")
    result = _shrink(source, tmp_path / "int8.onnx", samples=1)
    assert result.comparison.passed
    assert _model_bytes(tmp_path / "int8.onnx") <= _model_bytes(source)
    stored = _initializers(tmp_path / "int8.onnx")
    assert stored["inner.embeddings.word_embeddings.weight_q"] == (TensorProto.INT8, 30522 * 384)
    assert "would have stored" in result.reports[0].notes[0]  # says what stays computed


@pytest.mark.realmodel
def test_silero_vad_with_real_inputs_gets_smaller(tmp_path):
    """Folding its If branches copied the LSTM weights both branches read: 2.3 -> 3.2 MB."""
    source = real_model("silero_vad")
    feeds = [plausible_feeds(MODELS["silero_vad"].feeds)]  # sr=16000, 512 samples
    result = produce_variant(source, tmp_path / "vad.onnx", [("shrink", Shrink.Options())], feeds=feeds)
    assert result.comparison.passed
    assert _model_bytes(tmp_path / "vad.onnx") < _model_bytes(source)


@pytest.mark.realmodel
def test_a_model_with_nothing_to_shrink_does_not_grow(tmp_path):
    """magika: no foldable constants; inferred shapes (10 KB of value_info) are not written."""
    source = real_model("magika")
    _shrink(source, tmp_path / "magika.onnx", samples=1)
    model = onnx.load(tmp_path / "magika.onnx")
    assert len(model.graph.value_info) == 0
    # Only the provenance stamp is added (a few hundred bytes).
    assert _model_bytes(tmp_path / "magika.onnx") <= _model_bytes(source) + 512
