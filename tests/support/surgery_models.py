"""Models for the graph-surgery tests (extract, shrink and its passes), built in code."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _i64(values, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def hitnet_bloat(
    depth: int = 8, height: int = 16, width: int = 32, tile1: int = 3, tile2: int = 2, opset: int = 18
) -> onnx.ModelProto:
    """HITNet's bloat in miniature: an index grid made by Range -> Expand -> Tile -> Tile feeds
    GatherElements over a cost volume ``cost[1, H, W, D]`` (disparities last).

    Every node of the grid reads constants only, so constant folding stores the grid:
    ``H * W * D * tile1 * tile2`` int64 values. Outputs: the max over the gathered
    costs (float) and the first 64 grid values (int64, which must stay bit-identical).
    """
    inits = [
        _i64(0, "start"),
        _i64(depth, "limit"),
        _i64(1, "delta"),
        _i64([1, 1, 1, depth], "grid_shape"),
        _i64([1, height, width, depth], "expand_shape"),
        _i64([1, 1, 1, tile1], "reps1"),
        _i64([1, 1, 1, tile2], "reps2"),
        _i64([-1], "axes"),
        _i64([0, 0, 0, 0], "head_start"),
        _i64([1, 1, 1, 64], "head_end"),
    ]
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["disparities"], name="range"),
        helper.make_node("Reshape", ["disparities", "grid_shape"], ["disparities4"], name="reshape"),
        helper.make_node("Expand", ["disparities4", "expand_shape"], ["grid"], name="expand"),
        helper.make_node("Tile", ["grid", "reps1"], ["grid_tiled"], name="tile1"),
        helper.make_node("Tile", ["grid_tiled", "reps2"], ["index"], name="tile2"),
        helper.make_node("GatherElements", ["cost", "index"], ["gathered"], name="gather", axis=3),
        helper.make_node("ReduceMax", ["gathered", "axes"], ["cost_max"], name="reduce", keepdims=1),
        helper.make_node("Slice", ["index", "head_start", "head_end"], ["index_head"], name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "hitnet_bloat",
        [helper.make_tensor_value_info("cost", TensorProto.FLOAT, [1, height, width, depth])],
        [
            helper.make_tensor_value_info("cost_max", TensorProto.FLOAT, [1, height, width, 1]),
            helper.make_tensor_value_info("index_head", TensorProto.INT64, [1, 1, 1, min(64, depth * tile1 * tile2)]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def hitnet_bloat_elements(depth: int = 8, height: int = 16, width: int = 32, tile1: int = 3, tile2: int = 2) -> int:
    """How many int64 values constant folding would store for :func:`hitnet_bloat`."""
    return depth * height * width * tile1 * tile2


def folded_index(rows: int = 64, cols: int = 4096, seed: int = 0) -> onnx.ModelProto:
    """What a simplifier leaves behind: a stored int64 index constant read by GatherElements."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, cols, size=(rows, cols), dtype=np.int64)
    graph = helper.make_graph(
        [helper.make_node("GatherElements", ["x", "index"], ["y"], name="gather", axis=1)],
        "folded_index",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
        [numpy_helper.from_array(index, "index")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def chain(opset: int = 17) -> onnx.ModelProto:
    """x -> a (Relu) -> b (Mul w) -> c (Add d) -> y (Tanh), where d = Sigmoid(s) from a second input.

    A side output z = x @ Slice(unused_weight) is listed before the Slice that feeds it (node order
    not topological, as some exporters write it). Extract tests cut at a, b, c, d.
    """
    w = numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8), "w")
    unused = numpy_helper.from_array(np.ones((64, 64), np.float32), "unused_weight")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Mul", ["a", "w"], ["b"], name="mul"),
        helper.make_node("Sigmoid", ["s"], ["d"], name="sigmoid"),
        helper.make_node("Add", ["b", "d"], ["c"], name="add"),
        helper.make_node("Tanh", ["c"], ["y"], name="tanh"),
        helper.make_node("MatMul", ["x", "unused_weight_slice"], ["z"], name="side"),
        helper.make_node("Slice", ["unused_weight", "zero1", "eight1"], ["unused_weight_slice"], name="slice"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch", 8]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 64]),
        ],
        [w, unused, _i64([0], "zero1"), _i64([8], "eight1")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def write_big_external(
    path: Path, rows1: int = 24576, rows2: int = 8192, cols: int = 16800, written_rows: int = 64
) -> int:
    """A > 2 GB model with external data (two fp32 tables, 1.65 GB and 0.55 GB), written straight from numpy.

    ids[1, 4] -> Gather(W1) -> Relu = h -> ArgMax % rows2 -> Gather(W2) -> * 0.5 (an fp64 constant
    Cast to float) -> + h = y. W2 is written in full; W1 only in its first ``written_rows`` rows,
    the rest is a hole in a sparse file (zeros to every reader, no disk): feed ids below
    ``written_rows`` to read real values. Returns the size of the data file.
    """
    path = Path(path)
    data_name = path.name + ".data"
    w1_bytes, w2_bytes = rows1 * cols * 4, rows2 * cols * 4
    column = np.arange(cols, dtype=np.float32)[None, :] * np.float32(1e-4)
    with open(path.with_name(data_name), "wb") as f:
        f.write((np.arange(written_rows, dtype=np.float32)[:, None] * np.float32(1e-3) + column).tobytes())
        f.truncate(w1_bytes)  # the rest of W1: a hole
        f.seek(w1_bytes)
        block_rows = 512
        for start in range(0, rows2, block_rows):
            rows = np.arange(start, start + block_rows, dtype=np.float32)[:, None] * np.float32(2e-3)
            f.write((rows + column).tobytes())

    def external(name: str, rows: int, offset: int) -> onnx.TensorProto:
        tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[rows, cols])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(rows * cols * 4))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    nodes = [
        helper.make_node("Gather", ["W1", "ids"], ["e"], name="embed"),
        helper.make_node("Relu", ["e"], ["h"], name="relu"),
        helper.make_node("ArgMax", ["h"], ["best"], name="argmax", axis=-1, keepdims=0),
        helper.make_node("Mod", ["best", "rows"], ["row"], name="mod"),
        helper.make_node("Gather", ["W2", "row"], ["e2"], name="embed2"),
        helper.make_node("Cast", ["scale64"], ["scale"], name="scale_cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["e2", "scale"], ["e2s"], name="scale_mul"),
        helper.make_node("Add", ["e2s", "h"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, cols])],
        [
            external("W1", rows1, 0),
            external("W2", rows2, w1_bytes),
            _i64(rows2, "rows"),
            numpy_helper.from_array(np.array(0.5, np.float64), "scale64"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), os.fspath(path))
    return w1_bytes + w2_bytes


def data_dependent_shape() -> onnx.ModelProto:
    """t = If(sum(x) > -1e9, Concat(x, x) [2, 8], x [2, 4]): static inference knows t's rank, not its width.

    y = Relu(t) * 2. A cut at t must be typed by running the model.
    """
    then_graph = helper.make_graph(
        [helper.make_node("Concat", ["x", "x"], ["wide"], axis=1)],
        "then",
        [],
        [helper.make_tensor_value_info("wide", TensorProto.FLOAT, [2, 8])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["narrow"])],
        "else",
        [],
        [helper.make_tensor_value_info("narrow", TensorProto.FLOAT, [2, 4])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["total", "floor"], ["cond"], name="greater"),
        helper.make_node("If", ["cond"], ["t"], then_branch=then_graph, else_branch=else_graph, name="branch"),
        helper.make_node("Relu", ["t"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "two"], ["y"], name="double"),
    ]
    graph = helper.make_graph(
        nodes,
        "data_dependent",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array(-1e9, np.float32), "floor"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
