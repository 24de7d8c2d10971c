"""Load an .onnx file into onnx-ir, or say in one line why it can't be loaded.

Weights are never copied into Python bytes: external data is memory-mapped by
onnx-ir, and a large single-file model has its ``raw_data`` fields located in a
memory map of the file (see :mod:`onnxsmith.io.wire`) and exposed to onnx-ir as
external tensors pointing into the .onnx file itself.
"""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from onnxsmith.core.errors import InputError
from onnxsmith.io import wire
from onnxsmith.io.check import check_model_proto, ops_left_to_onnxruntime

#: Files at least this big are read through a memory map (weights stay on disk).
LAZY_FILE_BYTES = 32 * 1024 * 1024
#: In a lazily read file, tensors at least this big stay on disk.
LAZY_TENSOR_BYTES = 64 * 1024

MIN_IR_VERSION = 3
#: ``model.meta`` key of the file a model was loaded from.
SOURCE_PATH = "onnxsmith.source_path"
#: ``model.meta`` key: the ops onnx.checker has no schema for that onnxruntime runs, accepted
#: ((domain, op type, opset) list; io/check.py). Absent when there are none.
LEFT_TO_ONNXRUNTIME = "onnxsmith.left_to_onnxruntime"

#: Big files that passed onnx.checker, by identity: a command loads its source more than once
#: (the gate loads it again), and on ViT-L the checker takes a tenth of a second each time.
#: Writing 32 MB takes longer than a file system's clock tick: a file rewritten since has
#: another mtime. (Our own checks are cheap and always run.)
_CHECKED_BY_ONNX: set[tuple[int, int, int, int]] = set()


