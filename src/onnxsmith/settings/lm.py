"""A language model's scoring, as ``eval-lm`` and the ``lm`` task offer it, and the ``lm`` task's settings
(the engine: :mod:`onnxsmith.tasks.lm`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxsmith.core.options import option
from onnxsmith.settings import TaskSettings

#: Tokens per scored window of held-out text.
DEFAULT_WINDOW = 128


@dataclass
class LMOptions:
    text: str | None = field(
        default=None, metadata={"help": "held-out text, UTF-8 (default: none; the task needs one)", "path": True}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "tokenizer.json (default: the source's model folder's)", "path": True}
    )
    window: int = option(DEFAULT_WINDOW, "tokens per scored window")
    max_windows: int | None = option(16, "score at most this many windows")
    batch: int = option(4, "windows per inference run")

    def validate(self) -> None:
        if self.window < 2 or self.batch < 1 or (self.max_windows is not None and self.max_windows < 1):
            raise ValueError("window must be >= 2, batch and max_windows >= 1")


LM = TaskSettings(
    "lm", "held-out text -> next tokens; loss, perplexity, KL from the source, top-1 agreement", LMOptions
)
