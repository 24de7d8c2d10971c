"""rules/rotary.py: 2-D RoPE on the patch tokens -> RotaryEmbedding over all tokens."""

import numpy as np
import onnx_ir as ir
import pytest

from onnxsmith.irutil.walk import const_array
from onnxsmith.rules.rotary import all_tokens_rotary_rules, prefix_rotary_rules
from tests.support.fusion import FACEAGE, assert_same_outputs, assert_untouched, fusion_trace, op_count, prepared_mlp

PREFIX, PATCHES, HALF = 5, 196, 32  # CLS + 4 registers; 14x14 patches; head_dim 64 / 2


def _angles(model: ir.Model) -> np.ndarray:
    cos = next(n for n in model.graph if n.op_type == "Cos")
    return const_array(cos.inputs[0])


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_two_rotary_embeddings_per_block_with_identity_prefix_rows(exporter, tmp_path):
    step = fusion_trace(str(FACEAGE[exporter]))["RoPE -> RotaryEmbedding"]
    assert step.outcome.matched == 8  # q and k of 4 blocks
    before, after = step.model_before(), step.model_after()
    rotary = [n for n in after.graph if n.op_type == "RotaryEmbedding"]
    assert len(rotary) == 8
    assert op_count(after, "Neg") == 0 and op_count(after, "Split") == 0
    cos, sin = const_array(rotary[0].inputs[2]), const_array(rotary[0].inputs[3])
    assert cos.shape == sin.shape == (PREFIX + PATCHES, HALF) and cos.dtype == np.float32
    assert np.array_equal(cos[:PREFIX], np.ones((PREFIX, HALF))) and not sin[:PREFIX].any()
    # The graph's own angle table (dynamo: a constant; TorchScript: folded from Range/Tile/If), in float64.
    angles = _angles(before).astype(np.float64)
    assert angles.shape == (PATCHES, 2 * HALF)
    assert np.array_equal(cos[PREFIX:], np.cos(angles[:, :HALF]).astype(np.float32))
    assert np.array_equal(sin[PREFIX:], np.sin(angles[:, :HALF]).astype(np.float32))
    assert int(const_array(rotary[0].inputs[1])) == 0 and rotary[0].attributes.get_int("interleaved", 0) == 0
    assert_same_outputs(step.before, step.after, tmp_path)


def test_refuses_a_table_whose_halves_differ():
    """A rope whose cos/sin halves differ is not RotaryEmbedding's non-interleaved form: untouched, with the reason."""
    model = fusion_trace(str(FACEAGE["dynamo"]))["RoPE -> RotaryEmbedding"].model_before()
    cos = next(n for n in model.graph if n.op_type == "Cos")
    angles = const_array(cos.inputs[0]).copy()
    angles[:, HALF:] += 0.25
    table = ir.Value(
        name="skewed_angles",
        shape=ir.Shape(angles.shape),
        type=ir.TensorType(ir.DataType.FLOAT),
        const_value=ir.tensor(angles, name="skewed_angles"),
    )
    model.graph.register_initializer(table)
    cos.replace_input_with(0, table)
    outcome = assert_untouched(model, "rope", prefix_rotary_rules, all_tokens_rotary_rules)
    assert "differs between the two halves" in outcome.reason


def test_leaves_a_graph_without_rope_untouched():
    assert_untouched(prepared_mlp(), "rope", prefix_rotary_rules, all_tokens_rotary_rules)
