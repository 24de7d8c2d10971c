"""Each shard's outputs on disk, so an interrupted run resumes from what is done.

A store is a folder under the user's ``--shard-dir`` named by a key: the hash of everything the outputs depend
on (the model's bytes, the data's sample ids, the task and its options, the shard size, how the model is run).
A rerun with the same key reads the shards already there and runs only the rest; a different key is a
different folder, so stale outputs are never read. A shard is one .npz (arrays only: no pickle is ever
loaded), written to a temporary name and renamed, so a shard file that exists is whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from onnxsmith.core.errors import OutputError
from onnxsmith.io.files import create_file, describe_os_error

#: Outputs of one shard: one dict of arrays per sample, in sample order.
ShardOutputs = list[dict[str, np.ndarray]]


def store_key(**parts: Any) -> str:
    """A stable hash of ``parts`` (JSON-able values)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class ShardStore:
    """``folder/key/shard-00012.npz``: the outputs of shard 12."""

    def __init__(self, folder: str | os.PathLike[str], key: str) -> None:
        self.folder = Path(folder) / key
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputError(f"cannot keep shards here ({describe_os_error(err)})", folder) from None

    def _path(self, index: int) -> Path:
        return self.folder / f"shard-{index:05d}.npz"

    def load(self, index: int) -> ShardOutputs | None:
        """Shard ``index``'s outputs, or None when it is not done (or its file cannot be read: run it again)."""
        path = self._path(index)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                count = int(data["__samples__"])
                outputs: ShardOutputs = [{} for _ in range(count)]
                for name in data.files:
                    if name != "__samples__":
                        position, _, output = name.partition("/")
                        outputs[int(position)][output] = data[name]
        except (OSError, ValueError, KeyError):
            return None
        return outputs

    def save(self, index: int, outputs: ShardOutputs) -> None:
        arrays = {f"{i}/{name}": value for i, sample in enumerate(outputs) for name, value in sample.items()}
        arrays["__samples__"] = np.array(len(outputs))
        final = self._path(index)
        temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            with create_file(temporary) as f:
                np.savez(f, **arrays)
            os.replace(temporary, final)
        except OSError as err:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise OutputError(f"cannot keep a shard's outputs ({describe_os_error(err)})", final) from None


def whole_batches(shard_size: int, batch: int) -> int:
    """A shard's length: ``shard_size`` rounded up to whole batches of ``batch``, so every item runs in the batch
    it would run in on one process."""
    batch = max(1, batch)
    return -(-max(1, shard_size) // batch) * batch


def map_kept(
    engine: Any,
    worker: Any,
    jobs: list[Any],
    store: ShardStore | None,
    on_result: Callable[[int, Any], None],
    *,
    on_kept: Callable[[int], None] = lambda index: None,
    encode: Callable[[Any], ShardOutputs] = lambda result: result,
    decode: Callable[[ShardOutputs], Any] = lambda kept: kept,
) -> list[Any]:
    """``engine.map(worker, jobs)``, each result kept in ``store`` (``encode``: as arrays) as it arrives, and the
    results a rerun finds there read back (``decode``) instead of run: ``on_kept(index)`` for each of those first,
    then ``on_result(index, result)`` as each job run arrives. The results in job order; ``worker`` released
    afterwards."""
    results: list[Any] = [None] * len(jobs)
    todo = []
    for index in range(len(jobs)):
        kept = store.load(index) if store is not None else None
        if kept is None:
            todo.append(index)
            continue
        results[index] = decode(kept)
        on_kept(index)

    def arrived(position: int, result: Any) -> None:
        index = todo[position]
        results[index] = result
        if store is not None:
            store.save(index, encode(result))
        on_result(index, result)

    try:
        engine.map(worker, [jobs[i] for i in todo], on_result=arrived)
    finally:
        engine.release(worker)
    return results
