"""Input sizes a model runs at when the user gave none.

A symbolic dim nobody sized cannot simply be 1 (or 8 for a sequence): a detector does not run
on a 1x1 image (its upsampled maps no longer match the skip connections), a ViT's patch
embedding needs at least one patch, a voice detector's STFT needs a window of samples.
So :func:`inputs_that_run` proposes sizes a user would feed and checks on the model
itself that they run:

* an image's height and width (the spatial axes of a 4-D float input) are what the
  model's metadata says (Ultralytics writes ``imgsz``), else stride-friendly 224, then
  320 and 640, then a text line (48 x 320, 32 x 320: a recogniser runs at no square);
* the samples of a waveform a length input measures (an utterance, as an ASR front end takes it:
  :mod:`onnxsmith.analysis.input_roles`) are one second at 16 kHz first: a front end runs at 1 sample
  too, and its few frames prove nothing;
* other unsized dims (a sequence, an audio window) start at the usual default
  (:func:`~onnxsmith.runtime.inputs.default_dim`) and grow (64, 512) when the model
  does not run (an unnamed one only on an input's last axis); a batch stays 1 and a past
  length 0.

An image input whose value range nothing in the graph says is then read from how its first Conv responds to
photos (:mod:`onnxsmith.runtime.image_range`), and one an output maps gets pages of printed text with a photo
on each (:mod:`onnxsmith.runtime.image_content`): its pictures are made again.

The first assignment the model runs at wins; the old guess (1 for every side) is the last
resort. When none runs, the one-line error names the dims that were guessed and says how
to set them. (Values matter too: :func:`~onnxsmith.runtime.inputs.random_inputs` gives an
integer scalar named like a sample rate 16000.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.input_roles import (
    INFERRED_RANGES,
    LENGTH,
    MEL,
    MEL_SCALES,
    PAGE_INPUTS,
    SAMPLE_RATE,
    WAVEFORM,
    input_roles,
    with_given,
)
from onnxsmith.core.errors import InputError
from onnxsmith.io.load import SOURCE_PATH
from onnxsmith.runtime import runner
from onnxsmith.runtime.image_content import float_output_shapes, infer_page_inputs
from onnxsmith.runtime.image_range import infer_image_ranges
from onnxsmith.runtime.inputs import InputSpec, default_dim, input_specs, random_inputs, resolve_shape, sum_terms
from onnxsmith.runtime.mel_scale import infer_mel_scales
from onnxsmith.runtime.spectrogram import FRAMES as MEL_FRAMES

#: Image sides tried in turn, after the model's own (metadata).
IMAGE_SIDES = (224, 320, 640)
#: Then text lines, (heights, widths) in step: a recogniser whose network folds the height to one row runs at
#: none of the squares (PaddleOCR's 48 x 320 crops, CRNN's 32 x 320), and a 1 x 1 picture exercises nothing.
LINE_SIDES = ((48, 32), (320, 320))
#: Other unsized dims grow to these when the model does not run at their default.
GROWN_SIZES = (64, 512)
#: Metadata keys that hold an image size ('[320, 320]', '640', '224,224').
IMAGE_SIZE_KEYS = ("imgsz", "img_size", "image_size", "input_size")
_FAILED = "onnxruntime failed to run the model: "


@dataclass(frozen=True)
class Guess:
    """One unsized symbolic dim: where it is, and the sizes to try in order (one size: nothing to choose)."""

    name: str | None  # None: an unnamed dim, sized per input and axis
    input: str
    axis: int
    sizes: tuple[int, ...]
    spatial: str = ""  # "H" or "W" for an image's side

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"{self.input}[{self.axis}]"


def inputs_that_run(
    model: ir.Model,
    *,
    shapes: dict[str, tuple[int, ...]] | None = None,
    dims: dict[str, int] | None = None,
    samples: int = 1,
    seed: int = 0,
    given: dict[str, dict[str, str]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """``samples`` seeded input sets at sizes the model runs at (see the module doc).

    ``shapes`` / ``dims``: what the user sized (``--shape``), kept as given. A model whose only
    unsized dims are batches (or past lengths) is not run here: there is nothing to choose. ``given``: the
    user's corrections of what the inputs are (:func:`~onnxsmith.runtime.inputs.random_inputs`).
    """
    fresh, fresh_pages = INFERRED_RANGES not in model.meta, PAGE_INPUTS not in model.meta
    fresh_mels = MEL_SCALES not in model.meta
    sets, output_shapes = _sized_inputs(model, shapes, dims, samples, seed, given)
    again = fresh and sets and infer_image_ranges(model, sets[0], given)  # the pictures again, in the range measured
    # ... and with pages (the sizing run's output shapes are the same on those pictures)
    again = (fresh_pages and sets and infer_page_inputs(model, sets[0], output_shapes)) or again
    again = (fresh_mels and sets and infer_mel_scales(model, sets[0])) or again  # frames in the scale measured
    if again:
        sized = {name: tuple(array.shape) for name, array in sets[0].items()}
        sets = _seeded(model, sized, dict(dims or {}), range(samples), seed, given)
    return sets


def _sized_inputs(model: ir.Model, shapes, dims, samples: int, seed: int, given):
    """(the input sets, the float outputs' shapes on the first where the model was run to choose sizes, else
    None)."""
    shapes, dims = dict(shapes or {}), dict(dims or {})
    guesses = unsized_dims(model, shapes, dims, given)
    choices = [g for g in guesses if len(g.sizes) > 1]
    if not choices:
        return _seeded(model, shapes, dims, range(samples), seed, given), None
    label = model.meta.get(SOURCE_PATH)
    session = runner.open_session(model, label=label)
    tried: list[str] = []
    problem = ""
    for attempt in range(max(len(g.sizes) for g in choices)):
        sizes = {g: g.sizes[min(attempt, len(g.sizes) - 1)] for g in guesses}
        described = ", ".join(f"{g.label}={sizes[g]}" for g in choices)
        if described in tried:
            continue
        tried.append(described)
        sized = _shapes(model, shapes, dims, sizes)
        feeds = random_inputs(model, shapes=sized, dims=dims, seed=seed, given=given)
        try:
            output_shapes = float_output_shapes(session, feeds, label)
        except InputError as err:
            problem = err.problem.removeprefix(_FAILED)
            continue
        return [feeds] + _seeded(model, sized, dims, range(1, samples), seed, given), output_shapes
    raise InputError(
        f"onnxruntime failed to run the model at every size tried for its unsized dims ({'; '.join(tried)}): "
        f"{problem}; give the sizes it runs at with --shape, e.g. --shape {_example(model, shapes, guesses)}",
        label,
    )


def _seeded(model: ir.Model, shapes, dims, numbers: range, seed: int, given) -> list[dict[str, np.ndarray]]:
    """Input sets ``numbers`` (seeds ``seed + n``) at ``shapes``."""
    return [random_inputs(model, shapes=shapes, dims=dims, seed=seed + n, given=given) for n in numbers]


def unsized_dims(model: ir.Model, shapes: dict[str, tuple[int, ...]], dims: dict[str, int], given=None) -> list[Guess]:
    """The symbolic input dims that ``shapes`` and ``dims`` leave unsized, with the sizes to try (``given``: the
    user's corrections of the inputs' roles)."""
    image = image_size(model)
    roles = with_given(input_roles(model), given)
    measured = {r.measures: r.axis for r in roles.values() if r.kind == LENGTH and r.measures}
    found: dict[str, Guess] = {}
    for spec in input_specs(model):
        if spec.name in shapes:
            continue
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, int) or (dim is not None and dim in dims):
                continue
            utterance = roles[spec.name].kind == WAVEFORM and measured.get(spec.name) == axis
            if roles[spec.name].kind == MEL and axis == len(spec.dims) - 1:  # a vocoder's frames: about 1.2 s first
                guess = Guess(dim, spec.name, axis, (MEL_FRAMES, default_dim(dim)))
                found.setdefault(guess.label, guess)
                continue
            # a sum (optimum's attention mask: "past_sequence_length + sequence_length") is its terms' sizes added
            terms = [t for t in sum_terms(dim) if not t.isdigit() and t not in dims] if dim else [dim]
            for term in terms:
                guess = _guess(spec, axis, term, image, utterance=utterance)
                found.setdefault(guess.label, guess)  # a named dim is one size everywhere it appears
    return list(found.values())


def _guess(
    spec: InputSpec, axis: int, dim: str | None, image: tuple[int, int] | None, *, utterance: bool = False
) -> Guess:
    default = default_dim(dim)
    if utterance:  # a waveform's samples, measured by a length: one second of speech first
        return Guess(dim, spec.name, axis, (SAMPLE_RATE, default, *(s for s in GROWN_SIZES if s > default)))
    lowered = (dim or "").lower()
    if "past" in lowered or "batch" in lowered or (axis == 0 and len(spec.dims) >= 2):
        return Guess(dim, spec.name, axis, (default,))
    spatial = _spatial_axes(spec)
    if axis in spatial:
        side = spatial.index(axis)
        own = (image[side],) if image else ()
        sides = (*own, *(s for s in IMAGE_SIDES if s not in own), *LINE_SIDES[side], default)
        return Guess(dim, spec.name, axis, sides, "HW"[side])
    if dim is None and axis != len(spec.dims) - 1:
        return Guess(
            dim, spec.name, axis, (default,)
        )  # an unnamed inner dim: a state's batch, say (silero's [2, ?, 128])
    return Guess(dim, spec.name, axis, (default, *(s for s in GROWN_SIZES if s > default)))


def _spatial_axes(spec: InputSpec) -> list[int]:
    """Height and width of a 4-D float image: axes 2, 3 (NCHW), or 1, 2 when the last axis is 1-4 channels (NHWC)."""
    if len(spec.dims) != 4 or spec.dtype.kind != "f":
        return []
    last = spec.dims[3]
    if isinstance(last, int) and 1 <= last <= 4 and not isinstance(spec.dims[1], int):
        return [1, 2]
    return [2, 3]


def image_size(model: ir.Model) -> tuple[int, int] | None:
    """(height, width) from the model's metadata, when it says."""
    for key in IMAGE_SIZE_KEYS:
        sides = [int(s) for s in re.findall(r"\d+", model.metadata_props.get(key) or "")]
        if 1 <= len(sides) <= 2 and all(0 < s <= 8192 for s in sides):
            return (sides[0], sides[-1])
    return None


