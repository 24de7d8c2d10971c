"""Files on disk: their sha256, their size, and writing them atomically."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def staging_dir(final_dir: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside the destination (same file system, so renames are atomic).

    It and everything in it are removed however the block ends; move what should
    survive out of it with :func:`commit_files` first.
    """
    final_dir = Path(final_dir)
    final_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".onnxsmith-tmp-", dir=final_dir))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def commit_files(pairs: list[tuple[Path, Path]]) -> None:
    """fsync each staged file, then rename it over its destination, in the given order."""
    for staged, _ in pairs:
        fsync_file(staged)
    for staged, final in pairs:
        os.replace(staged, final)
    with contextlib.suppress(OSError):  # make the renames durable where the OS allows it
        dir_fd = os.open(pairs[-1][1].parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_text_atomic(path: str | os.PathLike, text: str) -> FileRecord:
    path = Path(path)
    with staging_dir(path.parent) as tmp:
        staged = tmp / path.name
        staged.write_text(text, encoding="utf-8")
        commit_files([(staged, path)])
    return FileRecord.of(path)