def load_model(
    path: str | os.PathLike[str], *, lazy_file_bytes: int = LAZY_FILE_BYTES, checker: bool = True
) -> ir.Model:
    """Load and validate ``path``; raise :class:`InputError` naming the problem.

    ``checker=False``: onnx.checker's full check is skipped (our own checks still run), for a model that
    onnxruntime has opened although the checker refuses it (``runtime.runner.load_runnable``).
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file", path)
    if path.is_dir():
        raise InputError("is a folder, expected an .onnx file", path)
    if not path.is_file():
        raise InputError("is not a regular file (a device, fifo or socket), expected an .onnx file", path)
    size = path.stat().st_size
    if size == 0:
        raise InputError("file is empty", path)
    stat = path.stat()
    lazy = size >= lazy_file_bytes and stat.st_nlink == 1
    try:
        if lazy:
            proto = _read_lazily(path)
        else:
            proto = onnx.load(os.fspath(path), load_external_data=False)
    except (DecodeError, wire.WireError, RuntimeError) as err:
        raise InputError(f"not a valid ONNX file (protobuf parse failed: {err})", path) from None
    except OSError as err:
        raise InputError(f"cannot read ({err.strerror})", path) from None
    _check_header(proto, path)
    identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    check_model_proto(proto, path, with_onnx=checker and not (lazy and identity in _CHECKED_BY_ONNX))
    if lazy and checker:
        _CHECKED_BY_ONNX.add(identity)
    # onnx-ir logs what it tolerates (dangling outputs, unknown inputs); the checks above report it properly.
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as err:  # onnx-ir rejects malformed protos with assorted errors
        raise InputError(f"not a valid ONNX model ({err})", path) from None
    ir.external_data.set_base_dir(model.graph, path.parent)
    _map_windows(model)
    model.meta[SOURCE_PATH] = path  # for messages about the model made far from here
    left = ops_left_to_onnxruntime(proto)
    if left:
        model.meta[LEFT_TO_ONNXRUNTIME] = left
    return model


def passed_onnx_checker(path: str | os.PathLike[str]) -> None:
    """Note that the file at ``path`` (as it is now) passed onnx.checker: a save checked what it wrote."""
    stat = os.stat(path)
    if stat.st_size >= LAZY_FILE_BYTES:
        _CHECKED_BY_ONNX.add((stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns))


def files_read_by(*paths: str | os.PathLike[str]) -> list[Path]:
    """Every file the models at ``paths`` read; each is loaded, so a bad one is refused here, before any work."""
    return sorted({f for path in paths for f in source_files(load_model(path), path)})


def source_files(model: ir.Model, path: str | os.PathLike[str]) -> list[Path]:
    """The files ``model``, as loaded from ``path``, reads: the .onnx and each external data file.

    Call it before transforming the model (a transform may drop references); outputs must
    never overwrite or remove any of them.
    """
    files = {Path(path)}
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                files.add(Path(value.const_value.path))
        for node in graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                    files.add(Path(attr.value.path))
    return sorted(files)


def release_weights(model: ir.Model) -> None:
    """Unmap every weight of ``model`` read from its files (onnx-ir maps one on first read).

    A model's graph holds reference cycles, so its maps would otherwise stay until the
    garbage collector runs: with a big model, another model's worth of resident memory.
    The model stays usable (a released weight is mapped again when next read).
    """
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                value.const_value.release()


def discard_weights(model: ir.Model) -> None:
    """Let go of every weight of a ``model`` that is not used again: those of its files unmapped, those made in
    memory dropped (the model is unusable after). Its graph's reference cycles would keep them until the garbage
    collector runs, which can be after the next model is made: the int8 copy of a 2 GB table is 0.5 GB each time.
    """
    release_weights(model)
    for graph in model.graphs():
        for value in graph.initializers.values():
            value.const_value = None


class WindowTensor(ir.ExternalTensor):
    """An external tensor that maps only its own bytes of its file, not the whole file.

    onnx-ir's ExternalTensor maps the whole file for each tensor it reads: a model of N
    weights in one file of S bytes then takes N x S of address space (150 weights of a
    43 MB U-Net: 6.5 GB, and again for each copy of the model a command loads), which a
    memory limit (ulimit -v, a container's) refuses though little of it is ever resident.
    Mapped window by window, a model takes its own size. Sub-byte types are read as onnx-ir
    reads them (they are unpacked into memory anyway).
    """

    _window_start = 0

    def _load(self) -> None:
        offset, length = self.offset or 0, self.length or self.nbytes
        if self.size == 0 or self.dtype.bitwidth % 8:
            self._window_start = 0
            super()._load()  # type: ignore[no-untyped-call]  # onnx-ir leaves it unannotated
            return
        self._check_validity()
        self._check_path_containment()
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with open(self.path, "rb") as f:
            self.raw = mmap.mmap(f.fileno(), offset + length - start, offset=start, access=mmap.ACCESS_READ)
        self._window_start = start
        dtype = np.dtype(self.dtype.numpy()).newbyteorder("<")
        self._array = np.frombuffer(self.raw, dtype=dtype, offset=offset - start, count=self.size).reshape(
            self.shape.numpy()
        )

    def tobytes(self) -> bytes:
        self._check_validity()
        if self.raw is None:
            self._load()
        assert self.raw is not None  # mapped by _load
        offset = (self.offset or 0) - self._window_start
        return bytes(self.raw[offset : offset + (self.length or self.nbytes)])


def _map_windows(model: ir.Model) -> None:
    """Every external tensor of ``model`` (initializers, tensor attributes) as a :class:`WindowTensor`."""

    def windowed(tensor: ir.ExternalTensor) -> WindowTensor:
        return WindowTensor(
            tensor.location,
            offset=tensor.offset,
            length=tensor.length,
            dtype=tensor.dtype,
            shape=tensor.shape,
            name=tensor.name,
            doc_string=tensor.doc_string,
            metadata_props=tensor.metadata_props,
            base_dir=tensor.base_dir,
        )

    for graph in model.graphs():
        for value in graph.initializers.values():
            if type(value.const_value) is ir.ExternalTensor:
                value.const_value = windowed(value.const_value)
        for node in graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR and type(attr.value) is ir.ExternalTensor:
                    node.attributes[attr.name] = ir.AttrTensor(
                        attr.name, windowed(attr.value), doc_string=attr.doc_string
                    )


def _check_header(proto: onnx.ModelProto, path: Path) -> None:
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise InputError("not an ONNX model (no graph or IR version in the file)", path)
    if proto.ir_version > onnx.IR_VERSION:
        raise InputError(
            f"IR version {proto.ir_version} is newer than the onnx package here supports "
            f"(at most {onnx.IR_VERSION}); upgrade onnx",
            path,
        )
    if proto.ir_version < MIN_IR_VERSION:
        raise InputError(
            f"IR version {proto.ir_version} is older than supported (at least {MIN_IR_VERSION})",
            path,
        )


def _read_lazily(path: Path) -> onnx.ModelProto:
    """Parse ``path`` leaving large initializers' bytes in the file, as external data."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        model_rest = bytearray()
        graphs: list[wire.Field] = []
        for field in wire.iter_fields(buf, 0, len(buf)):
            if field.number == wire.MODEL_GRAPH and field.wire_type == wire.LEN:
                graphs.append(field)
            else:
                model_rest += buf[field.start : field.end]
        proto: onnx.ModelProto = onnx.ModelProto.FromString(bytes(model_rest))
        for graph_field in graphs:  # a message field repeated on the wire is merged
            graph_rest = bytearray()
            initializers: list[wire.Field] = []
            for field in wire.iter_fields(buf, graph_field.value_start, graph_field.end):
                if field.number == wire.GRAPH_INITIALIZER and field.wire_type == wire.LEN:
                    initializers.append(field)
                else:
                    graph_rest += buf[field.start : field.end]
            proto.graph.MergeFromString(bytes(graph_rest))
            for init in initializers:
                _add_initializer(proto.graph, buf, init, path.name)
    return proto


def _add_initializer(graph: onnx.GraphProto, buf: wire.Buffer, init: wire.Field, file_name: str) -> None:
    header = bytearray()
    raw: wire.Field | None = None
    for field in wire.iter_fields(buf, init.value_start, init.end):
        if field.number == wire.TENSOR_RAW_DATA and field.wire_type == wire.LEN:
            raw = field
        else:
            header += buf[field.start : field.end]
    tensor = graph.initializer.add()
    tensor.ParseFromString(bytes(header))
    if raw is None:
        return
    length = raw.end - raw.value_start
    if length < LAZY_TENSOR_BYTES:
        tensor.raw_data = buf[raw.value_start : raw.end]
        return
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", file_name), ("offset", raw.value_start), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
