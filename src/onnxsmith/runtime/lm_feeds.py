"""A causal language model's inputs for token ids: from an empty cache, after a KV cache, or one decode step."""

from __future__ import annotations

import numpy as np

from onnxsmith.analysis.lm_signature import IDS, MASK, POSITIONS, LMSignature

#: Cached tokens before the decode step that :func:`decode_step_feeds` times.
DECODE_PAST = 64


def lm_feeds(sig: LMSignature, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Feeds for running ``ids`` [batch, seq] from an empty cache."""
    batch, seq = ids.shape
    feeds = {IDS: ids.astype(sig.ids)}
    if sig.mask is not None:
        feeds[MASK] = np.ones((batch, seq), dtype=sig.mask)
    if sig.positions is not None:
        feeds[POSITIONS] = np.tile(np.arange(seq, dtype=sig.positions), (batch, 1))
    for p in sig.past:
        shape = [batch if d == "batch" else 0 if d == "past" else d for d in p.dims]
        feeds[p.name] = np.zeros(shape, dtype=p.dtype)
    return feeds


def lm_feeds_at(sig, ids: np.ndarray, past: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Feeds for ``ids`` following ``past`` (a KV cache from the previous run; None: empty)."""
    if past is None:
        return lm_feeds(sig, ids)
    batch, seq = ids.shape
    first = sig.past[0]
    done = past[first.name].shape[first.dims.index("past")]
    feeds = {IDS: ids.astype(sig.ids), **past}
    if sig.mask is not None:
        feeds[MASK] = np.ones((batch, done + seq), dtype=sig.mask)
    if sig.positions is not None:
        feeds[POSITIONS] = np.tile(np.arange(done, done + seq, dtype=sig.positions), (batch, 1))
    return feeds


def decode_step_feeds(sig: LMSignature, past: int = DECODE_PAST) -> dict[str, np.ndarray]:
    """One token after ``past`` cached ones, batch 1: what generation runs for every token it writes (the cache's
    values do not change how long a step takes)."""
    cache = {
        p.name: np.zeros([1 if d == "batch" else past if d == "past" else d for d in p.dims], dtype=p.dtype)
        for p in sig.past
    }
    return lm_feeds_at(sig, np.zeros((1, 1), dtype=np.int64), cache)
