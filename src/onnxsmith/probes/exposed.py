"""Run a model with inner tensors exposed as outputs, without copying its weights.

Checking an extracted piece needs the source's values at the cut. Saving a
modified copy of a 2 GB model would copy 2 GB; instead only the small graph
proto is rewritten (the nodes that compute the wanted tensors, their outputs
added) and its weights stay where they are: onnxruntime refuses external data
outside the model's folder, so the proto is written into a private folder next
to hard links of the source's data files (a copy only where the file system
cannot link), and onnxruntime maps the weights from there.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxsmith.core.errors import OnnxsmithError
from onnxsmith.io.files import copy_file, new_private_dir, remove_private_dir, write_file
from onnxsmith.io.paths import data_file
from onnxsmith.irutil.walk import computing_model
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import adapt_feeds

_MODEL_NAME = "__exposed__.onnx"


@contextlib.contextmanager
def session_in_place(model: ir.Model, *, near: list[Path]) -> Iterator[object]:
    """An onnxruntime session on ``model`` whose external weights are read from their own files.

    ``near``: folders to create the private folder in (the first that can hard-link wins).
    """
    files = _external_files(model)
    if not files:  # everything is in memory anyway
        yield runner.open_session(model, label="the source with cut tensors exposed")
        return
    with _linked_folder(files, near) as folder:
        path = folder / _MODEL_NAME
        # Serialised as is, external tensors stay references to their (linked) files.
        write_file(path, ir.serde.serialize_model(model).SerializeToString())
        yield runner.open_session(path, label="the source with cut tensors exposed")


def run_exposed(
    model: ir.Model, values: list[ir.Value], feeds_list: list[dict[str, np.ndarray]], *, near: list[Path]
) -> list[dict[str, np.ndarray]]:
    """The arrays of ``values`` (by name) for every feed, computed by ``model``."""
    piece = computing_model(model, values)
    results = []
    with session_in_place(piece, near=near) as session:
        for feeds in feeds_list:
            results.append(runner.run(session, adapt_feeds(feeds, piece), [v.name for v in values]))
    return results


def _external_files(model: ir.Model) -> dict[str, Path]:
    """Location (relative, as the proto says) -> file, for every external tensor."""
    files = {}
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                files[tensor.location] = Path(tensor.path)
    return files


@contextlib.contextmanager
def _linked_folder(files: dict[str, Path], near: list[Path]) -> Iterator[Path]:
    folder = None
    try:
        for parent in [*near, Path(tempfile.gettempdir())]:
            with contextlib.suppress(OSError, OnnxsmithError):
                folder = new_private_dir(parent)
                for location, source in files.items():
                    os.link(source, _place(folder, location))
                break
            if folder is not None:
                remove_private_dir(folder)
                folder = None
        if folder is None:  # no folder could link: copy (slow for big models, but correct)
            folder = new_private_dir(near[0] if near else tempfile.gettempdir())
            for location, source in files.items():
                copy_file(source, _place(folder, location))
        yield folder
    finally:
        if folder is not None:
            remove_private_dir(folder)


def _place(folder: Path, location: str) -> Path:
    """Where a data file goes in ``folder``: never outside it (load refuses such locations too)."""
    target = data_file(location, folder / _MODEL_NAME, "?")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target
