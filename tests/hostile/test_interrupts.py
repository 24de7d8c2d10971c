"""Interrupted saves: kill -9 leaves a staging folder that the next run in that folder removes; SIGTERM
cleans up on the way out, as Ctrl-C does. Real processes, a 600 MB model (a save that takes a while)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from onnxsmith.io import files
from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from tests.support.models import mlp

WEIGHT_BYTES = 150 * 2**20 * 4
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> Path:
    """y = Gather(w, i): a 600 MB weight no pass can fold away, in an external data file (quick to write)."""
    folder = tmp_path_factory.mktemp("big")
    rows, columns = 150, 2**20  # 2-D: onnx's data propagation takes half a minute over a 1-D tensor this long
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[rows, columns], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "model.onnx.data"), ("offset", "0"), ("length", str(WEIGHT_BYTES))):
        w.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["w", "i"], ["y"], name="gather")],
        "big",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, columns])],
        [w],
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with open(folder / "model.onnx.data", "wb") as f:
        f.truncate(WEIGHT_BYTES)  # zeros; the save still writes every byte
    return path


def _staged_files(folder: Path) -> list[Path]:
    return [p for d in folder.glob(files.STAGING_PREFIX + "*") for p in d.glob("*.onnx*")]


def _wait_for_a_growing_staged_file(process: subprocess.Popen, folder: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        staged = _staged_files(folder)
        if staged and staged[0].stat().st_size > 32 * 2**20:
            return
        if process.poll() is not None:
            raise AssertionError(f"the process ended before its save was under way: {process.communicate()}")
        time.sleep(0.01)
    process.kill()
    raise AssertionError("no staged file grew past 32 MB in time")


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_kill_9_during_a_big_save_leaves_no_output_and_the_next_run_clears_it(big_model, tmp_path):
    out = tmp_path / "out" / "big.onnx"
    script = "import sys; from onnxsmith.io.load import load_model; from onnxsmith.io.save import save_model\n"
    script += "save_model(load_model(sys.argv[1]), sys.argv[2])"
    process = _spawn("-c", script, os.fspath(big_model), os.fspath(out))
    _wait_for_a_growing_staged_file(process, out.parent)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not out.exists()
    [stale] = list(out.parent.glob(files.STAGING_PREFIX + "*"))  # what kill -9 cannot clean
    assert (stale / ".owner").read_text().strip() == str(process.pid)

    small = tmp_path / "small.onnx"
    small.write_bytes(mlp().SerializeToString())
    save_model(load_model(small), out.parent / "next.onnx")  # the next run in that folder
    assert sorted(p.name for p in out.parent.iterdir()) == ["next.onnx"]


def test_sigterm_during_a_save_cleans_up_like_ctrl_c(big_model, tmp_path):
    out = tmp_path / "out" / "big.onnx"
    process = _spawn("-m", "onnxsmith", "shrink", os.fspath(big_model), os.fspath(out), "--samples", "1")
    _wait_for_a_growing_staged_file(process, out.parent)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.strip().splitlines()[-1] == "onnxsmith: terminated" and "Traceback" not in stderr
    assert not out.parent.exists()  # no output, no staging folder, not even the folder made for it


def test_a_live_owners_staging_folder_is_kept(tmp_path):
    live = files.new_private_dir(tmp_path)  # held by this process
    script = f"import os; from onnxsmith.io import files; files.new_private_dir({os.fspath(tmp_path)!r}); os._exit(0)"
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True)  # dies without cleaning up
    assert len(list(tmp_path.glob(files.STAGING_PREFIX + "*"))) == 2
    with files.staging_dir(tmp_path) as mine:
        assert sorted(tmp_path.glob(files.STAGING_PREFIX + "*")) == sorted([live, mine])
    files.remove_private_dir(live)
    assert list(tmp_path.iterdir()) == []


def test_a_staging_folder_without_its_lock_file_is_left_until_it_is_old(tmp_path):
    """Between mkdtemp and the lock there is a moment without a lock file: a young one may be in use."""
    young = tmp_path / (files.STAGING_PREFIX + "young")
    old = tmp_path / (files.STAGING_PREFIX + "old")
    young.mkdir()
    old.mkdir()
    long_ago = time.time() - 2 * 3600
    os.utime(old, (long_ago, long_ago))
    files.remove_stale_dirs(tmp_path)
    assert young.exists() and not old.exists()


def test_stale_folders_are_only_ours(tmp_path):
    """Folders of other names, and files or links that look like ours, are never touched."""
    (tmp_path / "keep").mkdir()
    (tmp_path / (files.STAGING_PREFIX + "file")).write_text("x")
    (tmp_path / (files.STAGING_PREFIX + "link")).symlink_to(tmp_path / "keep")
    old = time.time() - 2 * 3600
    for p in tmp_path.iterdir():
        os.utime(p, (old, old), follow_symlinks=False)
    files.remove_stale_dirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["keep", files.STAGING_PREFIX + "file", files.STAGING_PREFIX + "link"]
    )
