"""Language models: text in, next tokens out; how good a (quantized) model is on held-out text.

The function API (what ``eval-lm``, the quantize benchmark and a build's ``lm`` task use):

* :func:`folder_of` / :func:`load_tokenizer`: a model folder laid out as transformers.js
  and optimum expect (``onnx/model*.onnx`` beside ``tokenizer.json``, ``config.json``);
* :func:`text_windows`: held-out text tokenized with the folder's tokenizer, cut into
  windows of ``window`` tokens;
* :func:`score_models`: each model's loss (mean next-token negative log-likelihood,
  nats), perplexity, and against a reference model (the fp32 source) the mean KL
  divergence of the next-token distributions and top-1 agreement;
* :func:`greedy_generate`: greedy decoding with the KV cache, the way a client runs
  the published model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.core.transform import JobEngine
from onnxsmith.core.version import __version__
from onnxsmith.execution.engine import LocalEngine
from onnxsmith.execution.store import ShardStore, map_kept, store_key, whole_batches
from onnxsmith.io import paths
from onnxsmith.io.files import sha256_file
from onnxsmith.io.load import source_files
from onnxsmith.runtime import runner
from onnxsmith.settings.lm import DEFAULT_WINDOW
from onnxsmith.tasks.lm.feeding import LMRunner, log_softmax
from onnxsmith.tasks.lm.gate import Agreement

TOKENIZER_FILE = "tokenizer.json"
#: Files of a model folder that describe the model rather than hold it (copied beside variants).
FOLDER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    # an instruct model's chat template: newer transformers saves it here rather than in tokenizer_config.json,
    # and a published folder without it cannot format a conversation
    "chat_template.jinja",
)


def folder_of(model_path: str | os.PathLike) -> Path:
    """The model folder of an .onnx file: the parent of ``onnx/``, else the file's own folder."""
    parent = Path(model_path).resolve().parent
    return parent.parent if parent.name == "onnx" else parent


