"""A language model's scoring, as ``eval-lm`` and the ``lm`` task offer it (the engine: :mod:`onnxsmith.tasks.lm`)."""

from __future__ import annotations

#: Tokens per scored window of held-out text.
DEFAULT_WINDOW = 128
