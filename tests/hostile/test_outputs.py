"""Where outputs go: never over (or in place of) a file a source reads, never over a device, fifo,
socket or folder, and an output that cannot be written is refused before any work, in one line."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from tests.conftest import assert_one_line_error
from tests.support.models import mlp


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source(folder: Path, *, hidden: int = 16, external: bool = False, name: str = "model.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    plain = folder / ".plain.onnx"
    plain.write_bytes(mlp(hidden=hidden).SerializeToString())
    path = folder / name
    save_model(load_model(plain), path, external_data=external)
    plain.unlink()
    return path


# ---- 1. the files a source reads are never overwritten or removed -----------------------------------


def test_a_source_data_file_named_like_the_outputs_is_kept(cli, tmp_path):
    """The issue's case: hf/model_fp32.onnx reads hf/model.onnx.data; fp16 writes hf/model.onnx."""
    hf = tmp_path / "hf"
    _source(hf, external=True)
    (hf / "model.onnx").rename(hf / "model_fp32.onnx")
    data = hf / "model.onnx.data"
    before = _sha(data)

    result = cli("fp16", hf / "model_fp32.onnx", hf / "model.onnx")
    assert result.returncode == 0, result.stderr
    assert _sha(data) == before
    assert cli("compare", hf / "model_fp32.onnx", hf / "model_fp32.onnx").returncode == 0  # the source still runs

    written = _sha(hf / "model.onnx")
    result = cli("fp16", hf / "model_fp32.onnx", hf / "model.onnx", "--external-data")
    assert_one_line_error(result, "model.onnx.data", "refusing to overwrite")
    assert _sha(data) == before and _sha(hf / "model.onnx") == written


def test_the_replaced_models_own_data_file_goes_with_it(cli, tmp_path):
    source = _source(tmp_path / "src")
    out = _source(tmp_path / "out", external=True)  # an earlier external save of the output
    assert (tmp_path / "out" / "model.onnx.data").exists()
    assert cli("fp16", source, out).returncode == 0
    assert not (tmp_path / "out" / "model.onnx.data").exists()
    assert cli("inspect", out).returncode == 0


def test_a_data_file_the_source_reads_stays_even_when_the_replaced_model_read_it_too(cli, tmp_path):
    """other.onnx (the source) and the old out.onnx both read out.onnx.data: it must stay."""
    folder = tmp_path / "m"
    _source(folder, external=True, name="out.onnx")
    (folder / "other.onnx").write_bytes((folder / "out.onnx").read_bytes())
    data = folder / "out.onnx.data"
    before = _sha(data)
    assert cli("fp16", folder / "other.onnx", folder / "out.onnx").returncode == 0
    assert _sha(data) == before
    assert cli("compare", folder / "other.onnx", folder / "out.onnx", "--atol", "1", "--rtol", "1").returncode == 0


@pytest.mark.parametrize("slot", ["output", "report"])
@pytest.mark.parametrize(
    "target", ["the source", "its data file", "a hard link to the source", "a symlink to its data"]
)
def test_no_output_lands_on_a_file_the_source_reads(cli, tmp_path, slot, target):
    source = _source(tmp_path / "src", external=True)
    data = source.with_name("model.onnx.data")
    if target == "the source":
        aim = source
    elif target == "its data file":
        aim = data
    elif target == "a hard link to the source":
        aim = tmp_path / "linked.onnx"
        os.link(source, aim)
    else:
        aim = tmp_path / "linked.data"
        aim.symlink_to(data)
    hashes = {p: _sha(p) for p in (source, data)}
    args = ["fp16", source, aim] if slot == "output" else ["fp16", source, tmp_path / "v.onnx", "--report", aim]
    assert_one_line_error(cli(*args), aim.name, "refusing to overwrite")
    assert {p: _sha(p) for p in hashes} == hashes
    assert not (tmp_path / "v.onnx").exists()


def test_two_outputs_on_one_file_are_refused(cli, tmp_path):
    source = _source(tmp_path / "src")
    out = tmp_path / "v.onnx"
    assert_one_line_error(cli("fp16", source, out, "--report", out), "v.onnx", "two outputs")
    assert not out.exists()


# ---- 2. external data outside the model's folder: never read, never linked or copied anywhere ----------


