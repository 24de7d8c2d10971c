"""Save a model: atomic, deterministic, streamed, stamped with where it came from.

* One .onnx file while the result fits protobuf's 2 GiB limit, else (or when
  asked) the weights go to one ``<name>.onnx.data`` beside it.
* Written into a staging folder beside the destination, fsynced, then renamed
  into place: a reader never sees half a model, a failure leaves nothing.
* The same model gives the same bytes: serialisation is canonical and the
  provenance stamp holds no time or path.
* The single file is streamed one tensor at a time (see :mod:`onnxsmith.io.wire`),
  so saving never holds a second copy of the weights.
* A saved model reads only what was written with it: a tensor still held in another
  model's file (a source's data file) is copied in, never left as a reference.
* What is staged passes onnx.checker before it is moved into place, and the files a
  source reads are never overwritten or removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from onnxsmith.core.errors import InputError, OutputError, UsageError
from onnxsmith.core.version import __version__
from onnxsmith.io import wire
from onnxsmith.io.check import check_with_onnx, tensors
from onnxsmith.io.files import (
    FileRecord,
    commit_files,
    copy_file,
    create_file,
    describe_os_error,
    made_dirs,
    protected,
    remove_inside,
    same_file_system,
    stage_texts,
    staging_dir,
    write_file,
)
from onnxsmith.io.load import passed_onnx_checker
from onnxsmith.io.paths import check_output, check_outputs

PROTOBUF_LIMIT = 2**31 - 1
#: Room left for the graph structure when deciding whether weights fit one file.
_STRUCTURE_MARGIN = 64 * 1024 * 1024
#: Initializers at least this big are streamed rather than serialised in memory.
_STREAM_TENSOR_BYTES = 4096
_PLACEHOLDER = "__onnxsmith_stream__"
#: A model file bigger than this is not parsed to find whether a data file beside it is its own.
_OWN_DATA_PARSE_BYTES = 64 * 1024 * 1024

PROVENANCE_KEY = "onnxsmith.provenance"


@dataclass
class Provenance:
    """Where a variant came from, stamped into its metadata_props."""

    source_name: str
    source_sha256: str
    steps: list[dict[str, Any]] = field(default_factory=list)  # [{"name": ..., "options": {...}}]
    #: Where a source that was not a file came from ("an onnx_ir.Model in memory"); None for a file.
    origin: str | None = None

    def to_json(self) -> str:
        source = {"name": self.source_name, "sha256": self.source_sha256}
        if self.origin is not None:
            source["origin"] = self.origin
        return json.dumps(
            {
                "tool": f"onnxsmith {__version__}",
                "source": source,
                "steps": self.steps,
            },
            sort_keys=True,
            separators=(",", ":"),
        )


def data_file_name(path: str | os.PathLike[str]) -> str:
    return Path(path).name + ".data"


def save_model(
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    provenance: Provenance | None = None,
    external_data: bool | None = None,
    protect: Sequence[str | os.PathLike[str]] = (),
) -> list[FileRecord]:
    """Write ``model`` to ``path`` (and ``path``.data when external); return what was written.

    ``external_data``: None decides by size, True forces a data file, False forbids one.
    ``protect``: files that must not be overwritten (the source model). Files that the
    model's own external tensors read from are protected as well.
    """
    with staged_model(model, path, provenance=provenance, external_data=external_data, protect=protect) as staged:
        return staged.commit()


class StagedModel:
    """A complete model written into a private folder, not yet in place.

    Verify ``path`` (a real file onnxruntime can load), then :meth:`commit` it to its
    destination; a model staged beside its destination (:func:`staged_model`) is renamed
    into place, one staged elsewhere (before its destination was known) is moved or
    copied there. Whoever owns the folder removes it, and what was not committed with it.
    """

    def __init__(self, path: Path, final: Path | None, external: bool, protect: list[Path]) -> None:
        self.path = path
        self.final = final
        self.external = external
        self._protect = protect
        self._records: Future[list[FileRecord]] | None = None
        #: The files are in the private folder (a commit moves them), not in a committed place (copied).
        self._staged = True
        self.committed: list[FileRecord] | None = None

    @property
    def data_path(self) -> Path | None:
        return self._data_file() if self.external else None

    def _data_file(self) -> Path:
        return self.path.with_name(data_file_name(self.path))

    def files(self) -> list[Path]:
        """The files as they are now, the data file first."""
        return [self._data_file(), self.path] if self.external else [self.path]

    def commit(
        self,
        final: str | os.PathLike[str] | None = None,
        *,
        alongside: tuple[str | os.PathLike[str], Callable[[list[FileRecord]], str]] | None = None,
    ) -> list[FileRecord]:
        """Put the model at ``final`` (default: where it was staged for); return what is there.

        ``alongside``: (path, render) of a text file committed with the model (a ``--report``),
        ``render`` given the records of what is put in place. It is written before anything
        moves, so one that cannot be written (a full disk) leaves no model either.

        The same checks as before any work: a regular file in a writable place, never a file
        a source reads. A model with a data file names it after ``final``: the .onnx is
        rewritten with that name when it differs from the staged one (the data file's bytes
        do not change). Moved when staged on the same file system, else copied through a
        staging folder beside ``final``.
        """
        target = Path(final) if final is not None else self.final
        if target is None:
            raise UsageError("no output path given; say where to save the model")
        return self._commit(target, alongside)

    def _commit(
        self, final: Path, alongside: tuple[str | os.PathLike[str], Callable[[list[FileRecord]], str]] | None
    ) -> list[FileRecord]:
        finals = [final.with_name(data_file_name(final)), final] if self.external else [final]
        check_outputs([*finals, alongside and alongside[0]], protect=self._protect)
        staged: list[FileRecord] | None = self._records.result() if self._records is not None and self._staged else None
        # The data file of the model being replaced goes with it, unless a source reads it.
        leftover = None if self.external else _own_data_file(final)
        with contextlib.ExitStack() as stack:
            stack.enter_context(made_dirs(final.parent))
            moving = self._staged and same_file_system(self.path.parent, final.parent)
            here = self.path.parent if moving else stack.enter_context(staging_dir(final.parent))
            placed = self._place(here, final, copy=not moving)
            before: list[FileRecord | None] = list(staged) if staged else [None] * len(finals)
            records = [
                # renamed as staged: the bytes hashed then hold; a copy or a rewritten .onnx is hashed
                FileRecord(path, record.bytes, record.sha256)
                if record is not None and was == now
                else dataclasses.replace(FileRecord.of(now), path=path)
                for record, was, now, path in zip(before, self.files(), placed, finals)
            ]
            pairs = list(zip(placed, finals))
            if alongside is not None:
                path, render = Path(alongside[0]), alongside[1]
                pairs += stage_texts(stack, [(path, render(records[::-1]))])
            commit_files(pairs, protect=self._protect)
        if leftover is not None and not protected(leftover, self._protect):
            remove_inside(final.parent, leftover.name)
        self.path, self._staged, self._records = final, False, None
        self.committed = records[::-1]  # the model first
        return self.committed

    def _place(self, folder: Path, final: Path, *, copy: bool) -> list[Path]:
        """The files to rename into place, in ``folder``: the staged ones, copies, or a relocated .onnx."""
        placed = []
        try:
            if self.external:
                data = self._data_file()
                if copy:
                    data = folder / data_file_name(final)
                    copy_file(self._data_file(), data)
                placed.append(data)
            model = self.path
            if self.external and final.name != self.path.name:
                model = folder / (final.name if folder != self.path.parent else f".{final.name}.relocated")
                _relocate(self.path, data_file_name(self.path), data_file_name(final), model)
            elif copy:
                model = folder / final.name
                copy_file(self.path, model)
            placed.append(model)
        except OSError as err:
            raise OutputError(f"cannot write: {describe_os_error(err)}", final) from None
        return placed


def _relocate(path: Path, old: str, new: str, to: Path) -> None:
    """Write the .onnx at ``path`` to ``to`` with its external data at ``new`` instead of ``old``.

    The bytes are those a save to ``to`` would write: only the location strings differ.
    """
    proto = onnx.load(os.fspath(path), load_external_data=False)
    for tensor in tensors(proto):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    write_file(to, proto.SerializeToString())


def _own_data_file(path: Path) -> Path | None:
    """``<path>.data`` if the model now at ``path`` reads it (a stale data file once it is replaced)."""
    data = path.with_name(data_file_name(path))
    try:
        if data.is_symlink() or not data.is_file() or not path.is_file() or path.stat().st_size > _OWN_DATA_PARSE_BYTES:
            return None
        proto = onnx.load(os.fspath(path), load_external_data=False)
    except (OSError, DecodeError, RuntimeError, ValueError):
        return None  # not a model we can read: leave its neighbours alone
    return data if data.name in _locations(proto) else None


def _locations(proto: onnx.ModelProto) -> set[str]:
    """The external-data locations the tensors of ``proto`` name."""
    return {
        entry.value
        for tensor in tensors(proto)
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }


@contextlib.contextmanager
def staged_model(
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    provenance: Provenance | None = None,
    external_data: bool | None = None,
    protect: Sequence[str | os.PathLike[str]] = (),
) -> Iterator[StagedModel]:
    """Write ``model`` into a staging folder beside ``path``; see :class:`StagedModel`.

    ``protect``: the files the source reads; the files ``model`` itself still reads are added.
    Leaving the block removes the staging folder and whatever was not committed.
    """
    path = Path(path)
    check_output(path, protect=[Path(p) for p in protect] + _files_read(model))
    with staging_dir(path.parent) as tmp:
        yield stage_model(
            model, tmp, path, provenance=provenance, external_data=external_data, protect=protect, final=path
        )


def stage_model(
    model: ir.Model,
    folder: Path,
    name: str | os.PathLike[str],
    *,
    provenance: Provenance | None = None,
    external_data: bool | None = None,
    protect: Sequence[str | os.PathLike[str]] = (),
    final: Path | None = None,
) -> StagedModel:
    """Write ``model`` as ``folder``/``name`` (and its data file); see :class:`StagedModel`.

    ``folder`` is a private folder the caller owns (and removes). ``final``: the destination, when
    it is known (it names the data file and the messages; else ``name`` does).
    """
    name = Path(name).name
    protect = [Path(p) for p in protect] + _files_read(model)
    shown = final if final is not None else Path(name)  # what messages name
    if final is not None:
        check_output(final, protect=protect)
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
            shown,
        )
    if external_data and final is not None:
        check_output(final.with_name(data_file_name(final)), protect=protect)
    staged = StagedModel(folder / (final.name if final is not None else name), final, external_data, protect)
    data_name = data_file_name(staged.path)
    try:
        if external_data:
            # onnx-ir streams initializers into the data file with bounded memory (those of
            # subgraphs too); a tensor attribute still read from a file is copied in.
            with _in_memory(_file_attributes(model)):
                ir.save(model, staged.path, external_data=data_name)
            check_written(onnx.load(os.fspath(staged.path), load_external_data=False), staged.path, data_name, shown)
        else:
            with create_file(staged.path) as f:
                write_single_file(model, f, check=lambda proto: check_written(proto, staged.path, None, shown))
            passed_onnx_checker(staged.path)  # the gate loads it next: no need to check it twice
    except OSError as err:
        raise OutputError(f"cannot write: {describe_os_error(err)}", shown) from None
    # Hash what was written while the caller verifies it (hashlib releases the GIL).
    hashing = ThreadPoolExecutor(max_workers=1)
    staged._records = hashing.submit(lambda: [FileRecord.of(p) for p in staged.files()])
    hashing.shutdown(wait=False)  # the hash goes on; commit() waits for it
    return staged


def check_written(proto: onnx.ModelProto, path: Path, data_file: str | None, final: Path) -> None:
    """A model staged at ``path`` (for ``final``) reads no file but its own data file, and passes onnx.checker.

    Either failing is onnxsmith's fault, not the input's; it is said so, naming the output.
    """
    foreign = sorted(_locations(proto) - {data_file, _PLACEHOLDER})
    try:
        if foreign:
            raise InputError(f"it would read '{foreign[0]}', another model's file")
        check_with_onnx(proto, path)
    except InputError as err:
        raise InputError(
            f"the model made is not valid ({err.problem}); nothing written (a bug in onnxsmith or one of "
            "its passes: please report it with the source model)",
            final,
        ) from None


def _files_read(model: ir.Model) -> list[Path]:
    return [Path(tensor.path) for tensor in _file_tensors(model)]


def _file_tensors(model: ir.Model) -> Iterator[ir.ExternalTensor]:
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                yield value.const_value
    for _, attr in _file_attributes(model):
        yield attr.value


def _file_attributes(model: ir.Model) -> list[tuple[ir.Node, ir.Attr]]:
    """Tensor attributes (a Constant's value) whose data is still in a file."""
    return [
        (node, attr)
        for graph in model.graphs()
        for node in graph
        for attr in node.attributes.values()
        if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor)
    ]


