"""Language models, in one package: feeding a decoder, scoring it on text, and the LM gate.

* :mod:`.feeding`: inputs for token ids (:func:`lm_feeds`, after a KV cache :func:`lm_feeds_at`) and
  :class:`LMRunner` (logits);
* :mod:`.scoring`: held-out text in windows, loss / perplexity / KL / top-1 of models on it,
  greedy generation (``eval-lm``, the quantize benchmark);
* :mod:`.gate`: the gate ``quantize`` names (:func:`compare_lm`: next-token KL and top-1
  agreement on sequences sampled from the source, in one run, step by step through the KV cache and
  in greedy generation);
* :mod:`.task`: the ``lm`` task of ``validate`` and a recipe's ``[validation]``.

What a decoder takes and returns is read statically (:mod:`onnxsmith.analysis.lm_signature`).
"""

from onnxsmith.analysis.lm_signature import IDS, MASK, POSITIONS, LMSignature, PastInput, lm_signature
from onnxsmith.tasks.lm.feeding import LMRunner, lm_feeds, lm_feeds_at, log_softmax, present_names
from onnxsmith.tasks.lm.gate import (
    DEFAULT_MAX_KL,
    DEFAULT_MIN_GENERATION,
    DEFAULT_MIN_TOP1,
    GENERATED_TOKENS,
    Agreement,
    Generation,
    LMComparison,
    compare_lm,
    generation_judgement,
    sample_sequences,
)
from onnxsmith.tasks.lm.scoring import (
    DEFAULT_WINDOW,
    FOLDER_FILES,
    TOKENIZER_FILE,
    LMScore,
    TextScores,
    folder_of,
    greedy_generate,
    load_tokenizer,
    model_labels,
    read_text,
    score_models,
    score_text,
    split_pieces,
    text_pieces,
    text_windows,
)
from onnxsmith.tasks.lm.task import LanguageModel, LMOptions

__all__ = [
    "DEFAULT_MAX_KL",
    "DEFAULT_MIN_GENERATION",
    "DEFAULT_MIN_TOP1",
    "DEFAULT_WINDOW",
    "FOLDER_FILES",
    "GENERATED_TOKENS",
    "IDS",
    "MASK",
    "POSITIONS",
    "TOKENIZER_FILE",
    "Agreement",
    "Generation",
    "LMComparison",
    "LMOptions",
    "LMRunner",
    "LMScore",
    "LMSignature",
    "LanguageModel",
    "PastInput",
    "TextScores",
    "compare_lm",
    "folder_of",
    "generation_judgement",
    "greedy_generate",
    "lm_feeds",
    "lm_feeds_at",
    "lm_signature",
    "load_tokenizer",
    "log_softmax",
    "model_labels",
    "present_names",
    "read_text",
    "sample_sequences",
    "score_models",
    "score_text",
    "split_pieces",
    "text_pieces",
    "text_windows",
]