def _shapes(
    model: ir.Model, shapes: dict[str, tuple[int, ...]], dims: dict[str, int], sizes: dict[Guess, int]
) -> dict[str, tuple[int, ...]]:
    """Every input's whole shape at ``sizes`` (an unnamed dim is one input's axis, so shapes, not dims)."""
    named = {g.name: size for g, size in sizes.items() if g.name is not None}
    unnamed = {(g.input, g.axis): size for g, size in sizes.items() if g.name is None}
    whole = dict(shapes)
    for spec in input_specs(model):
        if spec.name not in whole:
            shape = resolve_shape(spec, {}, {**named, **dims})
            whole[spec.name] = tuple(unnamed.get((spec.name, a), d) for a, d in enumerate(shape))
    return whole


def _example(model: ir.Model, shapes: dict[str, tuple[int, ...]], guesses: list[Guess]) -> str:
    """``NAME:d0,d1,...`` for the first input with a dim to choose: fixed sizes kept, H / W / L for the others."""
    chosen = {g.label: g for g in guesses}
    for spec in input_specs(model):
        picks = [None if isinstance(d, int) else chosen.get(d or f"{spec.name}[{a}]") for a, d in enumerate(spec.dims)]
        if spec.name in shapes or not any(p is not None and len(p.sizes) > 1 for p in picks):
            continue
        parts = [
            str(d) if isinstance(d, int) else (p.spatial or "L") if p is not None and len(p.sizes) > 1 else "1"
            for d, p in zip(spec.dims, picks)
        ]
        return f"{spec.name}:{','.join(parts)}"
    return "NAME:D0,D1,..."