@contextlib.contextmanager
def _in_memory(items: list[tuple[Any, Any]]) -> Iterator[None]:
    """Hold tensors read from files in memory while the model is serialised, then put the originals back.

    ``items``: (value, tensor) for initializers, (node, attr) for tensor attributes.
    """
    restore = []
    try:
        for owner, item in items:
            if isinstance(owner, ir.Node):
                copy = ir.Tensor(item.value.numpy(), dtype=item.value.dtype, name=item.value.name)
                owner.attributes[item.name] = ir.Attr(item.name, ir.AttributeType.TENSOR, copy)
            else:
                owner.const_value = ir.Tensor(item.numpy(), dtype=item.dtype, name=owner.name)
            restore.append((owner, item))
        yield
    finally:
        for owner, item in restore:
            if isinstance(owner, ir.Node):
                owner.attributes[item.name] = item
            else:
                owner.const_value = item


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


def _proto_without_streamed(model: ir.Model) -> tuple[onnx.ModelProto, dict[str, ir.TensorProtocol]]:
    """The model's proto with its large top-level initializers as external references to a placeholder (their
    bytes are streamed in after), and those tensors by name; subgraphs' file tensors copied in."""
    streamed: dict[str, ir.TensorProtocol] = {}
    originals: list[tuple[ir.Value, ir.TensorProtocol]] = []
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None or tensor.dtype == ir.DataType.STRING:
            continue
        if tensor.nbytes < _STREAM_TENSOR_BYTES and not isinstance(tensor, ir.ExternalTensor):
            continue
        originals.append((value, tensor))
        streamed[name] = tensor
        value.const_value = ir.ExternalTensor(
            _PLACEHOLDER,
            offset=0,
            length=tensor.nbytes,
            dtype=tensor.dtype,
            shape=tensor.shape,  # type: ignore[arg-type]  # an ir.Shape: onnx-ir types it as its protocol
            name=name,
        )
    in_files = [
        (value, value.const_value)
        for graph in model.graphs()
        if graph is not model.graph
        for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
    ]
    try:
        with _in_memory(in_files + _file_attributes(model)):
            proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in originals:
            value.const_value = tensor
    _drop_restated_initializer_types(proto.graph)
    return proto, streamed


