"""The errors onnxsmith reports to its users.

Every error that is the user's to fix (bad input, bad options, a failed gate)
is one of these. The CLI turns them into one line on stderr and an exit
status; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os

#: Exit status for bad input, bad options, a bad recipe.
EXIT_BAD_INPUT = 2
#: Exit status for a verification gate that failed (nothing was written).
EXIT_GATE_FAILED = 1
#: Exit status when part of the work could not be done and the rest was (``bench`` of several models).
EXIT_INCOMPLETE = 1


class OnnxsmithError(Exception):
    """An error that names the file it is about and what is wrong with it."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problem: str, path: str | os.PathLike[str] | None = None) -> None:
        self.problem = problem
        self.path = None if path is None else os.fspath(path)
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = " ".join(self.problem.split())  # one line, always
        if not self.path:
            return text
        # A file name need not be UTF-8: undecodable bytes are shown as \xNN, never a crash.
        name = os.fsencode(self.path).decode("utf-8", "backslashreplace")
        return f"{name}: {text}"


class InputError(OnnxsmithError):
    """The input file (model, data, recipe) is missing, unreadable or invalid."""


class UsageError(OnnxsmithError):
    """An option or argument is invalid."""


class OutputError(OnnxsmithError):
    """An output cannot be written where it was asked for (not a regular file, read-only, disk full)."""


class TimeLimitExceeded(OnnxsmithError):
    """A run of a model went past its time limit and was stopped (not an InputError: nothing that retries
    a run another way may take it for a model that failed)."""


class GateFailed(OnnxsmithError):
    """A verification gate refused a variant; nothing was written."""

    exit_code = EXIT_GATE_FAILED


class NothingGained(OnnxsmithError):
    """A transform would write a variant no better than its source (nothing it does applies); nothing was
    written. The problem says why, so a user knows what would change that."""

    exit_code = EXIT_GATE_FAILED


class Incomplete(OnnxsmithError):
    """Part of the work could not be done; what could was done (and written). The problem says what not."""

    exit_code = EXIT_INCOMPLETE