def test_extract_never_places_a_file_outside_its_private_folder(cli, tmp_path):
    """The issue's case: location '../victim.bin' once became out/victim.bin, left after exit 2."""
    from tests.hostile.broken import _escape_outside

    folder = tmp_path / "m"
    folder.mkdir()
    model = _escape_outside(folder)
    victim = tmp_path / "victim.bin"
    before = _sha(victim)
    result = cli("extract", model, tmp_path / "out" / "piece.onnx", "--outputs", "y")
    assert_one_line_error(result, "model.onnx", "'..'", "inside its own folder")
    assert _sha(victim) == before
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("location", ["../victim.bin", "/etc/hostname", "a/../../victim.bin"])
def test_the_exposed_folder_never_joins_an_escaping_location(tmp_path, location):
    from onnxsmith.core.errors import InputError
    from onnxsmith.probes.exposed import _linked_folder

    source = tmp_path / "data.bin"
    source.write_bytes(b"\0" * 8)
    near = tmp_path / "near"
    near.mkdir()
    listing = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(InputError, match=r"absolute|'\.\.'"), _linked_folder({location: source}, [near]):
        pass
    assert sorted(p.name for p in tmp_path.rglob("*")) == listing


# ---- 3. outputs that exist and are not regular files --------------------------------------------------


def _special(kind: str, path: Path) -> contextlib.AbstractContextManager:
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.fspath(path))
        return contextlib.closing(sock)
    elif kind == "character device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        except PermissionError as err:
            pytest.skip(f"cannot make a device node here ({err}); the symlink to /dev/null case covers the check")
    elif kind == "symlink to /dev/null":
        path.symlink_to("/dev/null")
    return contextlib.nullcontext()


@pytest.mark.parametrize("slot", ["output", "report"])
@pytest.mark.parametrize("kind", ["folder", "fifo", "socket", "character device", "symlink to /dev/null"])
def test_an_output_that_is_not_a_regular_file_is_refused(cli, tmp_path, slot, kind):
    source = _source(tmp_path / "src")
    aim = tmp_path / "special"
    with _special(kind, aim):
        mode = os.stat(aim).st_mode
        args = ["fp16", source, aim] if slot == "output" else ["fp16", source, tmp_path / "v.onnx", "--report", aim]
        result = cli(*args)
        assert_one_line_error(result, "special", "not a regular file")
        assert os.stat(aim).st_mode == mode and os.path.islink(aim) == (kind == "symlink to /dev/null")
    assert not (tmp_path / "v.onnx").exists()


def test_dev_null_is_never_replaced(cli, tmp_path):
    """`onnxsmith fp16 m.onnx /dev/null` (as root) once replaced /dev/null by the atomic rename."""
    source = _source(tmp_path / "src")
    before = os.stat("/dev/null")
    assert_one_line_error(cli("fp16", source, "/dev/null"), "/dev/null", "a character device")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


# ---- 5. unwritable outputs: one line, exit 2, before any work ----------------------------------------


