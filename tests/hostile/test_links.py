"""Links planted where onnxsmith writes or removes: every file it makes is new (never opened through a
link, never an existing file truncated), every file it removes is inside the folder it owns, reached
without following a link. The target of a planted link is never written, truncated or removed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from onnxsmith.core.errors import UsageError
from onnxsmith.io import files
from onnxsmith.io.files import sha256_file
from onnxsmith.io.lock import NotALock, hold_lock
from onnxsmith.release.build import build
from onnxsmith.release.recipe import load_recipe
from tests.conftest import assert_one_line_error
from tests.support.models import mlp
from tests.test_build import _quick_project

VICTIM_TEXT = "someone's file: must never change\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside every folder onnxsmith is pointed at."""
    path = tmp_path / "elsewhere" / "victim"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    return path


def _unchanged(victim: Path) -> bool:
    return victim.read_text() == VICTIM_TEXT and victim.stat().st_nlink >= 1


# ---- the build's lock file ---------------------------------------------------------------------------


def _symlink(victim: Path, at: Path) -> None:
    at.symlink_to(victim)


def _hard_link(victim: Path, at: Path) -> None:
    os.link(victim, at)


def _foreign_file(victim: Path, at: Path) -> None:
    at.write_text(VICTIM_TEXT)  # a file that holds something other than a pid: not a lock of ours


@pytest.mark.parametrize(
    ("plant", "what"),
    [(_symlink, "a symbolic link"), (_hard_link, "a hard link"), (_foreign_file, "a file holding something else")],
)
def test_a_link_planted_where_the_build_lock_goes_is_refused_untouched(cli, tmp_path, victim, plant, what):
    """The issue's case: ln -s ~/victim shared/.rel.onnxsmith-lock; build --out shared/rel."""
    recipe = _quick_project(tmp_path / "project")
    shared = tmp_path / "shared"
    shared.mkdir()
    lock = shared / ".rel.onnxsmith-lock"
    plant(victim, lock)

    result = cli("build", recipe.path, "--out", shared / "rel", "--no-bench")
    assert_one_line_error(result, ".rel.onnxsmith-lock", what, "remove it")
    target = lock if plant is _foreign_file else victim
    assert target.read_text() == VICTIM_TEXT and _unchanged(victim)
    assert os.path.lexists(lock) and sorted(p.name for p in shared.iterdir()) == [lock.name]  # nothing else made

    lock.unlink()  # once it is gone the build proceeds
    assert cli("build", recipe.path, "--out", shared / "rel", "--no-bench").returncode == 0
    assert sorted(p.name for p in shared.iterdir()) == ["rel"] and _unchanged(victim)


def test_hold_lock_never_writes_through_a_link(tmp_path, victim):
    lock = tmp_path / "x.lock"
    lock.symlink_to(victim)
    with pytest.raises(NotALock, match="a symbolic link"), hold_lock(lock):
        pass
    assert lock.is_symlink() and _unchanged(victim)
    lock.unlink()
    with hold_lock(lock):  # a lock file left by a holder that died (a pid in it) is taken over
        pass
    lock.write_text("4194304\n")
    with hold_lock(lock):
        assert lock.read_text() == f"{os.getpid()}\n"
    assert not lock.exists()


def test_a_build_lock_swapped_for_a_link_while_held_is_not_removed(tmp_path, victim):
    """The holder removes its lock file as it lets go, but only the file it holds: never what was put there."""
    lock = tmp_path / ".rel.onnxsmith-lock"
    with hold_lock(lock):
        lock.unlink()
        lock.symlink_to(victim)
    assert lock.is_symlink() and _unchanged(victim)


# ---- staging folders: the sweep of a dead owner's folders ---------------------------------------------


def _old(path: Path) -> None:
    then = time.time() - 2 * 3600
    os.utime(path, (then, then), follow_symlinks=False)


def test_the_stale_staging_sweep_never_writes_through_a_planted_owner_file(cli, tmp_path, victim):
    """.onnxsmith-tmp-*/.owner -> victim: the sweep would have locked, truncated and written a pid into it."""
    out = tmp_path / "out"
    out.mkdir()
    planted = out / (files.STAGING_PREFIX + "planted")
    planted.mkdir()
    (planted / ".owner").symlink_to(victim)
    hard = out / (files.STAGING_PREFIX + "hard")
    hard.mkdir()
    os.link(victim, hard / ".owner")
    _old(planted)
    _old(hard)
    source = tmp_path / "model.onnx"
    source.write_bytes(mlp().SerializeToString())

    assert cli("shrink", source, out / "small.onnx").returncode == 0  # its staging folder sweeps first
    assert _unchanged(victim) and victim.stat().st_nlink == 2
    # not a folder onnxsmith made (its lock file is a link): left as it is, with what it points at
    assert (planted / ".owner").is_symlink() and (hard / ".owner").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([planted.name, hard.name, "small.onnx"])


