"""A full disk: the command fails in one line (exit 2) and leaves nothing half-made behind, no variant,
no report, no staging folder, not even the folders made for an output; an earlier output stays as it was.

A folder is made "full" in-process: every os.write to a file in it fails with ENOSPC (the lock file's
pid, a report's text), as on a disk with no room left; one real process runs with RLIMIT_FSIZE.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from onnxsmith.core.errors import OutputError
from onnxsmith.io import files
from tests.conftest import assert_one_line_error
from tests.support.models import mlp

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def full(monkeypatch):
    """``full(folder, names=None)``: os.write into a file under ``folder`` (named one of ``names``, if given)
    fails with ENOSPC from now on."""
    real_write = os.write
    filled: list[tuple[Path, tuple[str, ...] | None]] = []

    def write(fd, data):
        try:
            where = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            where = None
        for folder, names in filled:
            if where is not None and where.is_relative_to(folder) and (names is None or where.name in names):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)

    def fill(folder: Path, names: tuple[str, ...] | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        filled.append((folder.resolve(), names))
        return folder

    return fill


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "src" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(mlp().SerializeToString())
    return path


def _left_in(*folders: Path) -> list[str]:
    """Every file and folder under ``folders`` (hidden ones too), as paths relative to their folder."""
    return sorted(os.path.relpath(p, folder) for folder in folders for p in folder.rglob("*"))


@pytest.mark.parametrize("names", [None, ("r.json",)], ids=["the whole folder", "room for the lock, not the report"])
def test_a_report_on_a_full_disk_leaves_no_variant(cli, source, tmp_path, full, names):
    """The issue's case: fp16 SRC OUT --report <full disk>/r.json wrote OUT, then failed on the report."""
    out = tmp_path / "out" / "model_fp16.onnx"
    disk = full(tmp_path / "disk", names)
    result = cli("fp16", source, out, "--report", disk / "r.json")
    assert_one_line_error(result, "no space left on device")
    assert str(disk) in result.stderr
    assert _left_in(disk, tmp_path / "src") == ["model.onnx"]  # no report, no staging folder
    assert not out.parent.exists()  # no variant, and not the folder made for it


def test_a_report_on_a_full_disk_keeps_the_earlier_variant(cli, source, tmp_path, full):
    out = tmp_path / "out" / "model_fp16.onnx"
    assert cli("shrink", source, out).returncode == 0  # an earlier variant there, other bytes than fp16's
    before = out.read_bytes()
    disk = full(tmp_path / "disk", ("r.json",))
    result = cli("fp16", source, out, "--report", disk / "r.json")
    assert_one_line_error(result, "r.json", "no space left on device")
    assert out.read_bytes() == before and _left_in(out.parent) == ["model_fp16.onnx"] and _left_in(disk) == []


@pytest.mark.parametrize("command", ["shrink", "fp16", "extract"])
def test_a_variant_to_a_full_disk_leaves_no_staging_folder(cli, source, tmp_path, full, command):
    """shrink to a full disk left its private folder: writing the owner file failed and nothing removed it."""
    disk = full(tmp_path / "disk")
    out = disk / "made" / "for" / "it.onnx"
    extra = ("--outputs", "h2") if command == "extract" else ()
    result = cli(command, source, out, *extra)
    assert_one_line_error(result, "no space left on device")
    assert _left_in(disk) == []


def test_a_private_folder_whose_owner_file_cannot_be_written_is_removed(tmp_path, full):
    disk = full(tmp_path / "disk")
    with pytest.raises(OutputError, match="no space left on device"):
        files.new_private_dir(disk)
    with pytest.raises(OutputError, match="no space left on device"), files.staging_dir(disk / "a" / "b"):
        pass
    with pytest.raises(OutputError, match="no space left on device"):
        files.write_text_atomic(disk / "notes.txt", "text")
    assert _left_in(disk) == []


def test_a_report_that_cannot_be_written_leaves_no_file(tmp_path, full):
    disk = full(tmp_path / "disk", ("notes.txt",))
    (disk / "notes.txt").write_text("the earlier notes")
    with pytest.raises(OutputError, match=r"notes\.txt: cannot write: no space left on device"):
        files.write_text_atomic(disk / "notes.txt", "new text")
    assert _left_in(disk) == ["notes.txt"] and (disk / "notes.txt").read_text() == "the earlier notes"


@pytest.mark.parametrize("too_big", ["r.json", "v.onnx"])
def test_a_real_process_whose_files_exceed_its_file_size_limit(cli, source, tmp_path, too_big):
    """RLIMIT_FSIZE: writes past the limit fail (EFBIG; Python ignores SIGXFSZ). The report is written
    before the variant is moved into place, so whichever does not fit, neither stays."""
    sized = tmp_path / "sized"
    assert cli("fp16", source, sized / "v.onnx", "--report", sized / "r.json").returncode == 0
    model, report = (sized / "v.onnx").stat().st_size, (sized / "r.json").stat().st_size
    assert 64 < model < report
    limit = (model + report) // 2 if too_big == "r.json" else model // 2  # a lock file's pid always fits

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out, json_out = tmp_path / "out" / "v.onnx", tmp_path / "reports" / "r.json"
    result = subprocess.run(
        [sys.executable, "-m", "onnxsmith", "fp16", source, out, "--report", json_out],
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=limited,
        timeout=300,
    )
    assert_one_line_error(result, too_big, "file too large")
    assert not out.parent.exists() and not json_out.parent.exists()
    assert _left_in(tmp_path / "src") == ["model.onnx"]
