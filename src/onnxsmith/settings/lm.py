"""A language model's scoring, as ``eval-lm`` and the ``lm`` task offer it, and the ``lm`` task's settings
(the engine: :mod:`onnxsmith.tasks.lm`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnxsmith.core.options import SHARE, TOLERANCE, option
from onnxsmith.settings import TaskSettings

#: Tokens per scored window of held-out text.
DEFAULT_WINDOW = 128

#: The LM gate's bounds (tasks/lm/gate.py compare_lm's keywords): what each means and the numbers it takes.
_LM_GATE_BOUNDS = {
    "max_kl": ("mean KL(source || variant) of next-token distributions at most this, nats", TOLERANCE),
    "min_top1": ("top-1 agreement with the source at least this", SHARE),
    "min_generation": (
        "the mean share of the source's greedy tokens the variant repeats before it first differs, at least this",
        SHARE,
    ),
}


def lm_gate_bound(name: str, default: float, where: str = "gate") -> Any:
    """A field for one of the LM gate's bounds, declared once for every transform it judges (each with its
    own default); ``where`` begins the help: which variants it bounds."""
    words, number = _LM_GATE_BOUNDS[name]
    return option(default, f"{where}: {words}", number=number)


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
