from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """Run ``python -m onnxsmith ARGS`` as a user would; capture everything."""
    return subprocess.run(
        [sys.executable, "-m", "onnxsmith", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, timeout=600,
    )


@pytest.fixture
def cli():
    return run_cli


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
