"""Save a model: atomic, deterministic, streamed, stamped with where it came from.

* One .onnx file while the result fits protobuf's 2 GiB limit, else (or when
  asked) the weights go to one ``<name>.onnx.data`` beside it.
* Written into a staging folder beside the destination, fsynced, then renamed
  into place: a reader never sees half a model, a failure leaves nothing.
* The same model gives the same bytes: serialisation is canonical and the
  provenance stamp holds no time or path.
* The single file is streamed one tensor at a time (see :mod:`onnxsmith.io.wire`),
  so saving never holds a second copy of the weights.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import onnx
import onnx_ir as ir

from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.core.version import __version__
from onnxsmith.io import wire
from onnxsmith.io.files import FileRecord, commit_files, same_file, staging_dir

PROTOBUF_LIMIT = 2**31 - 1
#: Room left for the graph structure when deciding whether weights fit one file.
_STRUCTURE_MARGIN = 64 * 1024 * 1024
#: Initializers at least this big are streamed rather than serialised in memory.
_STREAM_TENSOR_BYTES = 4096
_PLACEHOLDER = "__onnxsmith_stream__"

PROVENANCE_KEY = "onnxsmith.provenance"


@dataclass
class Provenance:
    """Where a variant came from, stamped into its metadata_props."""

    source_name: str
    source_sha256: str
    steps: list[dict] = field(default_factory=list)  # [{"name": ..., "options": {...}}]

    def to_json(self) -> str:
        return json.dumps(
            {
                "tool": f"onnxsmith {__version__}",
                "source": {"name": self.source_name, "sha256": self.source_sha256},
                "steps": self.steps,
            },
            sort_keys=True,
            separators=(",", ":"),
        )


def data_file_name(path: str | os.PathLike) -> str:
    return Path(path).name + ".data"


def save_model(
    model: ir.Model,
    path: str | os.PathLike,
    *,
    provenance: Provenance | None = None,
    external_data: bool | None = None,
    protect: list[str | os.PathLike] = (),
) -> list[FileRecord]:
    """Write ``model`` to ``path`` (and ``path``.data when external); return what was written.

    ``external_data``: None decides by size, True forces a data file, False forbids one.
    ``protect``: files that must not be overwritten (the source model). Files that the
    model's own external tensors read from are protected as well.
    """
    with staged_model(model, path, provenance=provenance, external_data=external_data, protect=protect) as staged:
        return staged.commit()


class StagedModel:
    """A complete model written beside its destination, not yet in place.

    Verify ``path`` (a real file onnxruntime can load), then :meth:`commit`; leaving
    the ``with`` block without committing removes it, so nothing half-made remains.
    """

    def __init__(self, tmp: Path, final: Path, external: bool, protect) -> None:
        self.path = tmp / final.name
        self.final = final
        self.external = external
        self._data = tmp / data_file_name(final)
        self._protect = protect
        self._records: Future[list[FileRecord]] | None = None
        self.committed: list[FileRecord] | None = None

    def _pairs(self) -> list[tuple[Path, Path]]:
        """(staged, final) for each file, the data file first (a model must never precede its data)."""
        pairs = [(self._data, self.final.with_name(data_file_name(self.final)))] if self.external else []
        pairs.append((self.path, self.final))
        return pairs

    def commit(self) -> list[FileRecord]:
        pairs = self._pairs()
        staged = self._records.result() if self._records is not None else [FileRecord.of(p) for p, _ in pairs]
        commit_files(pairs)
        final_data = self.final.with_name(data_file_name(self.final))
        if not self.external and final_data.exists() and not _is_protected(final_data, self._protect):
            final_data.unlink()  # a data file left by an earlier external save of this name
        # The renames keep the bytes: the records hashed while staged hold for the final paths.
        self.committed = [
            FileRecord(final, record.bytes, record.sha256) for record, (_, final) in reversed(list(zip(staged, pairs)))
        ]
        return self.committed


@contextlib.contextmanager
def staged_model(
    model: ir.Model,
    path: str | os.PathLike,
    *,
    provenance: Provenance | None = None,
    external_data: bool | None = None,
    protect: list[str | os.PathLike] = (),
) -> Iterator[StagedModel]:
    """Write ``model`` into a staging folder beside ``path``; see :class:`StagedModel`."""
    path = Path(path)
    data_path = path.with_name(data_file_name(path))
    _refuse_overwriting(model, [path, data_path], protect)
    if provenance is not None:
        model.producer_name = "onnxsmith"
        model.producer_version = __version__
        model.metadata_props[PROVENANCE_KEY] = provenance.to_json()

    weight_bytes = _weight_bytes(model)
    too_big = weight_bytes > PROTOBUF_LIMIT - _STRUCTURE_MARGIN
    if external_data is None:
        external_data = too_big
    elif not external_data and too_big:
        raise UsageError(
            f"the model's weights take {weight_bytes / 2**30:.2f} GiB, over protobuf's 2 GiB "
            "limit for one file; save with external data",
            path,
        )
    with staging_dir(path.parent) as tmp, ThreadPoolExecutor(max_workers=1) as hashing:
        staged = StagedModel(tmp, path, external_data, protect)
        if external_data:
            # onnx-ir streams tensors into the data file with bounded memory.
            ir.save(model, staged.path, external_data=data_path.name)
        else:
            with open(staged.path, "wb") as f:
                write_single_file(model, f)
        # Hash what was written while the caller verifies it (hashlib releases the GIL).
        staged._records = hashing.submit(lambda: [FileRecord.of(p) for p, _ in staged._pairs()])
        yield staged


def _refuse_overwriting(model: ir.Model, targets: list[Path], protect) -> None:
    protected = [Path(p) for p in protect]
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                protected.append(Path(value.const_value.path))
    for target in targets:
        if target.exists() and any(p.exists() and same_file(p, target) for p in protected):
            raise UsageError("refusing to overwrite the input model; choose another output path", target)


def _is_protected(path: Path, protect) -> bool:
    return any(Path(p).exists() and same_file(p, path) for p in protect)


def _weight_bytes(model: ir.Model) -> int:
    total = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            if value.const_value is not None:
                total += value.const_value.nbytes
        for node in graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR:
                    total += attr.value.nbytes
    return total


def write_single_file(model: ir.Model, f: BinaryIO) -> None:
    """Write ``model`` as one protobuf, streaming large top-level initializers.

    The bytes are those of ``SerializeToString()`` of the whole model proto:
    fields are emitted in field-number order and each streamed tensor's
    ``raw_data`` goes exactly where the serialiser would have put it.
    """
    streamed: dict[str, ir.TensorProtocol] = {}
    originals: list[tuple[ir.Value, ir.TensorProtocol]] = []
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None or tensor.dtype == ir.DataType.STRING or tensor.nbytes < _STREAM_TENSOR_BYTES:
            continue
        originals.append((value, tensor))
        streamed[value.name] = tensor
        value.const_value = ir.ExternalTensor(
            _PLACEHOLDER,
            offset=0,
            length=tensor.nbytes,
            dtype=tensor.dtype,
            shape=tensor.shape,
            name=value.name,
        )
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in originals:
            value.const_value = tensor

    chunks: list[tuple[bytes, bytes, ir.TensorProtocol | None]] = []  # (before raw, after raw, tensor)
    for init in proto.graph.initializer:
        tensor = streamed.get(init.name)
        if tensor is None or init.data_location != onnx.TensorProto.EXTERNAL:
            chunks.append((init.SerializeToString(), b"", None))
            continue
        del init.external_data[:]
        init.ClearField("data_location")
        before, after = wire.split_at_field(init.SerializeToString(), wire.TENSOR_RAW_DATA)
        chunks.append((before, after, tensor))
    del proto.graph.initializer[:]
    graph_before, graph_after = wire.split_at_field(proto.graph.SerializeToString(), wire.GRAPH_INITIALIZER)
    proto.ClearField("graph")
    model_before, model_after = wire.split_at_field(proto.SerializeToString(), wire.MODEL_GRAPH)

    def raw_len(tensor):
        return 0 if tensor is None else tensor.nbytes

    def chunk_len(before, after, tensor):
        n = raw_len(tensor)
        raw_field = len(wire.len_prefix(wire.TENSOR_RAW_DATA, n)) + n if tensor is not None else 0
        return len(before) + raw_field + len(after)

    graph_len = len(graph_before) + len(graph_after)
    for before, after, tensor in chunks:
        n = chunk_len(before, after, tensor)
        graph_len += len(wire.len_prefix(wire.GRAPH_INITIALIZER, n)) + n

    f.write(model_before)
    f.write(wire.len_prefix(wire.MODEL_GRAPH, graph_len))
    f.write(graph_before)
    for before, after, tensor in chunks:
        f.write(wire.len_prefix(wire.GRAPH_INITIALIZER, chunk_len(before, after, tensor)))
        f.write(before)
        if tensor is not None:
            f.write(wire.len_prefix(wire.TENSOR_RAW_DATA, tensor.nbytes))
            _stream_tensor(tensor, f)
        f.write(after)
    f.write(graph_after)
    f.write(model_after)


def _stream_tensor(tensor: ir.TensorProtocol, f: BinaryIO) -> None:
    mapped_before = isinstance(tensor, ir.ExternalTensor) and tensor.raw is not None
    start = f.tell()
    tensor.tofile(f)
    if f.tell() - start != tensor.nbytes:
        raise InputError(f"tensor '{tensor.name}' wrote {f.tell() - start} bytes, expected {tensor.nbytes}")
    if isinstance(tensor, ir.ExternalTensor) and not mapped_before:
        try:  # unmap what this write paged in, so saving a big model stays small
            tensor.release()
        except BufferError:  # someone else still holds a view of the map
            pass
