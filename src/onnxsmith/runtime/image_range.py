"""An image input's value range where nothing in the graph says it: read from how its first Conv responds.

A network's first Conv was trained on pictures in one convention (0..255, 0..1, normalized), and what it does
with them shows it. Photos in each convention go through it (nothing else of the model runs):

* Where a BatchNormalization reads its output, the layer's running mean and variance are what that Conv gave on
  the training pictures: the convention whose photos give per-channel statistics closest to them is the one
  (each channel's mean off by so many running standard deviations, plus its variance's log ratio).
* Otherwise (a BatchNormalization folded into the Conv, or written out after it as per-channel Sub/Mul/Add)
  the normalized outputs sit near unit scale on the training data, and a convention 255 times off puts them
  there by as much: the convention whose median channel spread after those scales and shifts is nearest 1
  (in log scale) is taken.

Conventions that score about as well are all plausible: if 0..255 is among them with another, nothing is
decided (the range stays a guess); otherwise the widest of them is taken (normalized before 0..1: activation
scales fit to the wider range do not clip the narrower one). The running statistics are evidence: the range is
then known, and int8 calibrates Convs on pictures in it. The unit-scale rule is evidence only where every other
convention is at least 16 times off (0..255 against the others: a trained layer's scale is not fixed, but not
that loose); otherwise (normalized against 0..1, about 4 times apart) it says which range is likely: made-up
pictures are made in it, but the range stays a guess for what would fix activation scales from them; where
0..255 is ruled out, the others as near are kept beside it, and int8 calibrates and verifies on pictures in each
(a variant right whichever of them real pictures are in). The result is kept on the model in memory
(``model.meta``) and read by :func:`onnxsmith.analysis.input_roles.input_roles`, so every input set made for
that model afterwards, and the report's line on what each input was taken to be, use it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.input_roles import IMAGE, INFERRED_RANGES, InputRole, input_roles
from onnxsmith.core.errors import InputError
from onnxsmith.irutil.walk import computing_model, constant
from onnxsmith.runtime import runner
from onnxsmith.runtime.plausible import image

#: (value range, why, whether it is evidence enough to fix int8's activation scales from made-up pictures, the
#: other ranges as likely where it is not and 0..255 is ruled out: int8 calibrates and verifies in each of them).
Inferred = tuple[str, str, bool, tuple[str, ...]]
#: The conventions tried, widest first (what is taken where several score alike).
CONVENTIONS = ("0..255", "normalized", "0..1")
#: What a per-channel normalization after the first Conv is written with (with constant operands).
_AFFINE = frozenset({"Add", "Sub", "Mul", "Div", "BatchNormalization"})
#: Ops between the input and its first Conv that leave the pictures' values as they are.
_PASS = frozenset({"Cast", "Identity", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Pad"})
#: What may lie between the input and its first Conv: those, and Slices (a space-to-depth gathered by a Concat).
_REARRANGE = _PASS | {"Slice"}
_HOPS = 8
#: Pictures smaller than this on a side (a size the model merely runs at) tell nothing.
_MIN_SIDE = 16
#: A convention scoring within this of the best is as plausible (BatchNormalization: a factor; else log units).
_BN_FACTOR = 2.0
_SCALE_MARGIN = math.log(4.0)
#: Unit scale is evidence where every other convention is this far off: 0..255 is 50-255 times the others'
#: scale, which no trained layer's scale blurs; normalized is only about 4 times 0..1's.
_DECISIVE = math.log(16.0)


def infer_image_ranges(
    model: ir.Model, feeds: dict[str, np.ndarray], given: dict[str, dict[str, str]] | None = None
) -> dict[str, Inferred]:
    """Each image input whose range is a guess, with (the range its first Conv says, why, whether it is evidence:
    :data:`Inferred`), where it says one;
    ``feeds``: an input set the model runs on (its shapes are the photos'); ``given``: the user's corrections
    (an input whose range they give is not measured). Kept in ``model.meta``: measured once per model."""
    if INFERRED_RANGES in model.meta:
        return model.meta[INFERRED_RANGES]
    model.meta[INFERRED_RANGES] = {}  # while measuring (and if nothing can be): the roles as read
    found: dict[str, Inferred] = {}
    for role in input_roles(model).values():
        said = "value_range" in (given or {}).get(role.name, {})
        if role.kind != IMAGE or not role.range_guessed or said or role.name not in feeds:
            continue
        if min(_sides(feeds[role.name].shape, role.layout)) < _MIN_SIDE:  # a few pixels show no picture
            continue
        conv = _first_conv(next(v for v in model.graph.inputs if v.name == role.name))
        if conv is None:
            continue
        try:
            decided = _decide(model, conv, feeds, role)
        except InputError:  # the piece does not run on its own: nothing said
            decided = None
        if decided is not None:
            found[role.name] = decided
    model.meta[INFERRED_RANGES] = found
    return found


def _sides(shape: tuple[int, ...], layout: str | None) -> tuple[int, int]:
    return (shape[1], shape[2]) if layout == "NHWC" else (shape[2], shape[3])


def _first_conv(value: ir.Value) -> ir.Node | None:
    """The Conv that reads ``value`` first, through ops that keep its values: one after another, or a
    space-to-depth written out as Slices that one Concat gathers again (YOLOv5's Focus); every path must end
    in that one Conv, and a Concat must gather nothing else."""
    convs: set[ir.Node] = set()
    concats: set[ir.Node] = set()
    walked, pending = {value}, [value]
    while pending:
        if len(walked) > _HOPS * 4:
            return None
        uses = list(pending.pop().uses())
        if not uses:
            return None
        for node, index in uses:
            if node.op_type == "Conv" and node.domain == "" and index == 0:
                convs.add(node)
                continue
            if node.op_type == "Concat" and node.domain == "":
                concats.add(node)
            elif node.op_type not in _REARRANGE or index != 0:
                return None
            if node.outputs and node.outputs[0] not in walked:
                walked.add(node.outputs[0])
                pending.append(node.outputs[0])
    if any(v not in walked for concat in concats for v in concat.inputs):
        return None
    return convs.pop() if len(convs) == 1 else None


def _decide(model: ir.Model, conv: ir.Node, feeds: dict[str, np.ndarray], role: InputRole) -> Inferred | None:
    norm = _batch_norm(conv.outputs[0])
    out = conv.outputs[0] if norm is not None else _affine_tail(conv.outputs[0])
    piece = computing_model(model, [out])
    session = runner.open_session(piece, label=f"the first Conv of input '{role.name}'")
    template = feeds[role.name]
    scores = {}
    for convention in CONVENTIONS:
        pictures = image(template.shape, role.layout or "NCHW", convention, template.dtype, np.random.default_rng(0))
        response = runner.run(session, {**feeds, role.name: pictures}, [out.name], label=role.name)[out.name]
        axis = _channel_axis(response.shape, conv)
        channels = np.moveaxis(np.asarray(response, np.float64), axis, 0).reshape(response.shape[axis], -1)
        mean, spread = channels.mean(axis=1), channels.std(axis=1)
        scores[convention] = _bn_misfit(mean, spread, norm) if norm is not None else _off_unit(spread)
    best = min(scores.values())
    if not math.isfinite(best):
        return None
    close = [c for c in CONVENTIONS if scores[c] <= (best * _BN_FACTOR if norm is not None else best + _SCALE_MARGIN)]
    if "0..255" in close and len(close) > 1:
        return None
    if norm is not None:
        why = f"its first Conv's response to photos matches its BatchNormalization's statistics in {close[0]}"
        return close[0], why, True, ()
    likely = f"its first Conv's normalized outputs are near unit scale on photos in {close[0]}"
    others = [c for c in CONVENTIONS if c != close[0] and scores[c] - best < _DECISIVE]
    if not others:
        return close[0], f"{likely}, 16 times off in the others", True, ()
    if "0..255" in (close[0], *others):  # a 255-fold guess: no pictures cover both ends of it
        return close[0], f"{likely}: a likely range, not a stated one", False, ()
    why = f"{likely}, and about as near in {' and '.join(others)}: a likely range, not a stated one"
    return close[0], why, False, tuple(others)


def _channel_axis(shape: tuple[int, ...], conv: ir.Node) -> int:
    """Where the Conv's output channels are in ``shape`` (moved last by a Transpose after it, say)."""
    weight = constant(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if weight is not None and len(shape) > 2:
        found = [i for i in (1, len(shape) - 1) if shape[i] == weight.shape[0]]
        if found:
            return found[0]
    return 1


def _affine_tail(value: ir.Value) -> ir.Value:
    """``value`` after the per-channel scales and shifts that follow it (a bias, a BatchNormalization written out
    as Sub/Mul/Add, one not folded), through ops that keep values: what the training normalized to unit scale."""
    for _ in range(_HOPS):
        uses = list(value.uses())
        if len(uses) != 1 or not uses[0][0].outputs:
            break
        node, index = uses[0]
        if node.op_type in _AFFINE and node.domain == "":
            operands = [v for i, v in enumerate(node.inputs) if i != index]
            if node.op_type != "BatchNormalization" and not all(constant(v) is not None for v in operands):
                break
        elif node.op_type not in _PASS or index != 0:
            break
        value = node.outputs[0]
    return value


def _batch_norm(value: ir.Value) -> tuple[np.ndarray, np.ndarray] | None:
    """The running (mean, variance) of the BatchNormalization that alone reads ``value``, if one does."""
    uses = list(value.uses())
    if len(uses) != 1 or uses[0][0].op_type != "BatchNormalization" or uses[0][1] != 0:
        return None
    mean, var = (constant(v) for v in (list(uses[0][0].inputs[3:5]) + [None, None])[:2])
    if mean is None or var is None:
        return None
    return np.asarray(mean, np.float64).reshape(-1), np.asarray(var, np.float64).reshape(-1)


def _bn_misfit(mean: np.ndarray, spread: np.ndarray, norm: tuple[np.ndarray, np.ndarray]) -> float:
    """How far photos' per-channel statistics are from the running ones (channels the layer never uses left out)."""
    running_mean, running_var = norm
    if running_mean.shape != mean.shape:
        return math.inf
    live = running_var > 1e-8
    if not live.any():
        return math.inf
    std = np.sqrt(running_var[live])
    off = np.abs(mean[live] - running_mean[live]) / std
    ratio = np.abs(np.log((spread[live] ** 2 + 1e-12) / running_var[live]))
    return float(off.mean() + ratio.mean())


def _off_unit(spread: np.ndarray) -> float:
    """How far the median channel spread is from 1, in log units (inf where every channel is flat)."""
    live = spread[spread > 0]
    return abs(math.log(float(np.median(live)))) if live.size else math.inf
