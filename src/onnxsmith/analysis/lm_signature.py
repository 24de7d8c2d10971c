"""A causal language model's interface as onnxsmith feeds it: ids, mask, positions, a KV cache, logits.

Static: read from the graph's inputs and outputs, never by running it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsmith.core.errors import InputError

IDS = "input_ids"
MASK = "attention_mask"
POSITIONS = "position_ids"


@dataclass(frozen=True)
class PastInput:
    name: str
    dims: tuple  # ints, or "batch" / "past" for the symbolic ones
    dtype: np.dtype


@dataclass(frozen=True)
class LMSignature:
    """What a decoder takes and returns, as onnxsmith feeds it."""

    ids: np.dtype
    mask: np.dtype | None
    positions: np.dtype | None
    past: tuple[PastInput, ...]
    logits: str
    last_only: bool  # the logits output is [batch, 1, vocab]: the last position only
    vocab: int | None


def lm_signature(model: ir.Model, label: str | os.PathLike | None = None) -> LMSignature:
    """Read the decoder's inputs; InputError for an input onnxsmith doesn't know how to feed."""
    inputs = {v.name: v for v in model.graph.inputs if v.name not in model.graph.initializers}
    if IDS not in inputs:
        raise InputError(
            f"not a causal language model: no '{IDS}' input (inputs: {', '.join(inputs) or 'none'})", label
        )
    ids_value = inputs[IDS]
    batch_dim = _dim_name(ids_value, 0)

    def dtype(v: ir.Value) -> np.dtype:
        return np.dtype(v.dtype.numpy())

    past = []
    for name, value in inputs.items():
        if name in (IDS, MASK, POSITIONS):
            continue
        if value.shape is None or not ("past" in name or any("past" in str(d) for d in _dims(value))):
            raise InputError(
                f"do not know what to feed input '{name}' of a language model "
                f"(known: {IDS}, {MASK}, {POSITIONS}, past_key_values.*)",
                label,
            )
        dims = []
        for d in _dims(value):
            if isinstance(d, int):
                dims.append(d)
            elif d == batch_dim or "batch" in str(d):
                dims.append("batch")
            elif "past" in str(d):
                dims.append("past")
            else:
                raise InputError(f"input '{name}' has a dim '{d}' that is neither the batch nor the past length", label)
        past.append(PastInput(name, tuple(dims), dtype(value)))
    outputs = list(model.graph.outputs)
    logits = next((o for o in outputs if o.name == "logits"), outputs[0] if outputs else None)
    if logits is None:
        raise InputError("the model has no outputs", label)
    dims = _dims(logits)
    last_only = len(dims) == 3 and dims[1] == 1
    vocab = dims[-1] if dims and isinstance(dims[-1], int) else None
    return LMSignature(
        ids=dtype(ids_value),
        mask=dtype(inputs[MASK]) if MASK in inputs else None,
        positions=dtype(inputs[POSITIONS]) if POSITIONS in inputs else None,
        past=tuple(past),
        logits=logits.name,
        last_only=last_only,
        vocab=vocab,
    )


def _dims(value: ir.Value) -> list:
    if value.shape is None:
        return []
    return [d if isinstance(d, int) else (d.value or "?") for d in value.shape]


def _dim_name(value: ir.Value, index: int):
    dims = _dims(value)
    return dims[index] if len(dims) > index else None
