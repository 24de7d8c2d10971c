"""A decoder's KV cache judged by its effect: the next step's logits, not the cache's own values.

A decoder exported with a cache (the optimum / transformers.js layout: ``input_ids``,
``attention_mask``, ``position_ids``, ``past_key_values.N.key/value`` in; ``logits``,
``present.N.key/value`` out) returns its keys and values only to be fed back. What matters about
them is what the model makes of them on the next step, and their own values say little about
that: a key scaled by 1.001 moves the softmax's temperature by 0.1 % (the next logits move by
1e-8 of their magnitude, within the fp32 gate) while its RMS moves past the fp32 bound; a key
whose outlier channel is rounded differently moves nothing at all.

So when both models have that signature (analysis/lm_signature.py ``cache_layout``), each is run one
more step on its own ``present.*`` as past (:func:`step_feeds`: the source's greedy next token, the
mask extended by one, the positions advanced), and the gate judges the next step's logits
(:func:`judge_cache`); the ``present.*`` outputs themselves are checked only for their shape and
for NaN/inf the source does not have. Recognition is conservative: a model whose inputs are not
a causal LM's (:func:`onnxsmith.analysis.lm_signature.lm_signature`), or whose past inputs do not
each have a present output of the same rank, keeps every output judged as a tensor.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from onnxsmith.analysis.lm_signature import IDS, MASK, POSITIONS, CacheLayout
from onnxsmith.core.errors import InputError
from onnxsmith.core.text import format_cosine
from onnxsmith.verify.gate import Bounds, OutputDiff, judge_output


def applies(
    layout: CacheLayout | None, feeds_list: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray]
) -> bool:
    """Whether ``layout`` can be stepped with these feeds and the source's outputs (input sets on axis 0):
    every past fed, ids and mask of [batch, length], logits of [batch, length, vocab]."""
    if layout is None or any(name not in reference for name in (layout.logits, *layout.presents)):
        return False
    if reference[layout.logits].ndim != 4 or reference[layout.logits].shape[-1] < 2:
        return False
    for feeds in feeds_list:
        ids = np.asarray(feeds.get(IDS))
        if ids.ndim != 2 or ids.dtype.kind not in "iu" or any(past not in feeds for past, _ in layout.pairs):
            return False
        for name in (MASK, POSITIONS):
            if name in feeds and (np.ndim(feeds[name]) != 2 or len(feeds[name]) != len(ids)):
                return False
    return True


def next_tokens(layout: CacheLayout, reference: dict[str, np.ndarray]) -> np.ndarray:
    """The source's greedy next token of every sequence, per input set: [sets, batch]."""
    return np.argmax(reference[layout.logits][:, :, -1, :], axis=-1)


def step_feeds(
    layout: CacheLayout, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray], token: np.ndarray
) -> dict[str, np.ndarray]:
    """The feeds of one more step after ``feeds``: ``token`` [batch] next, each ``present.*`` of
    ``outputs`` (this model's, this input set's) as its past, the mask one longer, positions one on."""
    ids = np.asarray(feeds[IDS])
    step = {IDS: token.reshape(len(ids), 1).astype(ids.dtype)}
    if MASK in feeds:
        mask = np.asarray(feeds[MASK])
        step[MASK] = np.concatenate([mask, np.ones((len(mask), 1), mask.dtype)], axis=1)
    if POSITIONS in feeds:
        positions = np.asarray(feeds[POSITIONS])
        step[POSITIONS] = positions[:, -1:] + 1
    for past, present in layout.pairs:
        step[past] = outputs[present]
    return step


def judge_cache(
    layout: CacheLayout,
    reference: dict[str, np.ndarray],
    candidate: dict[str, np.ndarray],
    ref_next: np.ndarray,
    cand_next: np.ndarray,
    bounds: Bounds,
) -> list[OutputDiff]:
    """Each ``present.*`` output judged by the next step's logits (``ref_next``/``cand_next``: each model run
    on its own cache, input sets on axis 0), after its own shape and NaN/inf are checked."""
    effect = judge_output(layout.logits, ref_next, cand_next, bounds)
    diffs = []
    for present in layout.presents:
        ref, test = reference[present], candidate[present]
        if ref.shape != test.shape:
            raise InputError(f"output '{present}' has shape {test.shape[1:]}, the reference {ref.shape[1:]}")
        a, b = ref.astype(np.float64), test.astype(np.float64)
        finite_a, finite_b = np.isfinite(a), np.isfinite(b)
        failed = list(effect.failed)
        # NaN/inf in the cache itself: refused wherever the source has none, whatever the next step says.
        if not (np.array_equal(finite_a, finite_b) and np.array_equal(a[~finite_a], b[~finite_b], equal_nan=True)):
            failed = ["nonfinite", *(f for f in failed if f != "nonfinite")]
        both = finite_a & finite_b
        norms = float(np.linalg.norm(a[both]) * np.linalg.norm(b[both]))
        own = float(np.dot(a[both], b[both]) / norms) if norms > 0 else None
        diffs.append(
            replace(
                effect,
                name=present,
                shape=tuple(int(d) for d in ref.shape[1:]),
                dtype=str(test.dtype),
                nonfinite_ref=int((~finite_a).sum()),
                nonfinite_test=int((~finite_b).sum()),
                failed=failed,
                passed=not failed,
                needed=dict(effect.needed) if "nonfinite" not in failed else {},
                kind="cache",
                cache={
                    "outputs": layout.family,
                    "judged_by": layout.logits,
                    "step": "the source's greedy next token, each model on its own cache",
                    "next_nonfinite": effect.nonfinite_test,
                    "own_cosine": own,
                    "own_max_abs": float(np.max(np.abs(a[both] - b[both]), initial=0.0)),
                },
            )
        )
    return diffs


def describe(diffs: list[OutputDiff]) -> str:
    """'present.* judged by the next step's logits: cosine …' for a summary line ('' without cache outputs)."""
    cached = [d for d in diffs if d.kind == "cache" and d.cache is not None]
    if not cached:
        return ""
    d = cached[0]
    parts = [f"cosine {format_cosine(d.cosine)}"] if d.cosine is not None else []
    if d.argmax_agreement is not None:
        parts.append(f"argmax {d.argmax_agreement:.0%}")
    return f"{d.cache['outputs']} judged by the next step's logits: {', '.join(parts) or 'no values'}"