def test_a_stale_staging_folder_that_is_a_link_is_not_followed(tmp_path, victim):
    """A folder of ours replaced by a link to someone's folder: nothing in that folder is removed."""
    theirs = victim.parent
    (theirs / ".owner").write_text("4194304\n")  # looks like a dead owner's lock file
    link = tmp_path / (files.STAGING_PREFIX + "link")
    link.symlink_to(theirs)
    _old(link)
    files.remove_stale_dirs(tmp_path)
    assert link.is_symlink() and _unchanged(victim) and (theirs / ".owner").exists()


# ---- outputs and reports that are links ------------------------------------------------------------------


def test_an_output_that_is_a_link_is_replaced_not_written_through(cli, tmp_path, victim):
    source = tmp_path / "model.onnx"
    source.write_bytes(mlp().SerializeToString())
    second = victim.with_name("second")
    second.write_text(VICTIM_TEXT)
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    out.symlink_to(victim)
    report.symlink_to(second)
    result = cli("fp16", source, out, "--report", report)
    assert result.returncode == 0, result.stderr
    assert _unchanged(victim) and _unchanged(second)
    assert not out.is_symlink() and not report.is_symlink()  # the links themselves were replaced
    assert cli("inspect", out).returncode == 0


def test_a_new_file_is_never_opened_through_a_link(tmp_path, victim):
    link = tmp_path / "staged"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError):
        files.create_file(link)
    with pytest.raises(FileExistsError):
        files.write_file(link, b"overwritten")
    assert _unchanged(victim) and link.is_symlink()


# ---- removals stay inside the folder they are for --------------------------------------------------------


def test_force_never_removes_a_pinned_file_through_a_link(tmp_path, victim):
    """SHA256SUMS pins link/victim and link leads out of --out: build --force removes nothing outside."""
    recipe = _quick_project(tmp_path / "project")
    out = tmp_path / "release"
    build(recipe, out, bench=False)
    (out / "link").symlink_to(victim.parent, target_is_directory=True)
    (out / "pinned").symlink_to(victim)
    with open(out / "SHA256SUMS", "a") as f:
        f.write(f"{sha256_file(victim)}  link/victim\n{sha256_file(victim)}  pinned\n")

    with pytest.raises(UsageError, match=r"holds files that no earlier build made \(link, pinned\)"):
        build(recipe, out, bench=False)  # the links are not the release's
    build(recipe, out, bench=False, force=True)
    assert _unchanged(victim)
    assert (out / "link").is_symlink() and (out / "pinned").is_symlink()  # kept, as --force keeps what no build made
    assert "link/victim" not in (out / "SHA256SUMS").read_text()


def test_force_never_writes_a_release_file_through_a_link(tmp_path, victim):
    """A folder the release writes into (models/) swapped for a link out of --out: refused, nothing written."""
    project = tmp_path / "project"
    _quick_project(project)
    text = (project / "recipe.toml").read_text().replace('name = "same"', 'name = "same"\nfile = "models/same.onnx"')
    (project / "recipe.toml").write_text(text)
    recipe = load_recipe(project / "recipe.toml")
    out = tmp_path / "release"
    build(recipe, out, bench=False)
    (out / "models" / "same.onnx").unlink()
    (out / "models").rmdir()
    (out / "models").symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(UsageError, match="holds models"):
        build(recipe, out, bench=False, force=True)
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim"] and _unchanged(victim)


def test_remove_inside_stays_in_its_folder(tmp_path, victim):
    folder = tmp_path / "owned"
    (folder / "a" / "b").mkdir(parents=True)
    (folder / "a" / "b" / "f").write_text("ours")
    (folder / "link").symlink_to(victim.parent, target_is_directory=True)
    assert not files.remove_inside(folder, "link/victim")
    assert not files.remove_inside(folder, "../elsewhere/victim")
    assert not files.remove_inside(folder, "a/b")  # a folder is not a file
    assert _unchanged(victim)
    assert files.remove_inside(folder, "a/b/f")
    assert sorted(p.name for p in folder.iterdir()) == ["link"]  # the folders it emptied went with it