def load_tokenizer(path: str | os.PathLike):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json or the folder holding one."""
    from tokenizers import Tokenizer

    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not os.path.lexists(file):
        raise InputError(
            f"no {TOKENIZER_FILE} here: text is tokenized with the model folder's tokenizer (pass --tokenizer FILE)",
            path,
        )
    text = paths.read_text(file, "tokenizer")  # a regular file: a fifo is refused, never waited on
    try:
        return Tokenizer.from_str(text)
    except Exception as err:  # tokenizers raises plain Exceptions
        raise InputError(f"not a readable tokenizer.json ({str(err).splitlines()[0]})", file) from None


def read_text(path: str | os.PathLike) -> str:
    return paths.read_text(path, "text")


#: Text is tokenized in pieces of about this many characters: a tokenizer holds ~150 bytes per character of
#: what it is given at once, so a 200 MB one-line file handed over whole needs ~30 GB (the process died).
TEXT_PIECE = 1 << 20


def text_pieces(path: str | os.PathLike, *, piece: int = TEXT_PIECE) -> Iterator[str]:
    """The text of a UTF-8 file in pieces of about ``piece`` characters (:func:`split_pieces`), read as
    they are needed: memory stays bounded however long the file, or its one line, is."""
    with paths.open_readable(path, "text") as raw:
        stream = io.TextIOWrapper(raw, encoding="utf-8", newline="")  # newlines as paths.read_text keeps them
        try:
            yield from split_pieces(iter(lambda: stream.read(piece), ""))
        except UnicodeDecodeError as err:
            raise InputError(f"the text is not UTF-8 text ({err})", path) from None
        except OSError as err:
            raise InputError(f"cannot read the text ({err})", path) from None


def split_pieces(chunks: Iterable[str], *, longest: int = 4 * TEXT_PIECE) -> Iterator[str]:
    """``chunks`` of a text re-cut right before the last whitespace that precedes a word in each, so that a
    piece never ends inside a word or a run of spaces: tokenizers' pre-tokenizers split text there, and
    the pieces' tokens are the whole text's. Text with no such place is carried on to the next chunk up to
    ``longest`` characters, then cut where it ends (a "word" that long has no right place to cut)."""
    carry = ""
    for chunk in chunks:
        text = carry + chunk
        cut = _last_word_start(text)
        if cut <= 0:
            if len(text) < longest:
                carry = text
                continue
            cut = len(text)
        carry = text[cut:]
        yield text[:cut]
    if carry:
        yield carry


def _string_pieces(text: str) -> Iterator[str]:
    return split_pieces(text[i : i + TEXT_PIECE] for i in range(0, len(text), TEXT_PIECE))


_WORD_START = re.compile(r"\s(?=\S)")


def _last_word_start(text: str) -> int:
    """The index of the last whitespace character that is followed by a non-whitespace one; -1 if none
    (searched in a growing tail: near the end in ordinary text, a few passes over one without spaces)."""
    tail = 4096
    while True:
        start = max(0, len(text) - tail)
        starts = [m.start() for m in _WORD_START.finditer(text, start)]
        if starts:
            return starts[-1]
        if start == 0:
            return -1
        tail *= 16


def text_windows(
    tokenizer,
    text: str | Iterable[str],
    *,
    window: int = DEFAULT_WINDOW,
    max_windows: int | None = None,
    label: str | os.PathLike | None = None,
) -> np.ndarray:
    """[n, window] token ids: the text (a string, or its pieces: :func:`text_pieces`) encoded (no special
    tokens) and cut into whole windows. It is encoded piece by piece (a long string cut by
    :func:`split_pieces`), and no further than ``max_windows`` windows need."""
    if window < 2:
        raise UsageError("the window must be at least 2 tokens")
    pieces = _string_pieces(text) if isinstance(text, str) else text
    needed = None if max_windows is None else max_windows * window
    parts, count = [], 0
    for piece in pieces:
        parts.append(np.asarray(tokenizer.encode(piece, add_special_tokens=False).ids, dtype=np.int64))
        count += parts[-1].size
        if needed is not None and count >= needed:
            break
    ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if ids.size < 2:
        raise InputError(f"the text has {ids.size} token(s); at least 2 are needed", label)
    if ids.size < window:
        return ids[None]
    n = ids.size // window
    if max_windows is not None:
        n = min(n, max_windows)
    return ids[: n * window].reshape(n, window)


@dataclass
class LMScore:
    """One model on the text: loss (nats/token), perplexity, and agreement with the reference."""

    model: str
    tokens: int  # next-token predictions scored
    loss: float
    perplexity: float
    kl: float | None = None  # mean KL(reference || model), nats
    top1: float | None = None  # fraction of positions where both rank the same token first
    loss_increase: float | None = None  # (loss - reference loss) / reference loss
    #: "loss", and against the reference "kl" and "top1", of each window in turn: the same means over one
    #: window's positions (windows are all as long, so their mean is the model's); not in the JSON
    per_window: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        data = asdict(self)
        del data["per_window"]
        return data


#: Windows a shard of :func:`score_models` holds (rounded up to whole batches).
SHARD_WINDOWS = 64


def score_models(
    paths: list[str | os.PathLike],
    windows: np.ndarray,
    *,
    reference: int = 0,
    batch: int = 4,
    threads: int | None = None,
    configs: list[dict[str, str] | None] | None = None,
    progress: Callable[[str], None] = lambda _: None,
    engine: JobEngine | None = None,
    shard_size: int = SHARD_WINDOWS,
    shard_dir: str | os.PathLike | None = None,
) -> list[LMScore]:
    """Loss and perplexity of each model on ``windows``; KL and top-1 against ``paths[reference]``.

    ``configs``: onnxruntime session options per model (e.g. session.disable_quant_qdq=1, to
    score a q4 model with the arithmetic onnxruntime-web runs it with). ``engine``: where the windows are
    scored, in shards of about ``shard_size`` windows (whole batches; None: this process). The batches' sums
    are added up in the windows' order on every engine, so the scores are the same digit for digit.
    ``shard_dir``: each shard's sums kept there (execution/store.py), so a rerun resumes from what is done.
    """
    scorer = WindowScorer(tuple(os.fspath(p) for p in paths), reference, batch, threads, configs)
    per_shard = whole_batches(shard_size, batch)
    shards = [windows[i : i + per_shard] for i in range(0, len(windows), per_shard)]
    store = None if shard_dir is None else ShardStore(shard_dir, _store_key(scorer, windows, per_shard))
    done = [0]

    def kept(index: int) -> None:
        done[0] += len(shards[index])

    def arrived(index: int, _: list[_Batch]) -> None:
        kept(index)
        progress(f"windows {done[0]}/{len(windows)}")

    results = map_kept(
        engine or LocalEngine(),
        scorer,
        shards,
        store,
        arrived,
        on_kept=kept,
        encode=lambda batches: [b.to_arrays() for b in batches],
        decode=lambda kept: [_Batch.from_arrays(b) for b in kept],
    )
    return _scores(paths, [b for part in results for b in part], reference, len(windows))


def _store_key(scorer: WindowScorer, windows: np.ndarray, per_shard: int) -> str:
    """What the scores depend on: every model's bytes, the windows, how the models are run, the shards."""
    files = [[sha256_file(f) for f in sorted(source_files(runner.load_runnable(p), p))] for p in scorer.paths]
    return store_key(
        files=files,
        windows=hashlib.sha256(np.ascontiguousarray(windows).tobytes()).hexdigest(),
        shape=list(windows.shape),
        reference=scorer.reference,
        batch=scorer.batch,
        configs=scorer.configs,
        shard=per_shard,
        onnxsmith=__version__,
    )