def write_single_file(model: ir.Model, f: BinaryIO, *, check: Callable[[onnx.ModelProto], None] | None = None) -> None:
    """Write ``model`` as one protobuf, streaming large top-level initializers.

    The bytes are those of ``SerializeToString()`` of the whole model proto:
    fields are emitted in field-number order and each streamed tensor's
    ``raw_data`` goes exactly where the serialiser would have put it. Every tensor
    still read from a file is written in full (streamed, or copied in when small or in
    a subgraph): the file refers to no other. ``check`` sees the proto before anything
    is written, its streamed tensors as external references to a placeholder.
    """
    proto, streamed = _proto_without_streamed(model)
    if check is not None:
        check(proto)

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

    def raw_len(tensor: ir.TensorProtocol | None) -> int:
        return 0 if tensor is None else tensor.nbytes

    def chunk_len(before: bytes, after: bytes, tensor: ir.TensorProtocol | None) -> int:
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


def _drop_restated_initializer_types(graph: onnx.GraphProto) -> None:
    """Leave out value_info that only repeats an initializer's own dtype and dims (onnx-ir writes one each).

    On a small model they are a visible share of the file; nothing reads them that
    could not read the tensor.
    """
    declared = {init.name: (init.data_type, list(init.dims)) for init in graph.initializer}
    kept = []
    for info in graph.value_info:
        tensor_type = info.type.tensor_type
        restated = (
            info.name in declared
            and info.type.WhichOneof("value") == "tensor_type"
            and not info.doc_string
            and not info.metadata_props
            and all(d.HasField("dim_value") for d in tensor_type.shape.dim)
            and declared[info.name] == (tensor_type.elem_type, [d.dim_value for d in tensor_type.shape.dim])
        )
        if not restated:
            kept.append(info)
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _drop_restated_initializer_types(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _drop_restated_initializer_types(sub)


def _stream_tensor(tensor: ir.TensorProtocol, f: BinaryIO) -> None:
    mapped_before = isinstance(tensor, ir.ExternalTensor) and tensor.raw is not None
    start = f.tell()
    tensor.tofile(f)  # type: ignore[attr-defined]  # onnx-ir's tensors have it; its protocol does not say so
    if f.tell() - start != tensor.nbytes:
        raise InputError(f"tensor '{tensor.name}' wrote {f.tell() - start} bytes, expected {tensor.nbytes}")
    if isinstance(tensor, ir.ExternalTensor) and not mapped_before:
        try:  # unmap what this write paged in, so saving a big model stays small
            tensor.release()
        except BufferError:  # someone else still holds a view of the map
            pass
