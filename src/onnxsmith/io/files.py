"""Files on disk: their sha256, their size, and writing them atomically through locked staging folders.

Every file onnxsmith makes is new (:func:`create_file`: never opened through a link, never an existing
file truncated), and every file it removes is inside a folder it owns, reached without following a
link (:func:`remove_inside`, the staging sweep): a link planted where onnxsmith writes or removes
leaves its target untouched.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from onnxsmith.core.errors import OutputError, UsageError
from onnxsmith.io.lock import LockHeld, NotALock, hold_lock

_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileRecord:
    """A file as a card lists it."""

    path: Path
    bytes: int
    sha256: str

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> FileRecord:
        path = Path(path)
        return cls(path=path, bytes=path.stat().st_size, sha256=sha256_file(path))

    def to_json(self, relative_to: Path | None = None) -> dict[str, Any]:
        name = self.path.relative_to(relative_to) if relative_to else self.path
        return {"path": name.as_posix(), "bytes": self.bytes, "sha256": self.sha256}


def human_bytes(n: float) -> str:
    """A byte count as people read it: 512 B, 1.5 KB, 598.7 MB."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def display(path: str | os.PathLike[str]) -> str:
    """A path as text that can always be printed (undecodable bytes as \\xNN escapes)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def describe_os_error(err: OSError) -> str:
    """An OSError as a short phrase: "no space left on device", "read-only file system"."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on device"
    return (err.strerror or str(err)).lower()


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def protected(target: str | os.PathLike[str], protect: Iterable[str | os.PathLike[str]]) -> bool:
    """Whether ``target`` is (a link to) one of the files in ``protect``."""
    return os.path.lexists(target) and any(os.path.exists(p) and same_file(p, target) for p in protect)


def refuse_protected(targets: Iterable[str | os.PathLike[str]], protect: Iterable[str | os.PathLike[str]]) -> None:
    """Raise before ``targets`` are written if one of them is a file a source reads."""
    protect = list(protect)
    for target in targets:
        if protected(target, protect):
            raise UsageError("refusing to overwrite the input model or its data; choose another output path", target)


