"""Rotary position embedding on a slice of the tokens -> one com.microsoft RotaryEmbedding over all of them.

Vision transformers with 2-D RoPE (DINOv3, EVA) rotate q and k of the patch
tokens only; the prefix tokens (CLS, registers) pass through::

    prefix, body = x[..., :P, :], x[..., P:, :]            (two Slices or a Split)
    rotated = Concat(-body[..., h:], body[..., :h])         (rotate_half, h = d/2)
    x' = Concat(prefix, body * cos + rotated * sin)         (tokens axis)

RotaryEmbedding (non-interleaved) computes exactly ``x * cos + rotate_half(x) *
sin`` with ``cos = [c, c]`` per row, so the whole block becomes one operator
when the cache gets P rows of cos 1, sin 0 in front: those tokens are rotated
by a zero angle. The tables are taken from the graph: a constant, or ``Cos`` /
``Sin`` of a constant angle table, evaluated in float64 and stored in x's
dtype. A rope over all tokens (no prefix) is the case P = 0.

Input layout [batch, heads, tokens, head_dim]; position_ids is the scalar 0
(token t reads cache row t).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from onnxsmith.irutil.walk import constant
from onnxsmith.rules.weights import WeightAddingRule


class PrefixRotary(WeightAddingRule):
    """``split``: how the prefix is cut off: "split" (one Split), "slices" (two Slices) or "none" (P = 0)."""

    def __init__(self, name: str, *, split: str) -> None:
        super().__init__(name)
        self._split = split

    def setup(self):
        super().setup()
        self._caches: dict[tuple, tuple[ir.Value, ir.Value, ir.Value]] = {}

    def pattern(self, op, x, cos, sin):
        if self._split == "split":
            prefix, body = op.Split(x, _allow_other_inputs=True, _outputs=["prefix", "body"])
        elif self._split == "slices":
            prefix = op.Slice(x, _allow_other_inputs=True, _outputs=["prefix"])
            body = op.Slice(x, _allow_other_inputs=True, _outputs=["body"])
        else:
            prefix, body = None, x
        first = op.Slice(body, _allow_other_inputs=True, _outputs=["first_half"])
        second = op.Slice(body, _allow_other_inputs=True, _outputs=["second_half"])
        rotated = op.Concat(op.Neg(second), first, _outputs=["rotated"])
        roped = op.Add(op.Mul(body, cos), op.Mul(rotated, sin))
        if prefix is None:
            return roped
        return op.Concat(prefix, roped, _outputs=["joined"])

    def check(
        self, context, x, cos, sin, first_half, second_half, rotated, prefix=None, body=None, joined=None, **_
    ) -> MatchResult:
        result = MatchResult()
        if x.shape is None or x.shape.rank() != 4 or not all(isinstance(d, int) for d in x.shape[2:]):
            return result.fail(
                f"x is not [batch, heads, tokens, head_dim] with static tokens and head_dim: {x.shape}", x
            )
        if x.dtype is None or not x.dtype.is_floating_point():
            return result.fail("x is not a float tensor", x)
        tokens, dim = x.shape[2], x.shape[3]
        if dim % 2:
            return result.fail(f"head_dim {dim} is odd", x)
        half = dim // 2
        prefix_len = 0
        if self._split != "none":
            ranges = _prefix_split(prefix, body, tokens)
            if ranges is None:
                return result.fail("the prefix/body cut is not [0:P] and [P:] on the tokens axis", prefix)
            prefix_len = ranges
            if _axis(joined.producer(), 4) != 2:
                return result.fail("prefix and body are not joined on the tokens axis", joined)
        if _slice_range(first_half.producer(), dim) != (3, 0, half):
            return result.fail("the first half is not [..., :head_dim/2]", first_half)
        if _slice_range(second_half.producer(), dim) != (3, half, dim):
            return result.fail("the second half is not [..., head_dim/2:]", second_half)
        if _axis(rotated.producer(), 4) != 3:
            return result.fail("rotate_half is not joined on the last axis", rotated)
        body_len = tokens - prefix_len
        tables = []
        for value, fn, label in ((cos, np.cos, "cos"), (sin, np.sin, "sin")):
            table = _trig_table(value, fn, body_len, dim)
            if table is None:
                return result.fail(
                    f"{label} is not a constant [{body_len}, {dim}] table (or {label.title()} of one)", value
                )
            if not np.allclose(table[:, :half], table[:, half:], rtol=0, atol=1e-6):
                return result.fail(f"{label} differs between the two halves (an interleaved or partial rope)", value)
            tables.append(table[:, :half])
        self.remember_graph(context)
        self._tables = (tables[0], tables[1], prefix_len)
        return result

    def rewrite(self, op, x, cos, sin, **_):
        cos_half, sin_half, prefix_len = self._tables
        key = (cos, sin, prefix_len, x.dtype)
        if key not in self._caches:
            dtype = x.dtype.numpy()
            half = cos_half.shape[1]
            cos_cache = np.concatenate([np.ones((prefix_len, half)), cos_half]).astype(dtype)
            sin_cache = np.concatenate([np.zeros((prefix_len, half)), sin_half]).astype(dtype)
            self._caches[key] = (
                self.new_weight(op, np.array(0, np.int64), "rotary_position_start"),
                self.new_weight(op, cos_cache, f"{cos.name}/rotary_cos_cache"),
                self.new_weight(op, sin_cache, f"{sin.name}/rotary_sin_cache"),
            )
        position, cos_cache, sin_cache = self._caches[key]
        return op.RotaryEmbedding(x, position, cos_cache, sin_cache, interleaved=0, _domain="com.microsoft")


def _axis(node: ir.Node, rank: int) -> int | None:
    axis = node.attributes.get_int("axis", 0)
    return axis + rank if axis < 0 else axis


def _slice_range(node: ir.Node, length: int) -> tuple[int, int, int] | None:
    """(axis, start, end) of a Slice of a rank-4 tensor along one axis with step 1 (ends clamped to ``length``)."""
    if node.op_type != "Slice" or len(node.inputs) < 4 or node.inputs[3] is None:
        return None
    starts, ends, axes = (constant(node.inputs[i]) for i in (1, 2, 3))
    steps = constant(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else np.ones(1)
    if any(a is None or a.size != 1 for a in (starts, ends, axes, steps)) or int(steps.reshape(())) != 1:
        return None
    axis = int(axes.reshape(()))
    axis = axis + 4 if axis < 0 else axis
    start, end = int(starts.reshape(())), int(ends.reshape(()))
    start = start + length if start < 0 else start
    end = min(end + length if end < 0 else end, length)
    return axis, start, end


def _prefix_split(prefix: ir.Value, body: ir.Value, tokens: int) -> int | None:
    """P when ``prefix`` is tokens [0:P] and ``body`` tokens [P:]; else None."""
    node = prefix.producer()
    if node.op_type == "Split":
        if _axis(node, 4) != 2 or len(node.outputs) != 2:
            return None
        sizes = constant(node.inputs[1]) if len(node.inputs) > 1 else None
        if sizes is None or sizes.size != 2 or int(sizes.sum()) != tokens:
            return None
        return int(sizes[0])
    first = _slice_range(node, tokens)
    second = _slice_range(body.producer(), tokens)
    if first is None or second is None or first[0] != 2 or second[0] != 2:
        return None
    if first[1] != 0 or second[1] != first[2] or second[2] != tokens:
        return None
    return first[2]


def _trig_table(value: ir.Value, fn, rows: int, dim: int) -> np.ndarray | None:
    """The [rows, dim] float64 table a Mul multiplies by: a constant, or fn (Cos/Sin) of constant angles."""
    table = constant(value)
    if table is not None:
        table = table.astype(np.float64)
    else:
        node = value.producer()
        angles = constant(node.inputs[0]) if node is not None and node.op_type in ("Cos", "Sin") else None
        if angles is None or node.op_type.lower() != fn.__name__:
            return None
        table = fn(angles.astype(np.float64))
    while table.ndim > 2 and table.shape[0] == 1:
        table = table[0]
    if table.shape != (rows, dim):
        return None
    return table


prefix_rotary_rules = pattern.RewriteRuleSet(
    [
        PrefixRotary.rule("RotaryOnTokenSliceSplit", split="split"),
        PrefixRotary.rule("RotaryOnTokenSlices", split="slices"),
    ],
    commute=True,
)
#: Applied after prefix_rotary_rules, which would otherwise lose their rope to it.
all_tokens_rotary_rules = pattern.RewriteRuleSet([PrefixRotary.rule("RotaryOnAllTokens", split="none")], commute=True)
