"""The release folder a build writes into (``--out``): what it may hold, and how a release gets there.

A release is made in a staging folder beside ``--out`` and swapped in at the end, so ``--out`` is either the
previous release or the new one, never half of one. A build deletes nothing it did not make: an ``--out``
holding anything but an earlier release (the files its SHA256SUMS pins and the ones every build writes) is
refused, unless ``force``: then the other files stay and the release's files are replaced one by one. While a
build runs, a lock file beside ``--out`` (``.NAME.onnxsmith-lock``, naming its pid) refuses a second one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from onnxsmith.core.errors import UsageError
from onnxsmith.io.files import remove_inside, staging_dir
from onnxsmith.io.lock import LockHeld, NotALock, hold_lock
from onnxsmith.release.recipe import CHECKSUMS, GENERATED, MEASUREMENTS, Recipe


@dataclass(frozen=True)
class StagedRelease:
    """A release being made: ``release``, a staging folder beside ``out`` (in ``tmp``, which is removed
    afterwards, with ``tmp``/parts for what is made before it is assembled), and how to move it into ``out``."""

    out: Path
    release: Path
    tmp: Path
    previous: _Previous

    def install(self) -> None:
        """The staged release moved into ``out``: swapped in whole, or file by file beside files no build made."""
        if self.previous.foreign:
            _replace_files(self.release, self.out, self.previous)
        else:
            if self.out.exists():
                os.replace(self.out, self.tmp / "previous")
            os.replace(self.release, self.out)


@contextlib.contextmanager
def staged_release(recipe: Recipe, out: str | os.PathLike, force: bool) -> Iterator[StagedRelease]:
    """``out`` locked and checked for ``recipe`` (see :func:`build`), and a staging folder to make its release
    in; nothing reaches ``out`` but by :meth:`StagedRelease.install`."""
    out = Path(out)
    with _exclusive(out):
        previous = _check_out(out, recipe, force)
        with staging_dir(out.parent) as tmp:
            release = tmp / "release"
            release.mkdir()
            yield StagedRelease(out, release, tmp, previous)


@contextlib.contextmanager
def _exclusive(out: Path):
    """One build at a time into ``out``: a lock file beside it (the folder itself is swapped whole)."""
    where = out.absolute()
    lock = where.parent / f".{where.name}.onnxsmith-lock"
    with contextlib.ExitStack() as stack:
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(hold_lock(lock))
        except LockHeld as held:
            who = f"pid {held.pid}" if held.pid else "another process"
            raise UsageError(
                f"another onnxsmith build ({who}) is writing this release; wait for it to finish or choose another --out",
                out,
            ) from None
        except NotALock as planted:  # never written through: the file it names is someone's
            raise UsageError(
                f"is {planted.what}, where the build's lock file for --out {out} goes; remove it", lock
            ) from None
        except OSError as err:
            raise UsageError(
                f"cannot create the build's lock file {lock.name} beside it ({err.strerror})", out
            ) from None
        yield


@dataclass
class _Previous:
    """What is in ``--out`` before a build: the files an earlier build made, and the others."""

    made: set[str] = field(default_factory=set)  # relative POSIX paths
    foreign: list[str] = field(default_factory=list)


def _check_out(out: Path, recipe: Recipe, force: bool) -> _Previous:
    """Refuse an ``--out`` that holds the inputs or, without ``force``, files no earlier build made."""
    if out.is_symlink():
        raise UsageError("is a symbolic link; give the folder itself as --out", out)
    if not out.exists():
        return _Previous()
    if not out.is_dir():
        raise UsageError("exists and is not a folder; choose another --out", out)
    inputs = [recipe.path.resolve(), recipe.source.resolve()]
    if any(out.resolve() == p or out.resolve() in p.parents for p in inputs):
        raise UsageError("holds the recipe or the source model; choose another --out", out)
    previous = _Previous(made=_made_by_earlier_build(out))
    previous.foreign = [f for f in _files_in(out) if f not in previous.made]
    if previous.foreign and not force:
        top = sorted({f.split("/")[0] + ("/" if "/" in f else "") for f in previous.foreign})
        shown = ", ".join(top[:6]) + (f" and {len(top) - 6} more" if len(top) > 6 else "")
        raise UsageError(
            f"holds files that no earlier build made ({shown}); remove them or choose another --out, "
            "or pass --force to keep them and replace only the release's own files",
            out,
        )
    planned = [*GENERATED, *(v.file for v in recipe.variants), *(p.name for p in recipe.include)]
    _refuse_collisions(out, planned, previous)
    return previous


def _made_by_earlier_build(out: Path) -> set[str]:
    """The files of the release in ``out``: those its SHA256SUMS pins and those every build writes.

    Only regular files reached without following a link count: a pinned path through a link
    (``link/victim``, ``link`` leading out of the folder) or to one is not the release's, and stays.
    """
    if not _is_release(out / MEASUREMENTS):
        return set()
    made = {name for name in GENERATED if (out / name).is_file() and not (out / name).is_symlink()}
    try:
        lines = (out / CHECKSUMS).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return made
    for line in lines:
        found = re.fullmatch(r"[0-9a-f]{64}  (.+)", line)
        if found and plain_relative(found.group(1)) and regular_inside(out, found.group(1)):
            made.add(found.group(1))
    return made


def regular_inside(folder: Path, relative: str) -> bool:
    """Whether ``folder``/``relative`` is a regular file with no link on the way (lstat each part)."""
    path = folder
    for part in PurePosixPath(relative).parts:
        path = path / part
        try:
            mode = path.lstat().st_mode
        except OSError:
            return False
        if stat.S_ISLNK(mode):
            return False
    return stat.S_ISREG(mode)


def plain_relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _files_in(folder: Path) -> list[str]:
    """Every file and link under ``folder``, and every empty folder (with a trailing "/"), as
    relative POSIX paths; links are not followed."""
    found = []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        links = [d for d in dirs if (here / d).is_symlink()]
        dirs[:] = sorted(d for d in dirs if d not in links)
        for name in sorted(files + links):
            found.append((here / name).relative_to(folder).as_posix())
        if not files and not dirs and not links and here != folder:
            found.append(here.relative_to(folder).as_posix() + "/")
    return found


def _is_release(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "onnxsmith" in data  # JSON, but maybe a list or a number


def _refuse_collisions(out: Path, planned: list[str], previous: _Previous) -> None:
    """Never write over, or put a folder where, something no build made (``--force`` or not)."""
    foreign = set(previous.foreign)
    for path in planned:
        parts = PurePosixPath(path).parts
        for n in range(1, len(parts) + 1):
            prefix = "/".join(parts[:n])
            inside = out / prefix  # a link is never a folder the release writes into
            if prefix in foreign or (n < len(parts) and os.path.lexists(inside) and not _real_dir(inside)):
                raise UsageError(
                    f"holds {prefix}, which no earlier build made and the release would write over "
                    f"(for {path}); move it away or choose another --out",
                    out,
                )
        if (out / path).is_dir() and not (out / path).is_symlink():
            raise UsageError(f"holds a folder {path} where the release writes a file; move it away", out)


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _replace_files(release: Path, out: Path, previous: _Previous) -> None:
    """Move the new release's files into ``out`` one by one, keeping what no build made there.

    The models first and SHA256SUMS last: until it is replaced, ``sha256sum -c`` on a release
    interrupted half-way fails rather than vouching for a mixture."""
    new = [f for f in _files_in(release) if not f.endswith("/")]
    _refuse_collisions(out, new, previous)
    last = [f for f in new if f in GENERATED]
    last.sort(key=lambda f: f == CHECKSUMS)
    first = [f for f in new if f not in GENERATED]
    for rel in first:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(release / rel, out / rel)
    for rel in sorted(previous.made - set(new), key=lambda f: -f.count("/")):
        remove_inside(out, rel)  # never through a link put in since: the removal stays in --out
    for rel in last:
        os.replace(release / rel, out / rel)
