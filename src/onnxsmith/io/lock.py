"""A lock file naming the process that holds it: one writer at a time for a folder.

The lock is an advisory ``flock`` on a small file that holds the holder's pid (for
the message another process gives). The kernel drops the ``flock`` when its
holder dies, however it dies, so a lock file left by ``kill -9`` is simply taken
over: no pid probing, no stale-lock guessing. The holder removes the file when
it is done.

The file is opened without following a symbolic link, and what was opened must be a
regular file with one name holding nothing but a pid: a link (symbolic or hard) or
any other file planted where the lock goes is refused (:class:`NotALock`), never
truncated or written through.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

#: What a lock file holds: a pid and a newline, or nothing yet.
_PID = re.compile(rb"[0-9]{0,20}\n?")


class LockHeld(Exception):
    """Another process holds the lock."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        super().__init__(f"{path} is held by {'pid ' + str(pid) if pid else 'another process'}")


class NotALock(Exception):
    """What is at the lock's path is not a lock file (a link, a folder, a file holding something else)."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(f"{path} is {what}, not a lock file")


@contextlib.contextmanager
def hold_lock(path: str | os.PathLike[str], *, dir_fd: int | None = None, new: bool = False) -> Iterator[Path]:
    """Hold the lock file ``path`` for the duration of the block; raise :class:`LockHeld` if taken.

    ``dir_fd``: ``path`` is relative to this open folder (a folder reached without following links).
    ``new``: the file must not exist yet (a folder just made). Something other than a lock file at
    ``path`` raises :class:`NotALock` untouched; OSError from creating or writing the file (a read-only
    folder, a full disk) propagates, and the file is removed.
    """
    path = Path(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if new else 0)
    while True:
        try:
            fd = os.open(path, flags | os.O_NONBLOCK, 0o644, dir_fd=dir_fd)  # O_NONBLOCK: a planted fifo
        except OSError as err:
            if err.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
                raise NotALock(path, "a symbolic link") from None
            raise
        try:
            _refuse_foreign(fd, path)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise LockHeld(path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        # The holder before us removes the file as it lets go: what we locked must still be
        # the file at ``path``, or a third process may lock a new file there at the same time.
        if _is_at(fd, path, dir_fd):
            break
        os.close(fd)
    try:
        ours = _PID.fullmatch(os.pread(fd, 64, 0))  # a lock file holds a pid, or nothing yet
    except BaseException:
        os.close(fd)
        raise
    if not ours:
        os.close(fd)
        raise NotALock(path, "a file holding something else")
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # a full disk: the finally removes the file
        yield path
    finally:
        _unlink_if_ours(fd, path, dir_fd)  # while still holding it (see above)
        os.close(fd)


def _refuse_foreign(fd: int, path: Path) -> None:
    """Raise :class:`NotALock` unless ``fd`` is a regular file with one name (a hard link's target is
    someone's file)."""
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        raise NotALock(path, "not a regular file")
    if opened.st_nlink > 1:  # 0: removed by the holder before us as it let go (the caller retries)
        raise NotALock(path, "a hard link to another file")


def _is_at(fd: int, path: Path, dir_fd: int | None) -> bool:
    """Whether the file open as ``fd`` is still the one named ``path`` (links not followed)."""
    try:
        current = os.lstat(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)


def _unlink_if_ours(fd: int, path: Path, dir_fd: int | None) -> None:
    """Remove ``path`` if it is still the file we hold (never what was put there since)."""
    with contextlib.suppress(OSError):
        if _is_at(fd, path, dir_fd):
            os.unlink(path, dir_fd=dir_fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
