"""A lock file naming the process that holds it: one writer at a time for a folder.

The lock is an advisory ``flock`` on a small file that holds the holder's pid (for
the message another process gives). The kernel drops the ``flock`` when its
holder dies, however it dies, so a lock file left by ``kill -9`` is simply taken
over: no pid probing, no stale-lock guessing. The holder removes the file when
it is done.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class LockHeld(Exception):
    """Another process holds the lock."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        super().__init__(f"{path} is held by {'pid ' + str(pid) if pid else 'another process'}")


@contextlib.contextmanager
def hold_lock(path: str | os.PathLike) -> Iterator[Path]:
    """Hold the lock file ``path`` for the duration of the block; raise :class:`LockHeld` if taken.

    OSError from creating the file (a read-only folder) propagates.
    """
    path = Path(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
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
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        opened = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino):
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding it (see above)
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
