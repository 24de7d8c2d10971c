"""Feeding a causal language model: a runner for logits, steps through its KV cache and greedy generation (the
inputs themselves: runtime/lm_feeds.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from onnxsmith.analysis.lm_signature import lm_signature
from onnxsmith.core.errors import InputError
from onnxsmith.runtime import runner
from onnxsmith.runtime.lm_feeds import lm_feeds, lm_feeds_at

__all__ = ["LMRunner", "lm_feeds", "lm_feeds_at", "log_softmax", "present_names"]


def present_names(lm: LMRunner) -> dict[str, str]:
    """past input -> the output holding its next value: ``past_key_values.N.key`` -> ``present.N.key``, else by order."""
    outputs = [o.name for o in lm.session.get_outputs() if o.name != lm.sig.logits]
    mapping = {}
    for i, p in enumerate(lm.sig.past):
        guess = p.name.replace("past_key_values", "present")
        if guess in outputs:
            mapping[p.name] = guess
        elif len(outputs) == len(lm.sig.past):
            mapping[p.name] = outputs[i]
        else:
            raise InputError(f"cannot tell which output is the next value of '{p.name}'", lm.path)
    return mapping


class LMRunner:
    """A decoder in onnxruntime: logits for token ids from an empty cache."""

    def __init__(self, path: str | os.PathLike, *, config: dict[str, str] | None = None, threads: int | None = None):
        self.path = Path(path)
        self.sig = lm_signature(runner.load_runnable(self.path), self.path)  # only run: onnxruntime decides
        self.session = runner.open_session(
            self.path, options=runner.session_options(config=config, threads=threads), label=self.path
        )
        self._outputs = [o.name for o in self.session.get_outputs()]
        self._present_of: dict[str, str] | None = None  # past input -> present output, on the first step

    def run(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        return runner.run(self.session, lm_feeds(self.sig, ids), label=self.path)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """[batch, seq, vocab] for a full-logits model, [batch, 1, vocab] for a last-position one."""
        return runner.run(self.session, lm_feeds(self.sig, ids), [self.sig.logits], label=self.path)[self.sig.logits]

    def step(
        self, ids: np.ndarray, past: dict[str, np.ndarray] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``ids`` after the KV cache ``past`` (None: empty): (every output, the cache to continue from)."""
        if self._present_of is None:
            self._present_of = present_names(self)
        out = runner.run(self.session, lm_feeds_at(self.sig, ids, past), self._outputs, label=self.path)
        return out, {p.name: out[self._present_of[p.name]] for p in self.sig.past}

    def greedy(self, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
        """Greedy decoding of every prompt [batch, seq]: the prompts in one run, then one token per run through
        the KV cache (or the whole sequence again for a model without one). The new ids, [batch, new_tokens]."""
        sequence = np.asarray(prompts, dtype=np.int64)
        ids, past = sequence, None
        for _ in range(new_tokens):
            if self.sig.past:
                out, past = self.step(ids, past)
                logits = out[self.sig.logits]
            else:
                logits = self.logits(sequence)
            ids = logits[:, -1].argmax(axis=-1).astype(np.int64)[:, None]
            sequence = np.concatenate([sequence, ids], axis=1)
        return sequence[:, sequence.shape[1] - new_tokens :]

    def all_logits(self, ids: np.ndarray, first: int = 1) -> np.ndarray:
        """Logits at positions ``first - 1`` .. end: one run, or one run per prefix for a last-position model."""
        if not self.sig.last_only:
            return self.logits(ids)[:, first - 1 :]
        return np.concatenate([self.logits(ids[:, :t]) for t in range(first, ids.shape[1] + 1)], axis=1)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
