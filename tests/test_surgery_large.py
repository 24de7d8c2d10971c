"""Past protobuf's 2 GB: extract a piece and shrink it through external data, weights never held twice.

(Writing past 2 GB is save_model's: tests/test_io.py and test_extract's automatic external data.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

from tests.support.surgery_models import write_big_external

# Both commands in one child, so its peak RSS covers them and no other process.
_SCRIPT = """
import sys
from onnxsmith.cli.main import main
source, piece, shrunk, feeds, report = sys.argv[1:]
code = main(["extract", source, piece, "--inputs", "h", "--outputs", "y", "--input-data", feeds,
             "--report", report + ".extract"])
code = code or main(["shrink", piece, shrunk, "--samples", "1", "--external-data", "--report", report + ".shrink"])
# This process's own peak (VmHWM): ru_maxrss would include the forking test worker's memory.
status = open("/proc/self/status").read()
print("VmHWM", int(status.split("VmHWM:")[1].split()[0]) * 1024)
sys.exit(code)
"""


def _files(path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(path.parent.glob(path.name + "*"))}


@pytest.mark.slow
def test_extract_and_shrink_over_2gb_in_bounded_memory(tmp_path):
    source = tmp_path / "big.onnx"
    model_bytes = write_big_external(source)
    assert model_bytes > 2**31
    feeds = tmp_path / "ids.npz"
    np.savez(feeds, ids=np.array([[1, 5, 9, 63]], np.int64))  # rows of W1 that hold real values
    piece, shrunk, report = tmp_path / "piece.onnx", tmp_path / "shrunk.onnx", tmp_path / "report"
    try:
        with open(tmp_path / "log", "w") as log:
            child = subprocess.run(
                [sys.executable, "-c", _SCRIPT, source, piece, shrunk, feeds, report],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        output = (tmp_path / "log").read_text()
        assert child.returncode == 0, output
        peak = int(output.split("VmHWM")[-1].split()[0])
        print(f"\npeak RSS of extract + shrink: {peak / 2**20:.0f} MB for a {model_bytes / 2**30:.2f} GB model")
        assert peak < model_bytes / 2  # well under twice the model: under half of it

        # The piece reads W2 only: W1 (1.65 GB) is not copied. Its weights stay beside it, like the source's.
        extracted = json.loads((tmp_path / "report.extract").read_text())
        assert extracted["verification"]["passed"]
        assert extracted["initializers"]["bytes"] < 600 * 2**20 < extracted["initializers"]["source_bytes"]
        assert list(_files(piece)) == ["piece.onnx", "piece.onnx.data"]
        assert sum(_files(piece).values()) < 600 * 2**20

        # The piece's fp64 scale is stored as fp32; the 0.55 GB table is streamed through, not held.
        shrink = json.loads((tmp_path / "report.shrink").read_text())
        assert shrink["verification"]["passed"]
        assert list(_files(shrunk)) == ["shrunk.onnx", "shrunk.onnx.data"]
        proto = onnx.load(shrunk, load_external_data=False)
        assert {t.name: t.data_type for t in proto.graph.initializer}.get("scale64") == onnx.TensorProto.FLOAT
    finally:
        for path in tmp_path.iterdir():  # several GB: do not leave them to pytest's retention
            shutil.rmtree(path) if path.is_dir() else path.unlink()
