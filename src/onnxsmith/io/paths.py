"""What onnxsmith may read and write, decided before any work.

* A model reads only files inside its own folder: an external-data location that is
  absolute, climbs with ``..`` or resolves (symbolic links included) outside the folder
  is refused, as onnx and onnxruntime refuse it (CVE-2024-27318).
* An output is a regular file, or nothing yet, in a folder that can be written: a
  device, fifo, socket or folder is never replaced by the atomic rename.
* The files a source reads (its .onnx and each data file it references) are never
  overwritten or removed.
* A file named to be read (an image, a boxes file, an .npz, a text) is a regular file,
  refused before it is opened: opening a fifo waits for a writer, and a device reads forever.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO

from onnxsmith.core.errors import InputError, OutputError, UsageError
from onnxsmith.io.files import describe_os_error, display, refuse_protected


def data_file(location: str, model_path: Path, tensor: str) -> Path:
    """The file an external-data ``location`` of ``model_path`` names; refuse one outside its folder."""

    def refuse(why: str) -> InputError:
        return InputError(
            f"external data of tensor '{tensor}' is at '{display(location)}', {why}; a model may only "
            "read data files inside its own folder (as onnx and onnxruntime require)",
            model_path,
        )

    if not location:
        raise refuse("an empty location")
    if any(ord(c) < 32 for c in location):
        raise refuse("a location with a control character")
    if os.path.isabs(location) or PureWindowsPath(location).is_absolute() or PureWindowsPath(location).drive:
        raise refuse("an absolute path")
    if ".." in PurePosixPath(location.replace("\\", "/")).parts:
        raise refuse("a path that climbs out with '..'")
    folder = model_path.parent.resolve()
    path = model_path.parent / location
    resolved = path.resolve()
    if not resolved.is_relative_to(folder):
        raise refuse(f"which resolves to {display(resolved)} through a symbolic link")
    return path


def resolves_outside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> Path | None:
    """Where ``path`` really is (symbolic links followed) when that is outside ``folder``; None when inside.

    The one test of what a release publishes (``build``'s ``include``, ``quantize``'s copied tokenizer
    and config): a link leading out of the folder must not publish ~/.ssh/id_rsa by accident.
    """
    real = Path(path).resolve()
    return None if real.is_relative_to(Path(folder).resolve()) else real


def check_outputs(
    outputs: Iterable[str | os.PathLike[str] | None], *, protect: Iterable[str | os.PathLike[str]] = ()
) -> None:
    """:func:`check_output` for each output a command was given (None: not asked for); no two the same."""
    protect = list(protect)
    seen: dict[str, Path] = {}
    for output in outputs:
        if output is None:
            continue
        path = check_output(output, protect=protect)
        key = os.path.realpath(path)
        if key in seen:
            raise UsageError(f"is given for two outputs ('{display(seen[key])}' too)", path)
        seen[key] = path


_KINDS = {
    stat.S_ISDIR: "a folder",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a fifo",
    stat.S_ISSOCK: "a socket",
}


def check_output(
    path: str | os.PathLike[str],
    *,
    protect: Iterable[str | os.PathLike[str]] = (),
    folder: bool = False,
) -> Path:
    """``path`` as an output that can be written; raise naming the problem, before any work.

    ``folder``: the output is a folder (it may exist as one). Nothing is created: a probe
    file in the nearest existing folder shows that it can be written, and is removed.
    """
    if not os.fspath(path).strip():
        raise UsageError("the output path is empty")
    path = Path(path)
    refuse_protected([path], protect)
    kind = _kind(path)
    if kind is not None and not (folder and kind == "a folder"):
        expected = "a folder" if folder else "a regular file"
        raise UsageError(f"exists and is {kind}, not {expected}; choose another output path", path)
    if kind is None and folder and path.is_file():
        raise UsageError("exists and is a file, not a folder; choose another output path", path)
    parent = path.parent
    while not parent.exists():
        if os.path.lexists(parent):
            raise OutputError(f"cannot create the folder '{display(parent)}' (a broken symbolic link)", path)
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"'{display(parent)}' is a file, not a folder", path)
    _probe_writable(parent, path)
    return path


def file_kind(path: str | os.PathLike[str]) -> str | None:
    """What is at ``path`` (links followed) if not a regular file ("a fifo", "a folder"); None if one, or nothing."""
    return _kind(Path(path))


def _kind(path: Path) -> str | None:
    """What exists at ``path`` (links followed) other than a regular file, or None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return _kind_of(mode)


def _probe_writable(folder: Path, path: Path) -> None:
    try:
        fd, probe = tempfile.mkstemp(prefix=".onnxsmith-probe-", dir=folder)
    except OSError as err:
        raise OutputError(f"cannot write in '{display(folder)}': {describe_os_error(err)}", path) from None
    os.close(fd)
    os.unlink(probe)


def check_readable(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` as a file to read: a regular file (links followed); raise naming it otherwise, without
    opening it (opening a fifo blocks until something writes to it; a device never ends)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except OSError as err:
        raise InputError(f"cannot read the {what}: {describe_os_error(err)}", path) from None
    if not stat.S_ISREG(mode):
        raise InputError(f"is {_kind_of(mode)}; the {what} must be a regular file", path)
    return path


def open_readable(path: str | os.PathLike[str], what: str = "file") -> BinaryIO:
    """The regular file ``path`` opened for reading (binary), after :func:`check_readable`. It is opened
    without waiting (O_NONBLOCK) and checked again once open: a fifo swapped in meanwhile cannot block."""
    path = check_readable(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise InputError(f"cannot read the {what}: {describe_os_error(err)}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"is {_kind_of(mode)}; the {what} must be a regular file", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str | os.PathLike[str], what: str = "text file") -> str:
    """A regular file's UTF-8 text (:func:`open_readable`); one-line errors naming it."""
    with open_readable(path, what) as f:
        try:
            return f.read().decode("utf-8")
        except OSError as err:
            raise InputError(f"cannot read the {what}: {describe_os_error(err)}", path) from None
        except UnicodeDecodeError as err:
            raise InputError(f"the {what} is not UTF-8 text ({err})", path) from None


def _kind_of(mode: int) -> str:
    return next((kind for test, kind in _KINDS.items() if test(mode)), "not a regular file")
