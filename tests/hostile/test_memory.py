"""Memory: virtual and resident memory stay proportional to the model.

The issue's cases: ``fuse --precision fp16`` of a 43 MB diffusion U-Net needed 12.2 GB of address space
(``fp16`` 10.3 GB) because onnx-ir maps the whole .onnx file once per weight it reads (150 weights: 150
maps of 43 MB, per copy of the model a command loads); and measuring activation ranges instrumented every
tensor of a graph at once, which for a 100,000-node chain is a graph onnxruntime cannot hold in 8 GB.
Each command runs in a subprocess under an address-space limit (RLIMIT_AS) that the old code exceeded.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import LAZY_FILE_BYTES, load_model, release_weights
from onnxsmith.probes import ranges

GB = 1024**3


def _limited(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def _run(limit: int, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxsmith", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited(limit),
    )


def many_convs(path: Path, layers: int = 120, channels: int = 96, seed: int = 0) -> Path:
    """A stand-in for the U-Net: ``layers`` 3x3 Convs (+Relu) with moderate weights, ~40 MB in one file."""
    rng = np.random.default_rng(seed)
    nodes, weights, previous = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((channels, channels, 3, 3)) / (3 * np.sqrt(channels))).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [previous, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}" if i < layers - 1 else "y"], name=f"relu{i}"))
        previous = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def convs(tmp_path_factory) -> Path:
    path = many_convs(tmp_path_factory.mktemp("convs") / "convs.onnx")
    assert path.stat().st_size >= LAZY_FILE_BYTES  # read lazily, weights mapped from the file: the path
    return path


@pytest.mark.parametrize("command", [["fp16"], ["fuse", "--precision", "fp16"]])
def test_a_40_mb_model_converts_within_3_gb_of_address_space(convs, tmp_path, command):
    """Before: every weight read mapped the whole 40 MB file (120 weights: 4.8 GB per loaded copy)."""
    out = tmp_path / "out.onnx"
    result = _run(3 * GB, *command, convs, out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.stat().st_size > 0 and "Traceback" not in result.stderr


def test_a_weight_maps_only_its_own_bytes(convs):
    """What the limit above rests on: reading every weight maps about the file's size in all, not N times it."""
    model = load_model(convs)
    tensors = [v.const_value for v in model.graph.initializers.values()]
    mapped = 0
    for tensor in tensors:
        array = tensor.numpy()
        assert array.shape == tuple(tensor.shape.numpy())
        mapped += len(tensor.raw)
    file_bytes = convs.stat().st_size
    assert mapped < file_bytes + len(tensors) * 64 * 1024  # each window at most one granule more than its bytes
    expected = onnx.load(convs)
    for init in expected.graph.initializer[:3] + expected.graph.initializer[-3:]:
        np.testing.assert_array_equal(
            model.graph.initializers[init.name].const_value.numpy(), numpy_helper.to_array(init)
        )
        assert model.graph.initializers[init.name].const_value.tobytes() == init.raw_data
    del array
    release_weights(model)  # nothing (the run's feeds included) still holds a map


def chain(path: Path, nodes: int) -> Path:
    """A chain of ``nodes`` Add/Relu on a [1, 4] tensor: tiny tensors, many nodes."""
    made, previous = [], "x"
    for i in range(nodes):
        out = "y" if i == nodes - 1 else f"t{i}"
        made.append(
            helper.make_node("Add", [previous, "b"], [out])
            if i % 2 == 0
            else helper.make_node("Relu", [previous], [out])
        )
        previous = out
    graph = helper.make_graph(
        made,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.full([4], 0.5, np.float32), "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_ranges_are_measured_in_sessions_of_bounded_size_with_the_same_results(tmp_path, monkeypatch):
    """Instrumenting a long chain adds ~18 nodes per tensor; measured in groups, no session adds more nodes
    than the model has (or ranges.SESSION_ADDED_NODES), and the numbers are those of one big session."""
    path = chain(tmp_path / "chain.onnx", 600)
    feeds = [{"x": np.linspace(-2, 2, 4, dtype=np.float32)[None]}, {"x": np.full((1, 4), 3.0, np.float32)}]
    whole_outputs: dict = {}
    monkeypatch.setattr(ranges, "SESSION_ADDED_NODES", 10**9)
    whole = ranges.measure_ranges(path, feeds, outputs=whole_outputs, derive_movement=True)

    sizes: list[int] = []
    opened = ranges.runner.open_session

    def counting(model, **kwargs):
        sizes.append(len(model.graph))
        return opened(model, **kwargs)

    monkeypatch.setattr(ranges, "SESSION_ADDED_NODES", 2000)
    monkeypatch.setattr(ranges.runner, "open_session", counting)
    chunked_outputs: dict = {}
    chunked = ranges.measure_ranges(path, feeds, outputs=chunked_outputs, derive_movement=True)
    assert len(sizes) >= 5 and max(sizes) <= 600 + 3 + 2000
    assert chunked == whole and len(whole) == 601
    np.testing.assert_array_equal(chunked_outputs["y"], whole_outputs["y"])