@pytest.mark.parametrize("slot", ["output", "report"])
@pytest.mark.parametrize("case", ["parent is a file", "empty path", "broken symlink as a parent"])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(cli, tmp_path, slot, case):
    source = _source(tmp_path / "src")
    if case == "parent is a file":
        (tmp_path / "file.txt").write_text("x")
        aim, phrase = tmp_path / "file.txt" / "v2.onnx", "is a file, not a folder"
    elif case == "empty path":
        aim, phrase = "", "the output path is empty"
    else:
        (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
        aim, phrase = tmp_path / "gone" / "v2.onnx", "broken symbolic link"
    args = ["fp16", source, aim] if slot == "output" else ["fp16", source, tmp_path / "v.onnx", "--report", aim]
    assert_one_line_error(cli(*args), phrase)
    assert not (tmp_path / "v.onnx").exists()  # the variant is not written when its report cannot be


@contextlib.contextmanager
def _tmpfs(folder: Path, options: str):
    """A small tmpfs mounted at ``folder``, or a skip that says why it cannot be mounted here."""
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", os.fspath(folder)], capture_output=True)
    if done.returncode != 0:
        reason = (done.stderr.decode(errors="replace").strip() or "mount failed").splitlines()[-1]
        print(f"cannot mount a tmpfs here: {reason}")
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {reason}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", os.fspath(folder)], check=False)


def test_a_full_disk_is_one_line_and_leaves_nothing(cli, tmp_path):
    source = _source(tmp_path / "src", hidden=4096)  # 192 KB of weights
    with _tmpfs(tmp_path / "small", "size=64k") as small:
        result = cli("shrink", source, small / "v.onnx")
        assert_one_line_error(result, "v.onnx", "no space left on device")
        assert list(small.iterdir()) == []  # no staging folder, no half file


def test_a_read_only_file_system_is_refused_before_any_work(cli, tmp_path):
    source = _source(tmp_path / "src")
    with _tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        assert_one_line_error(cli("fp16", source, ro / "v.onnx"), "read-only file system")
        assert_one_line_error(
            cli("fp16", source, tmp_path / "v.onnx", "--report", ro / "r.json"), "read-only file system"
        )
    assert not (tmp_path / "v.onnx").exists()


def test_file_names_that_are_not_utf8_work(tmp_path):
    """A real process whose stdout refuses what it cannot encode (as a non-UTF-8 locale does)."""
    folder = os.fsencode(tmp_path)
    source = folder + b"/src\xff.onnx"
    with open(source, "wb") as f:
        f.write(mlp().SerializeToString())
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "onnxsmith", *args], capture_output=True, env=env, timeout=600)

    for args in (
        [b"inspect", source],
        [b"shrink", source, folder + b"/out\xfe.onnx", b"--report", folder + b"/r\xfd.json"],
        [b"compare", source, folder + b"/out\xfe.onnx"],
    ):
        done = run(*args)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        assert b"Traceback" not in done.stderr
    assert os.path.exists(folder + b"/out\xfe.onnx") and os.path.exists(folder + b"/r\xfd.json")
    done = run(b"bench", source)  # onnxruntime opens UTF-8 paths only: said so, in one line
    assert done.returncode == 2 and done.stderr.decode().strip().endswith("rename it to benchmark it")
    assert done.stderr.decode().count("\n") == 1 and "src\\xff.onnx" in done.stderr.decode()


def test_dims_of_2_to_the_40_with_tiny_data_are_refused_by_fp16(cli, tmp_path):
    """The issue's fp16 traceback; every other broken kind is in test_inputs.py."""
    from onnx import TensorProto

    from tests.hostile.broken import _add_w, _raw

    path = tmp_path / "huge.onnx"
    path.write_bytes(_add_w(_raw("w", [2**40], b"\0" * 4, TensorProto.FLOAT16)).SerializeToString())
    result = cli("fp16", path, tmp_path / "v.onnx")
    assert_one_line_error(result, "huge.onnx", "declares shape [1099511627776]", "holds 4 bytes", "disagrees")
    assert np.array_equal(sorted(p.name for p in tmp_path.iterdir()), ["huge.onnx"])


@pytest.mark.parametrize(
    "command",
    [
        "fp16 OUT",
        "fp16 --report",
        "extract OUT",
        "extract --report",
        "quantize OUT",
        "quantize --report",
        "validate --json",
        "bench --json",
        "bench --plot",
        "eval-lm --report",
    ],
)
def test_every_output_option_is_checked_before_any_work(cli, tmp_path, command):
    """Each output a command takes, aimed at a link to /dev/null: refused in one line, nothing written."""
    from tests.support.lm_models import gpt2_folder

    model = _source(tmp_path / "src")
    lm = gpt2_folder(past=False)
    text = tmp_path / "text.txt"
    text.write_text("The keeper climbed the stairs of the old lighthouse.\n", encoding="utf-8")
    aim = tmp_path / "null"
    aim.symlink_to("/dev/null")
    out = tmp_path / "out"
    args = {
        "fp16 OUT": ["fp16", model, aim],
        "fp16 --report": ["fp16", model, out / "v.onnx", "--report", aim],
        "extract OUT": ["extract", model, aim, "--outputs", "h2"],
        "extract --report": ["extract", model, out / "p.onnx", "--outputs", "h2", "--report", aim],
        "quantize OUT": ["quantize", lm, aim],
        "quantize --report": ["quantize", lm, out / "q", "--report", aim],
        "validate --json": ["validate", model, model, "--task", "generic", "--json", aim],
        "bench --json": ["bench", model, "--json", aim],
        "bench --plot": ["bench", model, "--plot", aim],
        "eval-lm --report": ["eval-lm", lm / "onnx" / "model.onnx", "--text", text, "--report", aim],
    }[command]
    result = cli(*args)
    assert_one_line_error(result, "null", "a character device, not a")
    assert os.path.islink(aim) and not out.exists() and stat.S_ISCHR(os.stat(aim).st_mode)
