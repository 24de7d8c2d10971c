from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def run_cli(*args, cwd=None, preexec_fn=None) -> subprocess.CompletedProcess:
    """Run ``python -m onnxsmith ARGS`` as a user would; capture everything. ``preexec_fn``: set up the child
    (a resource limit) before it starts."""
    return subprocess.run(
        [sys.executable, "-m", "onnxsmith", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        preexec_fn=preexec_fn,
    )


def run_cli_in_process(*args, cwd=None) -> subprocess.CompletedProcess:
    """The same as :func:`run_cli` without starting a Python (imports take seconds)."""
    import contextlib
    import io
    import os

    from onnxsmith.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else 2
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(["onnxsmith", *map(str, args)], code, stdout.getvalue(), stderr.getvalue())


@pytest.fixture
def cli():
    """Run the CLI in this process; tests that need a real process use :func:`run_cli`."""
    return run_cli_in_process


@pytest.fixture
def save_proto(tmp_path):
    """Write an onnx.ModelProto to tmp_path/NAME and return the path."""

    def save(proto: onnx.ModelProto, name: str = "model.onnx") -> Path:
        path = tmp_path / name
        onnx.save(proto, path)
        return path

    return save


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str, code: int = 2) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("onnxsmith: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
