"""What an image input's pictures show: photos, or pages of printed text with a photo where the model maps them.

A text detector (PP-OCR's DB, CRAFT) answers with a map of the picture: on a portrait it finds nothing, its map
stays near 0, and a calibration or a gate on portraits exercises nothing of it (PP-OCR's detector: its int8
Convs measured 8e-2 to 8.5e-1 alone on photos, 2e-3 to 4e-2 on pages). A classifier or a grid detector answers
with vectors; pages among its pictures would only make them less like its real inputs (a face-age network's
int8 drifted by 0.2 years more). So the model is run once on the sized pictures: an output of rank 4 whose
spatial size is the picture's, or a half or a quarter of it, maps the picture, and that input's pictures are
pages of printed text with a photo on each (a document with a figure: every picture has text and a photo's
content; with pages in half the pictures, two sets of photos left PP-OCR's map exactly 0). The result is kept
on the model in memory (``model.meta``), as image ranges are (runtime/image_range.py), and read by
:func:`onnxsmith.analysis.input_roles.input_roles`.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.input_roles import IMAGE, PAGE_INPUTS, input_roles
from onnxsmith.core.errors import InputError
from onnxsmith.runtime import runner

#: Pictures smaller than this on a side (or a text line: runtime/real_data.py) get no pages.
MIN_SIDE = 64
#: A map at the picture's size, or this many times smaller on each side.
_STRIDES = (1, 2, 4)


def infer_page_inputs(
    model: ir.Model, feeds: dict[str, np.ndarray], output_shapes: dict[str, tuple[int, ...]] | None = None
) -> dict[str, str]:
    """Each image input some output maps (see the module doc), with why; ``feeds``: an input set the model runs
    on (its shapes are the pictures'); ``output_shapes``: the float outputs' shapes on them where a run already
    gave them (sizing's), else the model is run. Kept in ``model.meta``: measured once per model."""
    if PAGE_INPUTS in model.meta:
        return model.meta[PAGE_INPUTS]
    model.meta[PAGE_INPUTS] = {}
    sides = {}
    for role in input_roles(model).values():
        if role.kind == IMAGE and role.name in feeds and feeds[role.name].ndim == 4:
            shape = feeds[role.name].shape
            h, w = (shape[1], shape[2]) if role.layout == "NHWC" else (shape[2], shape[3])
            if min(h, w) >= MIN_SIDE and w < 3 * h:
                sides[role.name] = (h, w)
    if not sides:
        return {}
    if output_shapes is None:
        try:
            output_shapes = float_output_shapes(runner.open_session(model, label="the model"), feeds, "the model")
        except InputError:  # it does not run on these: nothing said
            return {}
    found = {}
    for name, (h, w) in sides.items():
        for output, shape in output_shapes.items():
            stride = _maps(shape, h, w)
            if stride is not None:
                size = "its size" if stride == 1 else f"1/{stride} of its size"
                found[name] = f"its output '{output}' maps the picture at {size}"
                break
    model.meta[PAGE_INPUTS] = found
    return found


def float_output_shapes(session, feeds: dict[str, np.ndarray], label=None) -> dict[str, tuple[int, ...]]:
    """The shapes of the float outputs ``session`` gives on ``feeds`` (raises InputError where it does not run)."""
    outputs = runner.run(session, feeds, label=label)
    return {name: np.shape(value) for name, value in outputs.items() if np.asarray(value).dtype.kind == "f"}


def _maps(shape: tuple[int, ...], h: int, w: int) -> int | None:
    """The stride at which an output of ``shape`` maps an h x w picture (NCHW or NHWC), if it does."""
    if len(shape) != 4:
        return None
    for stride in _STRIDES:
        if h % stride or w % stride:
            continue
        if (h // stride, w // stride) in (tuple(shape[2:4]), tuple(shape[1:3])):
            return stride
    return None
