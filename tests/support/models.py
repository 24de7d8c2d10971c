"""Small models built in code for unit tests (the exporter-made fixtures live in tests/fixtures)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(hidden: int = 16, out: int = 4, seed: int = 0, opset: int = 17, batch="batch") -> onnx.ModelProto:
    """x[batch, 8] -> MatMul/Add/Relu -> MatMul/Add -> y[batch, out]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, hidden)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((hidden, out)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.standard_normal(out).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="mm1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="add1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["y0"], name="mm2"),
        helper.make_node("Add", ["y0", "b2"], ["y"], name="add2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def overflowing_fp16(scale: float = 1000.0) -> onnx.ModelProto:
    """An fp16 model whose intermediate overflows fp16 for |x| > 65.5 while its output stays finite in fp32.

    y = Softmax(Relu(x * scale) - 60000): for x = 100 the product is 1e5 (inf in fp16).
    """
    k = numpy_helper.from_array(np.array(scale, dtype=np.float16), "k")
    c = numpy_helper.from_array(np.array(60000.0, dtype=np.float16), "c")
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["a"], name="mul"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Sub", ["b", "c"], ["d"], name="sub"),
        helper.make_node("Softmax", ["d"], ["y"], name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4])],
        [k, c],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def with_if_subgraph() -> onnx.ModelProto:
    """y = If(sum(x) > 0) then x @ W1 else x @ W2 — weights inside the branches."""
    rng = np.random.default_rng(1)

    def branch(name, seed_w):
        w = numpy_helper.from_array(seed_w.astype(np.float32), f"{name}_w")
        node = helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"])
        return helper.make_graph(
            [node], name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)], [w]
        )

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"]),
        helper.make_node(
            "If",
            ["cond"],
            ["y"],
            then_branch=branch("then", rng.standard_normal((4, 3))),
            else_branch=branch("else", rng.standard_normal((4, 3))),
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "with_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tiny_detector(seed: int = 0, size: int = 16) -> onnx.ModelProto:
    """A YOLO-like head on a small conv stem: y[1, 7, size²] holds 4 box coordinates in pixels (0..320)
    beside 3 class scores (0..1) in one output, as detectors write them.

    x[1, 3, size, size] -> Conv(3->8, 3x3, w_stem) / Relu -> Conv(8->8, 3x3, w_mid, b_mid) / Relu ->
    box: Conv(8->4, 1x1) / Sigmoid * 320; score: Conv(8->3, 1x1, w_score, b_score) / Sigmoid -> Concat -> Reshape.
    """
    rng = np.random.default_rng(seed)

    def weight(name, *shape, scale=0.5):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        weight("w_stem", 8, 3, 3, 3),
        weight("b_stem", 8, scale=0.1),
        weight("w_mid", 8, 8, 3, 3, scale=0.25),
        weight("b_mid", 8, scale=0.1),
        weight("w_box", 4, 8, 1, 1),
        weight("b_box", 4, scale=0.1),
        weight("w_score", 3, 8, 1, 1),
        numpy_helper.from_array(np.array([-3.0, -2.5, -4.0], np.float32), "b_score"),
        numpy_helper.from_array(np.array(320.0, np.float32), "pixels"),
        numpy_helper.from_array(np.array([1, 7, size * size], np.int64), "flat"),
    ]
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["x", "w_stem", "b_stem"], ["s0"], pads=pads, name="stem"),
        helper.make_node("Relu", ["s0"], ["s1"], name="stem_relu"),
        helper.make_node("Conv", ["s1", "w_mid", "b_mid"], ["m0"], pads=pads, name="mid"),
        helper.make_node("Relu", ["m0"], ["m1"], name="mid_relu"),
        helper.make_node("Conv", ["m1", "w_box", "b_box"], ["bx0"], name="box"),
        helper.make_node("Sigmoid", ["bx0"], ["bx1"], name="box_sigmoid"),
        helper.make_node("Mul", ["bx1", "pixels"], ["bx2"], name="box_pixels"),
        helper.make_node("Conv", ["m1", "w_score", "b_score"], ["sc0"], name="score"),
        helper.make_node("Sigmoid", ["sc0"], ["sc1"], name="score_sigmoid"),
        helper.make_node("Concat", ["bx2", "sc1"], ["cat"], axis=1, name="concat"),
        helper.make_node("Reshape", ["cat", "flat"], ["y"], name="flatten"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, size * size])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def int8_dequantised_mlp(hidden: int = 256, seed: int = 0) -> onnx.ModelProto:
    """x @ (Cast(W_int8) * scale) + b, the way dynamo exports a weight-only int8 Linear (MiniLM int8).

    The weight's Reshape target comes from Shape arithmetic, so fold passes have shape work to do too.
    """
    rng = np.random.default_rng(seed)
    weight = rng.integers(-127, 128, (hidden, hidden), dtype=np.int8)
    inits = [
        numpy_helper.from_array(weight, "w_q"),
        numpy_helper.from_array((rng.random((1, hidden)) * 0.01).astype(np.float32), "w_scale"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([hidden], np.int64), "width"),
    ]
    nodes = [
        helper.make_node("Cast", ["w_q"], ["w_f"], to=TensorProto.FLOAT, name="w_cast"),
        helper.make_node("Mul", ["w_f", "w_scale"], ["w"], name="w_mul"),
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        helper.make_node("Slice", ["x_shape", "zero", "one"], ["batch"], name="batch"),
        helper.make_node("Concat", ["batch", "width"], ["target"], axis=0, name="target"),
        helper.make_node("Reshape", ["x", "target"], ["x2"], name="flatten"),
        helper.make_node("MatMul", ["x2", "w"], ["xw"], name="matmul"),
        helper.make_node("Add", ["xw", "b"], ["y"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "int8_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", hidden])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def shared_weight_read_through_copies(
    hidden: int = 256, seed: int = 0, *, copies: tuple[str, ...] = ("identity", "transpose"), tokens: int | None = None
) -> onnx.ModelProto:
    """One weight read by a chain of layers: the first directly, each further one as ``copies`` says ("direct",
    "identity", "transpose"; rxnmap's shared blocks: TorchScript writes an Identity per reuse). ``tokens``: the
    input is [1, tokens, hidden] (rows for int8's calibration) instead of [batch, hidden]."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((0.05 * rng.standard_normal((hidden, hidden))).astype(np.float32), "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h1"], name="layer1")]
    for i, copy in enumerate(copies, start=2):
        seen = copies[: i - 2].count(copy)  # the first copy of a kind is w_again / w_t, later ones numbered
        suffix = f"{seen + 1}" if seen else ""
        weight = "w" if copy == "direct" else {"identity": "w_again", "transpose": "w_t"}[copy] + suffix
        if copy == "identity":
            nodes.append(helper.make_node("Identity", ["w"], [weight], name="identity" + suffix))
        elif copy == "transpose":
            nodes.append(helper.make_node("Transpose", ["w"], [weight], perm=[1, 0], name="transpose" + suffix))
        last = i == len(copies) + 1
        nodes.append(helper.make_node("MatMul", [f"h{i - 1}", weight], ["y" if last else f"h{i}"], name=f"layer{i}"))
    shape = ["batch", hidden] if tokens is None else [1, tokens, hidden]
    graph = helper.make_graph(
        nodes,
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def masked_frontend(hop: int = 160, features: int = 16, seed: int = 0) -> onnx.ModelProto:
    """An audio front end as NeMo's log-mel exports it, cut to its hazard: ``waveforms`` [batch, time] framed by
    ``hop`` and projected to ``features``, frames at or past ``waveforms_lens // hop`` set to 0 (a length of 0
    masks every frame). Outputs ``features`` [batch, frames, features] and ``features_lens`` [batch]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((hop, features)) / hop**0.5).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([0, -1, hop], np.int64), "frame_shape"),
        numpy_helper.from_array(np.array(hop, np.int64), "hop"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
        numpy_helper.from_array(np.array(0.0, np.float32), "fzero"),
    ]
    nodes = [
        helper.make_node("Reshape", ["waveforms", "frame_shape"], ["frames"], name="frame"),
        helper.make_node("MatMul", ["frames", "w"], ["projected"], name="project"),
        helper.make_node("Shape", ["frames"], ["frames_shape"], start=1, end=2, name="count_shape"),
        helper.make_node("Squeeze", ["frames_shape"], ["count"], name="count"),
        helper.make_node("Range", ["zero", "count", "one"], ["index"], name="index"),
        helper.make_node("Div", ["waveforms_lens", "hop"], ["features_lens"], name="frames_valid"),
        helper.make_node("Unsqueeze", ["features_lens", "axis1"], ["valid_column"], name="valid_column"),
        helper.make_node("Less", ["index", "valid_column"], ["valid"], name="valid"),
        helper.make_node("Unsqueeze", ["valid", "axis2"], ["valid3"], name="valid3"),
        helper.make_node("Where", ["valid3", "projected", "fzero"], ["features"], name="mask"),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_frontend",
        [
            helper.make_tensor_value_info("waveforms", TensorProto.FLOAT, ["batch", "time"]),
            helper.make_tensor_value_info("waveforms_lens", TensorProto.INT64, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "frames", features]),
            helper.make_tensor_value_info("features_lens", TensorProto.INT64, ["batch"]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
