"""Protocol-buffer wire format, just enough to stream weights in and out of .onnx files.

This is the I/O edge: the only module that looks at protobuf bytes. It exists so
that a 1.2 GB single-file model is never copied into Python bytes: on load the
weights' ``raw_data`` fields are located in a memory map and handed to onnx-ir
as external tensors that point into the .onnx file itself; on save the
weights are streamed one tensor at a time between canonically-serialised
pieces of the proto, so the bytes equal ``SerializeToString()`` of the whole
model without ever holding it.

Field numbers are those of onnx.proto3 (ModelProto.graph = 7,
GraphProto.initializer = 5, TensorProto.raw_data = 9, ...).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import NamedTuple

#: What the wire format is read from: bytes, or a memory map of the file.
Buffer = bytes | bytearray | memoryview | mmap.mmap

VARINT = 0
I64 = 1
LEN = 2
I32 = 5

MODEL_GRAPH = 7
GRAPH_INITIALIZER = 5
TENSOR_RAW_DATA = 9


class WireError(ValueError):
    """The bytes are not a well-formed protocol buffer."""


class Field(NamedTuple):
    number: int
    wire_type: int
    start: int  # offset of the tag
    value_start: int  # offset of the payload (after the length prefix for LEN)
    end: int  # offset just past the field


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_key(number: int, wire_type: int) -> bytes:
    return encode_varint((number << 3) | wire_type)


def len_prefix(number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field whose payload has ``length`` bytes."""
    return encode_key(number, LEN) + encode_varint(length)


def iter_fields(buf: Buffer, start: int, end: int) -> Iterator[Field]:
    """The top-level fields of the message in ``buf[start:end]``."""
    pos = start
    while pos < end:
        tag_start = pos
        key, pos = read_varint(buf, pos, end)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire_type == VARINT:
            _, pos = read_varint(buf, pos, end)
            value_start = pos
        elif wire_type == I64:
            value_start, pos = pos, pos + 8
        elif wire_type == I32:
            value_start, pos = pos, pos + 4
        elif wire_type == LEN:
            length, value_start = read_varint(buf, pos, end)
            pos = value_start + length
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        if pos > end:
            raise WireError("field runs past the end of its message")
        yield Field(number, wire_type, tag_start, value_start, pos)


def split_at_field(buf: bytes, field_number: int) -> tuple[bytes, bytes]:
    """Split a canonically serialised message into the fields before ``field_number`` and after.

    The message must not contain ``field_number`` itself; serialisers write fields
    in increasing number order, so inserting the field between the two halves
    reproduces canonical serialisation.
    """
    for field in iter_fields(buf, 0, len(buf)):
        if field.number == field_number:
            raise WireError(f"field {field_number} is already present")
        if field.number > field_number:
            return buf[: field.start], buf[field.start :]
    return buf, b""
