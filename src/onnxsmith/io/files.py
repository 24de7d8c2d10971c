"""Files on disk: their sha256, their size, and writing them atomically through locked staging folders."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from onnxsmith.core.errors import OutputError, UsageError
from onnxsmith.io.lock import LockHeld, hold_lock

_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileRecord:
    """A file as a card lists it."""

    path: Path
    bytes: int
    sha256: str

    @classmethod
    def of(cls, path: str | os.PathLike) -> FileRecord:
        path = Path(path)
        return cls(path=path, bytes=path.stat().st_size, sha256=sha256_file(path))

    def to_json(self, relative_to: Path | None = None) -> dict:
        name = self.path.relative_to(relative_to) if relative_to else self.path
        return {"path": name.as_posix(), "bytes": self.bytes, "sha256": self.sha256}


def human_bytes(n: float) -> str:
    """A byte count as people read it: 512 B, 1.5 KB, 598.7 MB."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def display(path: str | os.PathLike) -> str:
    """A path as text that can always be printed (undecodable bytes as \\xNN escapes)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def describe_os_error(err: OSError) -> str:
    """An OSError as a short phrase: "no space left on device", "read-only file system"."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on device"
    return (err.strerror or str(err)).lower()


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def protected(target: str | os.PathLike, protect: Iterable[str | os.PathLike]) -> bool:
    """Whether ``target`` is (a link to) one of the files in ``protect``."""
    return os.path.lexists(target) and any(os.path.exists(p) and same_file(p, target) for p in protect)


def refuse_protected(targets: Iterable[str | os.PathLike], protect: Iterable[str | os.PathLike]) -> None:
    """Raise before ``targets`` are written if one of them is a file a source reads."""
    protect = list(protect)
    for target in targets:
        if protected(target, protect):
            raise UsageError("refusing to overwrite the input model or its data; choose another output path", target)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


#: Private folders beside outputs start with this; one whose owner died is removed by the next run.
STAGING_PREFIX = ".onnxsmith-tmp-"
#: In each, a lock file naming the owner's pid, held (io/lock) while the owner lives.
_LOCK_FILE = ".owner"
#: A folder without its lock file is still being created, unless it is older than this.
_UNLOCKED_GRACE_S = 600
_held_locks: dict[Path, contextlib.ExitStack] = {}


def new_private_dir(parent: str | os.PathLike, *, prefix: str = STAGING_PREFIX) -> Path:
    """A new folder in ``parent``, locked by this process; remove it with :func:`remove_private_dir`.

    Folders of the same prefix left in ``parent`` by processes that died (kill -9, a crash,
    a power cut) are removed first: their locks died with them.
    """
    parent = Path(parent)
    remove_stale_dirs(parent, prefix)
    lock = contextlib.ExitStack()
    try:
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        lock.enter_context(hold_lock(folder / _LOCK_FILE))
    except OSError as err:
        raise OutputError(f"cannot write in '{display(parent)}': {describe_os_error(err)}", parent) from None
    _held_locks[folder] = lock
    return folder


def remove_private_dir(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    lock = _held_locks.pop(folder, None)
    if lock is not None:
        lock.close()


def remove_stale_dirs(parent: Path, prefix: str = STAGING_PREFIX) -> None:
    """Remove ``prefix*`` folders in ``parent`` whose owning process is gone."""
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(prefix)]
    except OSError:
        return
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        folder = Path(entry.path)
        if not (folder / _LOCK_FILE).exists():
            with contextlib.suppress(OSError):
                if time.time() - entry.stat(follow_symlinks=False).st_mtime > _UNLOCKED_GRACE_S:
                    shutil.rmtree(folder, ignore_errors=True)
            continue
        try:
            with hold_lock(folder / _LOCK_FILE):  # taken: its owner is gone
                shutil.rmtree(folder, ignore_errors=True)
        except (LockHeld, OSError):
            continue  # alive, or someone else's


class PrivateFolder:
    """A private, locked folder inside ``final_dir`` (same file system as what it is staged for).

    :meth:`close` removes it, everything still in it, and the folders made for ``final_dir``
    that nothing was moved into; what should survive is moved out first (:func:`commit_files`).
    It is what :func:`staging_dir` holds for a block, and what a result staged before its
    destination is known (an API variant) holds until it is saved or dropped.
    """

    def __init__(self, final_dir: str | os.PathLike, *, prefix: str = STAGING_PREFIX) -> None:
        self.final_dir = Path(final_dir)
        self._created = _make_dirs(self.final_dir)
        try:
            self.path = new_private_dir(self.final_dir, prefix=prefix)
        except BaseException:
            _remove_empty(self._created)
            raise
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            remove_private_dir(self.path)
        finally:
            _remove_empty(self._created)


@contextlib.contextmanager
def staging_dir(final_dir: str | os.PathLike, *, prefix: str = STAGING_PREFIX) -> Iterator[Path]:
    """A private folder beside the destination (same file system, so renames are atomic).

    It and everything in it are removed however the block ends, and so are the folders
    made for ``final_dir`` if nothing was moved into them; move what should survive out
    of it with :func:`commit_files` first.
    """
    folder = PrivateFolder(final_dir, prefix=prefix)
    try:
        yield folder.path
    finally:
        folder.close()


@contextlib.contextmanager
def made_dirs(folder: str | os.PathLike) -> Iterator[Path]:
    """``folder``, created with its missing parents for the block; those still empty after it are removed."""
    created = _make_dirs(Path(folder))
    try:
        yield Path(folder)
    finally:
        _remove_empty(created)


def _remove_empty(created: list[Path]) -> None:
    for folder in created:  # deepest first; a folder something was committed into stays
        with contextlib.suppress(OSError):
            folder.rmdir()


def same_file_system(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether the existing folders ``a`` and ``b`` are on one file system (a rename between them is atomic)."""
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def _make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created, deepest first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise OutputError("exists and is not a folder", path) from None
        except OSError as err:
            raise OutputError(f"cannot create the folder: {describe_os_error(err)}", path) from None
    return missing


def commit_files(pairs: list[tuple[Path, Path]], *, protect: Iterable[str | os.PathLike] = ()) -> None:
    """fsync each staged file, then rename it over its destination, in the given order.

    A destination that is one of the files in ``protect`` (what a source reads) is refused
    before anything moves.
    """
    refuse_protected([final for _, final in pairs], protect)
    try:
        for staged, _ in pairs:
            fsync_file(staged)
        for staged, final in pairs:
            os.replace(staged, final)
    except OSError as err:
        raise OutputError(f"cannot write: {describe_os_error(err)}", err.filename or pairs[-1][1]) from None
    with contextlib.suppress(OSError):  # make the renames durable where the OS allows it
        dir_fd = os.open(pairs[-1][1].parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_text_atomic(path: str | os.PathLike, text: str, *, protect: Iterable[str | os.PathLike] = ()) -> FileRecord:
    path = Path(path)
    with staging_dir(path.parent) as tmp:
        staged = tmp / path.name
        try:
            staged.write_text(text, encoding="utf-8")
        except OSError as err:
            raise OutputError(f"cannot write: {describe_os_error(err)}", path) from None
        commit_files([(staged, path)], protect=protect)
    return FileRecord.of(path)