@dataclass
class _Batch:
    """A batch of windows scored by every model: what adds up over batches."""

    nll: list[float]  # per model: the sum of its next-token log-likelihood over the batch's positions
    window_nll: list[np.ndarray]  # per model: each window's mean NLL
    agreements: list[Agreement | None]  # per model: against the reference's (None: the reference)
    positions: int

    def to_arrays(self) -> dict[str, np.ndarray]:
        """As arrays only (a kept shard is an .npz that is read without pickle)."""
        arrays = {"nll": np.asarray(self.nll, np.float64), "positions": np.asarray(self.positions)}
        for i, (window, agreement) in enumerate(zip(self.window_nll, self.agreements)):
            arrays[f"window_nll.{i}"] = window
            if agreement is not None:
                arrays |= {f"{what}.{i}": getattr(agreement, what) for what in ("kl", "top1", "entropy")}
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> _Batch:
        models = range(len(arrays["nll"]))
        agreements = [
            Agreement(arrays[f"kl.{i}"], arrays[f"top1.{i}"], arrays[f"entropy.{i}"]) if f"kl.{i}" in arrays else None
            for i in models
        ]
        window_nll = [arrays[f"window_nll.{i}"] for i in models]
        return cls([float(v) for v in arrays["nll"]], window_nll, agreements, int(arrays["positions"]))


