"""A decoder layer's attention with a KV cache -> com.microsoft RotaryEmbedding (q, k) + GroupQueryAttention.

A Llama-family decoder (SmolLM2, Llama, Qwen; grouped-query or not) exported with a cache computes per layer,
after fuse's shape folding (its targets constant)::

    q, k, v   = Transpose(Reshape(x_proj, [0, 0, heads, head_dim]), [0, 2, 1, 3])      (per projection)
    q', k'    = x * cos + Concat(-x[..., h:], x[..., :h]) * sin                         (rotate_half RoPE)
    present_k = Concat(past_key, k', axis 2);  present_v = Concat(past_value, v, axis 2)
    k*, v*    = Reshape(Expand(Unsqueeze(present, 2), [1, 1, groups, 1, 1]), ...)       (the heads repeated)
    scores    = (q' * s) @ (Transpose(k*) * s) + bias;  p = Softmax(scores)             (NaN rows set to 0)
    out       = Reshape(Transpose(p @ v*, [0, 2, 1, 3]), [0, 0, hidden])

some 35 nodes a layer that onnxruntime runs one by one on every decode step. GroupQueryAttention does all of it
from the projections (``[batch, seq, hidden]``), the cache in its own layout (``[batch, kv_heads, past,
head_dim]``: present_k/present_v stay the same outputs), ``seqlens_k`` and ``total_sequence_length``.

* The rotation stays the graph's own: ``cos``/``sin`` as computed from ``position_ids`` (their first half;
  the halves are equal by construction, ``Concat(f, f)``), read as a table of ``batch * seq`` rows that
  RotaryEmbedding indexes with positions ``0 .. batch * seq - 1``. No table of a maximum length is stored,
  and positions mean what ``position_ids`` says.
* The mask becomes GroupQueryAttention's own: causal, each sequence's keys up to ``seqlens_k`` (the count of
  ones in ``attention_mask``, minus 1): what the bias computes where the mask is ones, or zeros only at the end
  (right padding). The bias must be computed from an ``attention_mask`` input; its values are not proven here:
  the gate's generation through the cache judges the variant.
* onnxruntime's kernel runs a prompt onto an existing cache (sequence > 1 after a past) at batch 1 only.

The fuse report says both limits. Models whose attention does not have this form keep their graph.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from onnxsmith.irutil.walk import constant
from onnxsmith.rules.weights import WeightAddingRule

#: Values looked at on the way up from the additive bias to ``attention_mask`` (exporters build the causal and
#: padding mask in a few dozen ops).
_MASK_WALK = 512
#: What the fused attention cannot do that the source could: the report's words.
LIMITS = (
    "GroupQueryAttention masks causally and by the count of ones in attention_mask (padding on the right only); "
    "onnxruntime runs a prompt onto an existing cache at batch 1 only"
)


def _rope(op, x, cos, sin, tag: str):
    first = op.Slice(x, _allow_other_inputs=True, _outputs=[f"{tag}_first"])
    second = op.Slice(x, _allow_other_inputs=True, _outputs=[f"{tag}_second"])
    rotated = op.Concat(op.Neg(second), first, axis=-1)
    return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))


def _heads(op, projection, tag: str):
    """[batch, seq, heads * head_dim] -> [batch, heads, seq, head_dim]."""
    split = op.Reshape(projection, _allow_other_inputs=True, _outputs=[f"{tag}_heads"])
    return op.Transpose(split, perm=[0, 2, 1, 3])


def _repeated(op, cache, tag: str):
    """A cache [batch, kv_heads, total, head_dim] repeated to [batch, heads, total, head_dim] (repeat_kv)."""
    grown = op.Unsqueeze(cache, _allow_other_inputs=True)
    expanded = op.Expand(grown, _allow_other_inputs=True, _outputs=[f"{tag}_expanded"])
    return op.Reshape(expanded, _allow_other_inputs=True, _outputs=[f"{tag}_repeated"])


class DecoderAttention(WeightAddingRule):
    """The layer's attention (see the module doc) -> two RotaryEmbedding + one GroupQueryAttention."""

    def __init__(self, name: str, *, nan_guard: bool, flat_keys: bool) -> None:
        # the matched nodes stay for the dead-node cleanup: a Shape of the repeated keys (dynamo's computed
        # flattening target) is another use, and dies with what it computes
        super().__init__(name, remove_nodes=False)
        self._nan_guard, self._flat_keys = nan_guard, flat_keys

    def setup(self):
        super().setup()
        # per graph, made at the first layer and read by the others: (rotation tables, positions, lengths)
        self._shared: dict[int, tuple[ir.Value, ...]] = {}

    def pattern(self, op, q_proj, k_proj, v_proj, past_key, past_value, cos, sin, q_scale, k_scale, bias, nan_fill):
        q = _rope(op, _heads(op, q_proj, "q"), cos, sin, "q")
        k = _rope(op, _heads(op, k_proj, "k"), cos, sin, "k")
        v = _heads(op, v_proj, "v")
        present_key = op.Concat(past_key, k, _outputs=["present_key"])
        present_value = op.Concat(past_value, v, _outputs=["present_value"])
        repeated_keys = _repeated(op, present_key, "k")
        if self._flat_keys:  # k.transpose(-2, -1) through [batch * heads, total, head_dim] (dynamo)
            flat = op.Reshape(repeated_keys, _allow_other_inputs=True, _outputs=["keys_flat"])
            keys = op.Reshape(op.Transpose(flat, perm=[0, 2, 1]), _allow_other_inputs=True, _outputs=["keys_back"])
        else:  # one Transpose (TorchScript)
            keys = op.Transpose(repeated_keys, perm=[0, 1, 3, 2])
        scores = op.MatMul(op.Mul(q, q_scale), op.Mul(keys, k_scale))
        probs = op.Softmax(op.Add(scores, bias), _outputs=["probs"])
        if self._nan_guard:
            probs = op.Where(op.IsNaN(probs), nan_fill, probs, _outputs=["guarded"])
        context = op.MatMul(probs, _repeated(op, present_value, "v"))
        out = op.Reshape(op.Transpose(context, perm=[0, 2, 1, 3]), _allow_other_inputs=True, _outputs=["merged"])
        return out, present_key, present_value

    def check(
        self, context, q_proj, k_proj, cos, sin, q_scale, k_scale, bias, present_key, present_value, probs, **values
    ) -> MatchResult:
        result = MatchResult()
        self.remember_graph(context)
        dims = _dims(values["q_heads"], values["k_heads"], values["v_heads"])
        if dims is None:
            return result.fail("the heads split is not [batch, seq, heads, head_dim] with static heads", q_proj)
        heads, kv_heads, head_dim = dims
        if heads % kv_heads:
            return result.fail(f"{heads} query heads do not share {kv_heads} key/value heads evenly", k_proj)
        for value in (present_key, present_value):
            if _axis(value.producer(), 4) != 2:
                return result.fail("the cache is not concatenated on its sequence axis", value)
        if probs.producer().attributes.get_int("axis", -1) not in (-1, 3):
            return result.fail("the Softmax is not over the keys", probs)
        if values.get("guarded") is not None and not _is_zero(values.get("nan_fill")):
            return result.fail("the NaN guard does not set masked rows to 0", values["guarded"])
        for tag in ("q", "k"):
            if not _halves(values[f"{tag}_first"].producer(), values[f"{tag}_second"].producer(), head_dim):
                return result.fail("the rotation's halves are not [:d/2] and [d/2:] of the head", q_proj)
        for tag, groups in (("k", heads // kv_heads), ("v", heads // kv_heads)):
            if not _repeats(values[f"{tag}_expanded"].producer(), values[f"{tag}_repeated"], heads, groups):
                return result.fail("the cache is not repeated to the query heads group by group", present_key)
        if values.get("keys_back") is not None and not _keys_transposed(values["keys_flat"], values["keys_back"], dims):
            return result.fail("the keys are not transposed to [batch, heads, head_dim, total]", values["keys_back"])
        for table in (cos, sin):
            if not _doubled(table):
                return result.fail("cos/sin are not a table of equal halves (Concat(f, f))", table)
            if not _per_token(table, q_proj):
                return result.fail("cos/sin are not [batch, 1, seq, head_dim] like the tokens they rotate", table)
        scales = [constant(v) for v in (q_scale, k_scale)]
        if any(s is None or np.size(s) != 1 for s in scales):
            return result.fail("the query and key scales are not scalar constants", q_scale)
        self._scale = float(np.asarray(scales[0]).reshape(())) * float(np.asarray(scales[1]).reshape(()))
        mask = _mask_input(bias, context.graph_or_function)
        if mask is None:
            return result.fail("the attention bias is not computed from an 'attention_mask' input", bias)
        self._mask, self._dims = mask, (heads, kv_heads, head_dim)
        return result

    def rewrite(self, op, q_proj, k_proj, v_proj, past_key, past_value, cos, sin, **_):
        heads, kv_heads, head_dim = self._dims
        rows_cos, rows_sin, positions, seqlens, total = self._tables(op, q_proj, cos, sin, head_dim)
        rotary = {"interleaved": 0, "_domain": "com.microsoft"}
        q = op.RotaryEmbedding(q_proj, positions, rows_cos, rows_sin, num_heads=heads, **rotary)
        k = op.RotaryEmbedding(k_proj, positions, rows_cos, rows_sin, num_heads=kv_heads, **rotary)
        attributes = {"num_heads": heads, "kv_num_heads": kv_heads}
        if not math.isclose(self._scale, 1 / math.sqrt(head_dim), rel_tol=1e-6):
            attributes["scale"] = self._scale
        return op.GroupQueryAttention(
            q, k, v_proj, past_key, past_value, seqlens, total, **attributes, _domain="com.microsoft", _outputs=3
        )

    def _tables(self, op, q_proj, cos, sin, head_dim):
        """The per-graph values every layer reads, made by the first layer's rewrite."""
        key = id(cos)
        if key not in self._shared:
            half = self.new_weight(op, np.array([head_dim // 2], np.int64), "rotary_half")
            start = self.new_weight(op, np.array([0], np.int64), "rotary_start")
            last = self.new_weight(op, np.array([-1], np.int64), "rotary_axis")
            rows = self.new_weight(op, np.array([-1, head_dim // 2], np.int64), "rotary_rows")
            tables = [op.Reshape(op.Slice(t, start, half, last), rows) for t in (cos, sin)]
            # positions 0 .. batch * seq - 1, shaped [batch, seq]: each token reads its own row
            zero, one = (
                self.new_weight(op, np.array(v, np.int64), f"rotary_{n}") for v, n in ((0, "zero"), (1, "one"))
            )
            count = op.Squeeze(op.Shape(tables[0], start=0, end=1))
            batch_seq = op.Shape(q_proj, start=0, end=2)
            positions = op.Reshape(op.Range(zero, count, one), batch_seq)
            axis = self.new_weight(op, np.array([1], np.int64), "seqlens_axis")
            ones = op.ReduceSum(op.Cast(self._mask, to=ir.DataType.INT32), axis, keepdims=0)
            seqlens = op.Sub(ones, op.Constant(value=ir.tensor(np.array(1, np.int32))))
            total = op.Cast(op.Squeeze(op.Shape(self._mask, start=1, end=2)), to=ir.DataType.INT32)
            self._shared[key] = (*tables, positions, seqlens, total)
        return self._shared[key]


def _dims(q: ir.Value, k: ir.Value, v: ir.Value) -> tuple[int, int, int] | None:
    """(heads, kv_heads, head_dim) from the heads splits [batch, seq, heads, head_dim], or None."""
    found = []
    for value in (q, k, v):
        shape = value.shape
        if shape is None or shape.rank() != 4 or not all(isinstance(d, int) for d in shape[2:]):
            return None
        found.append((shape[2], shape[3]))
    (heads, head_dim), (kv_heads, k_dim), (v_heads, v_dim) = found
    if not (head_dim == k_dim == v_dim and kv_heads == v_heads) or head_dim % 2:
        return None
    return heads, kv_heads, head_dim


def _keys_transposed(flat: ir.Value, back: ir.Value, dims: tuple[int, int, int]) -> bool:
    """Reshape to [batch * heads, total, head_dim], Transpose(0, 2, 1), Reshape to [batch, heads, head_dim, total]."""
    heads, _, head_dim = dims
    before, after = flat.shape, back.shape
    return (
        before is not None
        and after is not None
        and before.rank() == 3
        and before[2] == head_dim
        and after.rank() == 4
        and after[1] == heads
        and after[2] == head_dim
    )


def _per_token(table: ir.Value, projection: ir.Value) -> bool:
    """``table`` has one row per token of ``projection`` [batch, seq, hidden]: [batch, 1, seq, head_dim], the
    rows RotaryEmbedding reads by position 0 .. batch * seq - 1 (a table broadcast over the batch has fewer)."""
    rows, tokens = table.shape, projection.shape
    if rows is None or tokens is None or rows.rank() != 4 or tokens.rank() != 3 or rows[1] != 1:
        return False
    return _same_dim(rows[0], tokens[0]) and _same_dim(rows[2], tokens[1])


def _same_dim(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a.value is not None and a.value == b.value


def _axis(node: ir.Node | None, rank: int) -> int | None:
    if node is None:
        return None
    axis = node.attributes.get_int("axis", 0)
    return axis % rank


def _is_zero(value: ir.Value | None) -> bool:
    array = constant(value) if value is not None else None
    return array is not None and np.size(array) == 1 and float(np.asarray(array).reshape(())) == 0.0


def _ints(value: ir.Value | None) -> list[int] | None:
    array = constant(value) if value is not None else None
    return None if array is None else [int(x) for x in np.asarray(array).reshape(-1)]


def _halves(first: ir.Node, second: ir.Node, head_dim: int) -> bool:
    """``first`` is x[..., :d/2] and ``second`` x[..., d/2:] (Slice on the last axis)."""
    half = head_dim // 2

    def window(node: ir.Node) -> tuple[int, int] | None:
        starts, ends = _ints(node.inputs[1]), _ints(node.inputs[2])
        axes = _ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
        steps = _ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
        if not (starts and ends and axes and steps) or len(starts) != 1 or steps != [1] or axes[0] % 4 != 3:
            return None
        return max(starts[0], 0), min(ends[0], head_dim)

    return window(first) == (0, half) and window(second) == (half, head_dim)


def _repeats(expand: ir.Node, repeated: ir.Value, heads: int, groups: int) -> bool:
    """``Expand(Unsqueeze(cache, 2))`` grows axis 2 to ``groups`` and nothing else, and the Reshape after it gives
    [batch, heads, total, head_dim]: each key/value head read by ``groups`` query heads in a row."""
    grown = expand.inputs[0].producer() if expand.inputs[0] is not None else None
    if grown is None or _ints(grown.inputs[1] if len(grown.inputs) > 1 else None) != [2]:
        return False
    target = _ints(expand.inputs[1])
    if target is None or len(target) != 5 or target[2] != groups or any(t != 1 for i, t in enumerate(target) if i != 2):
        return False
    shape = repeated.shape
    return shape is not None and shape.rank() == 4 and shape[1] == heads


def _doubled(table: ir.Value) -> bool:
    """``table`` is Cos or Sin of ``Concat(f, f)`` on the last axis (through Unsqueeze, Cast, scalar Mul)."""
    value: ir.Value | None = table
    for _ in range(6):
        node = value.producer() if value is not None else None
        if node is None:
            return False
        if node.op_type in ("Cos", "Sin"):
            concat = node.inputs[0].producer() if node.inputs[0] is not None else None
            return concat is not None and concat.op_type == "Concat" and _last_axis_pair(concat)
        if node.op_type in ("Unsqueeze", "Cast", "Identity"):
            value = node.inputs[0]
        elif node.op_type == "Mul" and any(_scalar(v) for v in node.inputs):
            value = next(v for v in node.inputs if not _scalar(v))
        else:
            return False
    return False


def _rank(value: ir.Value | None) -> int:
    return value.shape.rank() if value is not None and value.shape is not None else 0


def _last_axis_pair(concat: ir.Node) -> bool:
    rank = _rank(concat.inputs[0])
    axis = concat.attributes.get_int("axis", 0)
    return len(concat.inputs) == 2 and concat.inputs[0] is concat.inputs[1] and rank > 0 and axis % rank == rank - 1


def _scalar(value: ir.Value | None) -> bool:
    array = constant(value) if value is not None else None
    return array is not None and np.size(array) == 1


def _mask_input(bias: ir.Value, graph) -> ir.Value | None:
    """The graph input named ``attention_mask`` the bias is computed from, if it is."""
    seen: set[int] = set()
    pending = [bias]
    while pending and len(seen) < _MASK_WALK:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if value.is_graph_input():
            if value.name == "attention_mask":
                return value
            continue
        node = value.producer()
        if node is not None:
            pending.extend(v for v in node.inputs if v is not None)
    return None


decoder_attention_rules = pattern.RewriteRuleSet(
    [
        DecoderAttention.rule(f"decoder attention{guard}{keys}", nan_guard=bool(guard), flat_keys=bool(keys))
        for guard in ("", " (NaN-guarded softmax)")
        for keys in ("", " (keys transposed flat)")
    ]
)
