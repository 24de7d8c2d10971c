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


class OnnxsmithError(Exception):
    """An error that names the file it is about and what is wrong with it."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problem: str, path: str | os.PathLike | None = None) -> None:
        self.problem = problem
        self.path = None if path is None else os.fspath(path)
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = " ".join(self.problem.split())  # one line, always
        return f"{self.path}: {text}" if self.path else text


class InputError(OnnxsmithError):
    """The input file (model, data, recipe) is missing, unreadable or invalid."""


class UsageError(OnnxsmithError):
    """An option or argument is invalid."""


class GateFailed(OnnxsmithError):
    """A verification gate refused a variant; nothing was written."""

    exit_code = EXIT_GATE_FAILED