@dataclass
class WindowScorer:
    """A worker: every model's session (opened on its first shard), a shard of windows in, its batches' sums out."""

    paths: tuple[str, ...]
    reference: int = 0
    batch: int = 4
    threads: int | None = None
    configs: list[dict[str, str] | None] | None = None
    _runners: list[LMRunner] | None = field(default=None, repr=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_runners": None}  # sessions are opened where the scorer runs

    def with_threads(self, threads: int) -> WindowScorer:
        return dataclasses.replace(self, threads=threads, _runners=None)

    def _opened(self) -> list[LMRunner]:
        if self._runners is None:
            runners = []
            for path, config in zip(self.paths, self.configs or [None] * len(self.paths)):
                lm = LMRunner(path, threads=self.threads, config=config)
                if lm.sig.last_only:
                    raise InputError(
                        "returns logits for the last position only; evaluate its full-logits twin "
                        "(model_*_full.onnx, which `onnxsmith quantize` writes beside it)",
                        path,
                    )
                runners.append(lm)
            self._runners = runners
        return self._runners

    def __call__(self, windows: np.ndarray) -> list[_Batch]:
        runners = self._opened()
        return [self._batch(runners, windows[i : i + self.batch]) for i in range(0, len(windows), self.batch)]

    def _batch(self, runners: list[LMRunner], chunk: np.ndarray) -> _Batch:
        targets = chunk[:, 1:]
        logits = [lm.logits(chunk)[:, :-1] for lm in runners]
        scored = _Batch([], [], [], int(targets.size))
        for i, value in enumerate(logits):
            if value.shape[-1] <= int(chunk.max()):
                raise InputError(
                    f"the text has token id {int(chunk.max())}, past the model's vocabulary of "
                    f"{value.shape[-1]}; is this the model's tokenizer?",
                    self.paths[i],
                )
            logp_targets = np.take_along_axis(log_softmax(value), targets[..., None], axis=-1)
            scored.nll.append(float(logp_targets.sum()))
            scored.window_nll.append(-logp_targets.reshape(len(chunk), -1).mean(axis=1))
            scored.agreements.append(None if i == self.reference else Agreement.of(logits[self.reference], value))
        return scored

    def close(self) -> None:
        self._runners = None


def _scores(paths: list[str | os.PathLike], batches: list[_Batch], reference: int, windows: int) -> list[LMScore]:
    """Each model's score from its batches' sums, added up in the windows' order."""
    nll = [0.0] * len(paths)
    count = 0
    for scored in batches:
        for i, value in enumerate(scored.nll):
            nll[i] -= value
        count += scored.positions
    scores = []
    for i, label in enumerate(model_labels(paths)):
        loss = nll[i] / count
        score = LMScore(model=label, tokens=count, loss=loss, perplexity=math.exp(loss))
        score.per_window["loss"] = [float(v) for b in batches for v in b.window_nll[i]]
        if i != reference:
            agreement = Agreement.concat([b.agreements[i] for b in batches if b.agreements[i] is not None])
            score.kl = float(agreement.kl.mean())
            score.top1 = float(agreement.top1.mean())
            for what in ("kl", "top1"):  # positions in window order, as many per window
                per_window = getattr(agreement, what).reshape(windows, -1).mean(axis=1)
                score.per_window[what] = [float(v) for v in per_window]
            score.loss_increase = (loss - nll[reference] / count) / (nll[reference] / count)
        scores.append(score)
    return scores


def model_labels(paths: list[str | os.PathLike]) -> list[str]:
    """Each path's shortest suffix that no other path ends with: the file name, unless several share it
    (``q4/model.onnx`` and ``fp32/model.onnx``, where the names alone would make the rows indistinguishable).
    The same file named twice keeps its name; a path that is all of another's suffix is shown whole."""
    parts = [Path(os.path.abspath(p)).parts for p in paths]  # ``./a`` and ``a`` are one file

    def shared(mine: tuple[str, ...], k: int) -> bool:
        return any(theirs != mine and theirs[-k:] == mine[-k:] for theirs in parts)

    labels = []
    for mine in parts:
        k = 1
        while k < len(mine) - 1 and shared(mine, k):  # parts[0] is the root: mine[-(len - 1):] is all but it
            k += 1
        labels.append(os.path.join(*mine) if shared(mine, k) else "/".join(mine[-k:]))
    return labels


@dataclass(frozen=True)
class TextScores:
    """Models scored on one held-out text (``eval-lm``): the first is the reference."""

    text: str  # the text file's name
    windows: int
    window: int  # tokens per window
    reference: str
    session_config: dict[str, str]
    scores: list[LMScore]

    def to_json(self) -> dict:
        return {
            "text": self.text,
            "windows": self.windows,
            "window": self.window,
            "reference": self.reference,
            "session_config": self.session_config,
            "scores": [s.to_json() for s in self.scores],
        }


def score_text(
    paths: list[str | os.PathLike],
    text: str | os.PathLike,
    *,
    tokenizer: str | os.PathLike | None = None,
    window: int = DEFAULT_WINDOW,
    max_windows: int | None = None,
    threads: int | None = None,
    session_config: dict[str, str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> TextScores:
    """Every model on the windows of a text file, tokenized with ``tokenizer`` (default: the first
    model's folder's); ``session_config``: onnxruntime session config entries every model gets."""
    if not paths:
        raise UsageError("no models to score")
    windows = text_windows(
        load_tokenizer(tokenizer or folder_of(paths[0])),
        text_pieces(text),
        window=window,
        max_windows=max_windows,
        label=text,
    )
    config = dict(session_config or {})
    scores = score_models(paths, windows, threads=threads, progress=progress, configs=[config or None] * len(paths))
    return TextScores(
        text=Path(text).name,
        windows=int(windows.shape[0]),
        window=int(windows.shape[1]),
        reference=scores[0].model,
        session_config=config,
        scores=scores,
    )


def greedy_generate(
    path: str | os.PathLike, prompt: list[int], new_tokens: int, *, config: dict[str, str] | None = None
) -> list[int]:
    """Greedy decoding: the prompt in one run, then one token per run through the KV cache
    (or the whole sequence again for a model without one). Returns the new token ids."""
    if not prompt:
        raise UsageError("the prompt needs at least one token")
    return LMRunner(path, config=config).greedy(np.asarray([prompt]), new_tokens)[0].tolist()
