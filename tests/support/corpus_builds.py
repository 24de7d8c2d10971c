"""Corpus models built in the test setup (cached by tests/support/realmodels.py, never by the tool).

Two are made from a downloaded real model (the same weights, stored differently: external data, and
past protobuf's 2 GB limit); two are architectures with random weights ("ours") for hazards no
package ships: DINOv2's interpolated position embeddings and a T5 encoder's fp16-overflowing FFN.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

BUILD_VERSION = 1  # bump when a builder changes: the cache folder name carries it


def external_data(target: Path, base: Path) -> None:
    """``base`` re-saved with every tensor, however small, in one 'model.onnx.data' (what dynamo writes)."""
    model = onnx.load(base)
    onnx.save_model(
        model,
        target,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=target.name + ".data",
        size_threshold=0,
    )


def over_2gb(target: Path, base: Path, copies: int = 46) -> None:
    """``base`` with its word-embedding table tiled ``copies`` times along the vocabulary (2.2 GB of weights).

    Token ids below the original vocabulary read the first copy, so the outputs are the source's.
    Tensors are streamed into the data file one by one: the build never holds 2 GB in memory.
    """
    model = onnx.load(base)
    table = max(model.graph.initializer, key=lambda t: np.prod(t.dims))  # the word embeddings
    data_name = target.name + ".data"
    offset = 0
    with open(target.parent / data_name, "wb") as data:
        for tensor in model.graph.initializer:
            raw = numpy_helper.to_array(tensor).tobytes()
            repeat = copies if tensor is table else 1
            pad = -offset % 64
            data.write(b"\0" * pad)
            offset += pad
            for _ in range(repeat):
                data.write(raw)
            length = len(raw) * repeat
            if tensor is table:
                tensor.dims[0] *= copies
            tensor.ClearField("raw_data")
            for field in ("float_data", "int32_data", "int64_data", "double_data"):
                tensor.ClearField(field)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += length
    assert offset > 2**31, offset
    onnx.save_model(model, target)


def dinov2(target: Path, base: None = None) -> None:
    """A small DINOv2 (random weights) exported by TorchScript at opset 14 with dynamic height and width.

    Dinov2Embeddings interpolates its 37x37 position embeddings to the input's patch grid whenever it
    is traced: a bicubic Resize whose output size is computed from the input's Shape.
    """
    import torch
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    config = Dinov2Config(
        hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768, image_size=518
    )
    model = Dinov2Model(config).eval()
    example = torch.randn(1, 3, 224, 224)
    dims = {0: "batch", 2: "height", 3: "width"}
    with torch.no_grad():
        torch.onnx.export(
            model,
            (example,),
            str(target),
            dynamo=False,
            opset_version=14,
            input_names=["pixel_values"],
            output_names=["last_hidden_state", "pooler_output"],
            dynamic_axes={"pixel_values": dims, "last_hidden_state": {0: "batch", 1: "tokens"}},
        )


def t5_encoder(target: Path, base: None = None, massive: float = 1.5e5) -> None:
    """A t5-small-shaped encoder (random weights, 4 blocks) whose block-1 FFN writes one channel at ~1.5e5.

    Trained T5 checkpoints are known for FFN outputs beyond fp16's 65,504 (why transformers clamps
    them in fp16); random weights do not have it, so one output row of block 1's ``wo`` is scaled
    until that channel of the residual stream reaches ``massive`` on the example tokens.
    """
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=512, d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_heads=8, feed_forward_proj="relu"
    )
    model = T5EncoderModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 16))
    mask = torch.ones_like(ids)
    ffn = model.encoder.block[1].layer[-1].DenseReluDense
    channel = 7
    captured = {}
    hook = ffn.wo.register_forward_hook(lambda mod, inp, out: captured.__setitem__("out", out))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        hook.remove()
        peak = captured["out"][..., channel].abs().max().item()
        ffn.wo.weight[channel] *= massive / peak
    with torch.no_grad():
        torch.onnx.export(
            model,
            (ids, mask),
            str(target),
            dynamo=False,
            opset_version=14,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={name: {0: "batch", 1: "sequence"} for name in ("input_ids", "attention_mask")},
        )
