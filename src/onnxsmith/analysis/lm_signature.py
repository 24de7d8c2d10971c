"""A causal language model's interface as onnxsmith feeds it: ids, mask, positions, a KV cache, logits; and
which output of a cached decoder feeds which input on the next step (:func:`cache_layout`).

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


#: past input prefix -> the prefixes its present output may have (optimum, transformers.js, older exports).
_PRESENT_OF = (
    ("past_key_values.", ("present.", "present_key_values.")),
    ("past_key_values_", ("present_", "present_key_values_")),
    ("past.", ("present.",)),
    ("past_", ("present_",)),
)


@dataclass(frozen=True)
class CacheLayout:
    """Which input each ``present.*`` output feeds on the next step, and the logits they are judged by."""

    logits: str
    pairs: tuple[tuple[str, str], ...]  # (past input, present output)

    @property
    def presents(self) -> tuple[str, ...]:
        return tuple(present for _, present in self.pairs)

    @property
    def family(self) -> str:
        """How a line names the cache outputs: ``present.*`` (their common prefix)."""
        first = self.pairs[0][1]
        for _, prefixes in _PRESENT_OF:
            for prefix in prefixes:
                if first.startswith(prefix):
                    return prefix + "*"
        return "the cache outputs"


def cache_layout(model: ir.Model) -> CacheLayout | None:
    """The KV-cache layout of a causal LM, or None when ``model`` is not clearly one (read, not run)."""
    try:
        sig = lm_signature(model)
    except InputError:  # inputs onnxsmith cannot feed a decoder with: not a cached decoder
        return None
    if not sig.past:
        return None
    outputs = {value.name: value for value in model.graph.outputs}
    logits = outputs.get(sig.logits)
    if logits is None or logits.shape is None or len(logits.shape) != 3:
        return None
    pairs = []
    for past in sig.past:
        names = [
            prefix + past.name[len(source) :]
            for source, prefixes in _PRESENT_OF
            if past.name.startswith(source)
            for prefix in prefixes
        ]
        found = [name for name in names if name in outputs]
        if len(found) != 1:
            return None
        present = outputs[found[0]]
        if present.shape is None or len(present.shape) != len(past.dims) or "past" not in past.dims:
            return None
        pairs.append((past.name, present.name))
    return CacheLayout(sig.logits, tuple(pairs))
