"""The ``lm`` task: a language-model variant judged on held-out text.

A thin adapter over :mod:`onnxsmith.tasks.lm.scoring` (the scoring ``eval-lm`` uses too):
the text is tokenized with the source's tokenizer and cut into windows; both
models score every next token of every window; the metrics are the variant's
loss and perplexity, its mean KL divergence from the source's next-token
distributions and how often both rank the same token first.

A variant that returns only the last position's logits (``quantize`` with
``last_token``) cannot be scored at every position; build such a recipe's
variant with ``last_token = false`` to validate it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.lm_signature import lm_signature
from onnxsmith.core.errors import UsageError
from onnxsmith.core.transform import JobEngine, Progress
from onnxsmith.settings.lm import LM, LMOptions
from onnxsmith.tasks.base import HIGHER, LOWER, MEAN, Evaluation, MetricSpec, Sample, Task, register_task
from onnxsmith.tasks.lm import scoring as lm
from onnxsmith.tasks.lm.feeding import lm_feeds
from onnxsmith.tasks.lm.gate import DEFAULT_MAX_KL, DEFAULT_MIN_TOP1, LMComparison, compare_lm


@register_task
class LanguageModel(Task, settings=LM):
    metrics = (
        # kl, top1 and loss are means over positions, the same number per window: means of each window's (the
        # windows are the samples: positions within one are not independent); a ratio of losses and an
        # exponential of one are no mean
        MetricSpec("kl", "mean KL from the source", LOWER, "nats", MEAN),
        MetricSpec("top1", "top-1 agreement", HIGHER, summary=MEAN),
        MetricSpec("loss_increase", "loss increase", LOWER),
        MetricSpec("loss", "loss", LOWER, "nats/token", MEAN),
        MetricSpec("perplexity", "perplexity", LOWER),
    )
    default_gates: ClassVar[dict[str, float]] = {"kl": DEFAULT_MAX_KL, "top1": DEFAULT_MIN_TOP1}

    def samples(self, model: ir.Model, options: LMOptions, source: Path | None = None) -> list[Sample]:
        if not options.text:
            raise UsageError("task lm needs text: a held-out UTF-8 text file")
        tokenizer = lm.load_tokenizer(options.tokenizer or lm.folder_of(source))
        windows = lm.text_windows(
            tokenizer,
            lm.text_pieces(options.text),
            window=options.window,
            max_windows=options.max_windows,
            label=options.text,
        )
        sig = lm_signature(model, source)
        return [Sample(f"window {i}", lm_feeds(sig, row[None]), target=row) for i, row in enumerate(windows)]

    def gate(self, reference, candidate, feeds, *, sample_from_source: bool = False, **settings) -> LMComparison:
        """The gate of ``quantize`` and of ``int8`` on a decoder (:func:`compare_lm`): next-token KL, top-1
        agreement and greedy generation on the token ids of ``feeds`` or, ``sample_from_source``, on text the
        source writes itself (``feeds`` made up for any model, random ids, exercise a language model poorly)."""
        return compare_lm(reference, candidate, None if sample_from_source else feeds, **settings)

    def describe_data(self, options: LMOptions, samples: list[Sample]) -> str:
        tokens = sum(len(s.target) for s in samples)
        return f"{len(samples)} window(s) of held-out text from {Path(options.text).name} ({tokens} tokens)"

    def judge(
        self,
        reference,
        candidate,
        samples: list[Sample],
        options: LMOptions,
        *,
        engine: JobEngine | None = None,
        shard_size: int = lm.SHARD_WINDOWS,
        shard_dir: str | None = None,
        progress: Progress = lambda _: None,
    ) -> Evaluation:
        windows = np.stack([s.target for s in samples])
        source, variant = lm.score_models(
            [reference, candidate],
            windows,
            batch=options.batch,
            engine=engine,
            shard_size=shard_size,
            shard_dir=shard_dir,
            progress=progress,
        )
        values = {
            "kl": variant.kl,
            "top1": variant.top1,
            "loss_increase": variant.loss_increase,
            "loss": variant.loss,
            "perplexity": variant.perplexity,
        }
        values = {k: float("nan") if v is None else float(v) for k, v in values.items()}
        display = {
            "kl": f"{values['kl']:.4f} nats",
            "top1": f"{values['top1']:.2%}",
            "loss_increase": f"{values['loss_increase']:+.2%}",
            "loss": f"{values['loss']:.4f} (source {source.loss:.4f})",
            "perplexity": f"{values['perplexity']:.2f} (source {source.perplexity:.2f})",
        }
        display = {k: ("NaN" if math.isnan(values[k]) else v) for k, v in display.items()}
        rows = [
            {
                "model": s.model,
                "tokens": s.tokens,
                "loss": s.loss,
                "perplexity": s.perplexity,
                "KL": s.kl,
                "top-1": s.top1,
            }
            for s in (source, variant)
        ]
        return Evaluation(values, display, {}, rows, per_sample=dict(variant.per_window))
