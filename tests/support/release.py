"""Small inputs for the release tests: a toy face-age model, face images with WIDER FACE boxes, recipes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from onnxsmith.io.files import sha256_file

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "faceage"


def toy_faceage(
    massive_channel: int = 5, massive_value: float = 1.0e5, hidden: int = 16, seed: int = 0
) -> onnx.ModelProto:
    """face[batch,3,224,224] -> pooled colours -> residual h (channel ``massive_channel`` offset by
    ``massive_value``) -> LayerNormalization -> age_logits[batch,100], gender_logits[batch,2].

    Shaped like the real face-age model's interface, with a massive residual channel; the age head
    reads the embedding before the offset so that ages follow the image's colours."""
    rng = np.random.default_rng(seed)
    offset = np.zeros(hidden, np.float32)
    offset[massive_channel] = massive_value
    scale = np.ones(hidden, np.float32)
    scale[massive_channel] = 1e-3  # the norm weight that tames the channel, as in the real model
    inits = [
        numpy_helper.from_array(np.array([2, 3], np.int64), "hw"),
        numpy_helper.from_array(rng.standard_normal((3, hidden)).astype(np.float32) * 3, "w_in"),
        numpy_helper.from_array(offset, "offset"),
        numpy_helper.from_array(scale, "ln_scale"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "ln_bias"),
        numpy_helper.from_array((rng.standard_normal((hidden, 100)) * 0.3).astype(np.float32), "w_age"),
        numpy_helper.from_array(np.linspace(2.5, -2.5, 100).astype(np.float32), "b_age"),
        numpy_helper.from_array(rng.standard_normal((hidden, 2)).astype(np.float32), "w_gender"),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["face", "hw"], ["pooled"], keepdims=0, name="pool"),
        helper.make_node("MatMul", ["pooled", "w_in"], ["embed"], name="embed"),
        helper.make_node("Add", ["embed", "offset"], ["residual"], name="residual_add"),
        helper.make_node("LayerNormalization", ["residual", "ln_scale", "ln_bias"], ["normed"], axis=-1, name="norm"),
        helper.make_node("MatMul", ["embed", "w_age"], ["age_raw"], name="age_head"),
        helper.make_node("Add", ["age_raw", "b_age"], ["age_logits"], name="age_bias"),
        helper.make_node("MatMul", ["normed", "w_gender"], ["gender_logits"], name="gender_head"),
    ]
    graph = helper.make_graph(
        nodes,
        "toy_faceage",
        [helper.make_tensor_value_info("face", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [
            helper.make_tensor_value_info("age_logits", TensorProto.FLOAT, ["batch", 100]),
            helper.make_tensor_value_info("gender_logits", TensorProto.FLOAT, ["batch", 2]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def save_toy_faceage(path: Path, **kwargs) -> Path:
    onnx.save(toy_faceage(**kwargs), path)
    return path


def face_images(folder: Path, count: int = 3, size: tuple[int, int] = (160, 120)) -> list[tuple[str, tuple]]:
    """``count`` seeded images, each with one face box (x, y, w, h); returns (file name, box)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    found = []
    for i in range(count):
        tint = rng.integers(40, 216, 3)
        pixels = np.clip(rng.normal(tint, 30, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
        name = f"face{i}.png"
        Image.fromarray(pixels).save(folder / name)
        found.append((name, (10 + 5 * i, 12, 60 + 10 * i, 70)))
    return found


def wider_annotations(items: list[tuple[str, list[tuple]]]) -> str:
    """WIDER FACE annotation text for (image, [boxes]) with the six attribute flags."""
    lines = []
    for image, boxes in items:
        lines += [image, str(len(boxes))]
        lines += [" ".join(str(v) for v in box) + " 0 0 0 0 0 0" for box in boxes] or ["0 0 0 0 0 0 0 0 0 0"]
    return "\n".join(lines) + "\n"


def recipe_text(source: Path, variants: str, *, validation: str = "", bench: str = "", card: str = "") -> str:
    return (
        f'[source]\npath = "{source.name}"\nsha256 = "{sha256_file(source)}"\n\n'
        f"{variants}\n{validation}\n{bench}\n{card}\n"
    )
