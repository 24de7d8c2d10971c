"""Face boxes in the WIDER FACE annotation format.

The format of ``wider_face_val_bbx_gt.txt``: for each image, a line with its path
(relative to the images folder), a line with the number of faces, then one line
per face: ``x y w h`` in pixels (top-left corner, size), optionally followed by
WIDER's attribute flags ``blur expression illumination invalid occlusion pose``.
An image with no face still has one all-zero box line (WIDER's own quirk)::

    0--Parade/0_Parade_marchingband_1_465.jpg
    2
    345 211 40 44 2 0 0 0 2 0
    331 126 33 38 2 0 0 0 0 0
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from onnxsmith.core.errors import InputError
from onnxsmith.io.paths import read_text

_INVALID_FLAG = 7  # index of WIDER's "invalid" attribute on a box line
#: No coordinate or size of a face box is larger (in pixels): beyond any image an image file may declare
#: (faceage refuses more than 89 megapixels), and small enough that rounding it to a pixel is exact.
MAX_BOX_PIXELS = 1 << 24


def box_problem(box: tuple[float, float, float, float]) -> str | None:
    """What is wrong with a face box (x, y, w, h), in words; None if nothing. The one check of every box:
    a boxes file's lines and ``predict --box``. ('nan' and '1e999' parse as floats, then break the crop.)"""
    if not all(math.isfinite(v) for v in box):
        return "coordinates must be finite numbers"
    if any(abs(v) > MAX_BOX_PIXELS for v in box):
        return f"coordinates must be within ±{MAX_BOX_PIXELS} pixels"
    if box[2] < 0 or box[3] < 0:
        return f"width and height must not be negative ({box[2]:g} x {box[3]:g})"
    return None


@dataclass(frozen=True)
class FaceBox:
    image: str  # path relative to the images folder, as written in the file
    index: int  # position of the box among the image's boxes
    x: float
    y: float
    w: float
    h: float
    invalid: bool = False
    line: int = 0  # where it is in the annotation file

    @property
    def id(self) -> str:
        return f"{self.image}#{self.index}"


def read_boxes(path: str | os.PathLike) -> list[FaceBox]:
    """Every box in the file, in file order; one-line errors naming the file and line."""
    path = Path(path)
    lines = read_text(path, "annotation file").splitlines()
    boxes: list[FaceBox] = []
    i = 0

    def where(n: int) -> str:
        return f"{path}:{n + 1}"

    while i < len(lines):
        name = lines[i].strip()
        if not name:
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].strip().isdigit():
            raise InputError(f"expected the number of faces after the image name '{name}'", where(i + 1))
        count = int(lines[i + 1])
        i += 2
        rows = max(count, 1)  # zero faces still has one placeholder line
        if i + rows > len(lines):
            raise InputError(f"'{name}' announces {count} faces but the file ends first", where(len(lines) - 1))
        for k in range(rows):
            fields = lines[i + k].split()
            try:
                numbers = [float(v) for v in fields]
            except ValueError:
                raise InputError(
                    f"a box line must be numbers 'x y w h ...', got '{lines[i + k].strip()}'", where(i + k)
                ) from None
            if len(numbers) < 4:
                raise InputError(f"a box line needs at least 'x y w h', got '{lines[i + k].strip()}'", where(i + k))
            if count == 0:
                continue
            x, y, w, h = numbers[:4]
            problem = box_problem((x, y, w, h))
            if problem:
                raise InputError(f"box of '{name}': {problem} (got '{lines[i + k].strip()}')", where(i + k))
            invalid = len(numbers) > _INVALID_FLAG and numbers[_INVALID_FLAG] == 1
            boxes.append(FaceBox(name, k, x, y, w, h, invalid, i + k + 1))
        i += rows
    return boxes


def padded_box(
    box: tuple[float, float, float, float], padding: float, width: int, height: int
) -> tuple[int, int, int, int]:
    """The crop (left, top, right, bottom) of a face: widened by ``padding``·w left and right and
    ``padding``·h above and below, rounded to whole pixels and clamped to the image."""
    x, y, w, h = box
    left = max(0, round(x - padding * w))
    top = max(0, round(y - padding * h))
    right = min(width, round(x + w + padding * w))
    bottom = min(height, round(y + h + padding * h))
    return left, top, right, bottom