#: A new file of ours: created here or refused, a link at its path never followed.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_file(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> BinaryIO:
    """A new file at ``path``, open for writing; FileExistsError if anything (a link too) is there.

    The one way onnxsmith makes a file: what it writes can never land in a file it did not make.
    """
    return os.fdopen(os.open(path, _NEW_FILE, 0o666, dir_fd=dir_fd), "wb")


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """``data`` as the new file ``path`` (:func:`create_file`); on failure (a full disk) it is removed."""
    fd = os.open(path, _NEW_FILE, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def copy_file(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """``source``'s bytes as the new file ``target`` (:func:`create_file`)."""
    with open(source, "rb") as src, create_file(target) as dst:
        shutil.copyfileobj(src, dst, _CHUNK)


def remove_inside(folder: str | os.PathLike[str], relative: str) -> bool:
    """Remove the file ``folder``/``relative`` and the folders it leaves empty (up to ``folder``).

    Each folder on the way is opened without following a link, so the removal cannot leave
    ``folder``; a path through a link (or one that climbs with ``..``) is left alone: False.
    """
    parts = Path(relative).parts
    if not parts or any(p in ("", ".", "..", "/") for p in parts):
        return False
    fds = []
    try:
        fds.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
    except OSError:  # a link (ELOOP, ENOTDIR) or nothing there: nothing of ours to remove
        for fd in fds:
            os.close(fd)
        return False
    try:
        if stat.S_ISDIR(os.lstat(parts[-1], dir_fd=fds[-1]).st_mode):
            return False
        os.unlink(parts[-1], dir_fd=fds[-1])  # unlink never follows the last link
        for name, parent in zip(reversed(parts[:-1]), reversed(fds[:-1])):
            os.rmdir(name, dir_fd=parent)  # only while empty: OSError ends the climb
    except OSError:
        pass
    finally:
        for fd in fds:
            os.close(fd)
    return True


def fsync_file(path: str | os.PathLike[str]) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


#: Private folders beside outputs start with this; one whose owner died is removed by the next run.
STAGING_PREFIX = ".onnxsmith-tmp-"
#: In each, a lock file naming the owner's pid, held (io/lock) while the owner lives.
_LOCK_FILE = ".owner"
#: A folder without its lock file is still being created, unless it is older than this.
_UNLOCKED_GRACE_S = 600
_held_locks: dict[Path, contextlib.ExitStack] = {}


def new_private_dir(parent: str | os.PathLike[str], *, prefix: str = STAGING_PREFIX) -> Path:
    """A new folder in ``parent``, locked by this process; remove it with :func:`remove_private_dir`.

    Folders of the same prefix left in ``parent`` by processes that died (kill -9, a crash,
    a power cut) are removed first: their locks died with them.
    """
    parent = Path(parent)
    remove_stale_dirs(parent, prefix)
    lock = contextlib.ExitStack()
    try:
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    except OSError as err:
        raise OutputError(f"cannot write in '{display(parent)}': {describe_os_error(err)}", parent) from None
    try:
        lock.enter_context(hold_lock(folder / _LOCK_FILE, new=True))
    except BaseException as exc:
        shutil.rmtree(folder, ignore_errors=True)  # made, but not owned yet: nothing may be left of it
        if isinstance(exc, (OSError, NotALock)):
            why = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
            raise OutputError(f"cannot write in '{display(parent)}': {why}", parent) from None
        raise
    _held_locks[folder] = lock
    return folder


def remove_private_dir(folder: Path) -> None:
    try:
        shutil.rmtree(folder, ignore_errors=True)  # never follows a link (a folder replaced by one stays)
    finally:
        lock = _held_locks.pop(folder, None)
        if lock is not None:
            lock.close()


def remove_stale_dirs(parent: Path, prefix: str = STAGING_PREFIX) -> None:
    """Remove ``prefix*`` folders in ``parent`` whose owning process is gone.

    Each is opened without following a link and its lock taken through that open folder, so a
    folder swapped for a link, or a lock file that is a link, is left alone with what it points at.
    """
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in [n for n in os.listdir(parent_fd) if n.startswith(prefix)]:
            try:
                folder_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
            except OSError:
                continue  # a file, a link, or gone
            try:
                _remove_if_stale(name, parent_fd, folder_fd)
            finally:
                os.close(folder_fd)
    finally:
        os.close(parent_fd)


def _remove_if_stale(name: str, parent_fd: int, folder_fd: int) -> None:
    try:
        os.lstat(_LOCK_FILE, dir_fd=folder_fd)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            if time.time() - os.fstat(folder_fd).st_mtime > _UNLOCKED_GRACE_S:
                shutil.rmtree(name, dir_fd=parent_fd, ignore_errors=True)
        return
    except OSError:
        return
    try:
        with hold_lock(_LOCK_FILE, dir_fd=folder_fd):  # taken: its owner is gone
            shutil.rmtree(name, dir_fd=parent_fd, ignore_errors=True)
    except (LockHeld, NotALock, OSError):
        pass  # alive, or someone else's


class PrivateFolder:
    """A private, locked folder inside ``final_dir`` (same file system as what it is staged for).

    :meth:`close` removes it, everything still in it, and the folders made for ``final_dir``
    that nothing was moved into; what should survive is moved out first (:func:`commit_files`).
    It is what :func:`staging_dir` holds for a block, and what a result staged before its
    destination is known (an API variant) holds until it is saved or dropped.
    """

    def __init__(self, final_dir: str | os.PathLike[str], *, prefix: str = STAGING_PREFIX) -> None:
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
def staging_dir(final_dir: str | os.PathLike[str], *, prefix: str = STAGING_PREFIX) -> Iterator[Path]:
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
def made_dirs(folder: str | os.PathLike[str]) -> Iterator[Path]:
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


def same_file_system(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
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


def commit_files(pairs: list[tuple[Path, Path]], *, protect: Iterable[str | os.PathLike[str]] = ()) -> None:
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


def write_text_atomic(
    path: str | os.PathLike[str], text: str, *, protect: Iterable[str | os.PathLike[str]] = ()
) -> FileRecord:
    path = Path(path)
    with staging_dir(path.parent) as tmp:
        commit_files([(stage_text(tmp, path, text), path)], protect=protect)
    return FileRecord.of(path)


def stage_texts(stack: contextlib.ExitStack, texts: list[tuple[Path, str]]) -> list[tuple[Path, Path]]:
    """Each (destination, text) written into a private folder beside its destination, which ``stack``
    holds: the (staged, destination) pairs to commit with other files (:func:`commit_files`), so
    a text that cannot be written stops the commit before anything moves."""
    pairs = []
    for final, text in texts:
        folder = stack.enter_context(staging_dir(final.parent))
        pairs.append((stage_text(folder, final, text), final))
    return pairs


def stage_text(folder: Path, final: Path, text: str) -> Path:
    """``text`` (UTF-8) as a new file in the private ``folder``, to be committed to ``final``."""
    staged = folder / final.name
    try:
        write_file(staged, text.encode("utf-8"))
    except OSError as err:
        raise OutputError(f"cannot write: {describe_os_error(err)}", final) from None
    return staged
