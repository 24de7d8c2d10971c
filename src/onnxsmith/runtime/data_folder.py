"""Input sets from a user's data: an .npz of arrays, a folder of them, or a folder of images, audio or text.

Files of a kind go to the input that is that kind (analysis/input_roles.py, corrected by ``--input-role``):
images (.png, .jpg, .jpeg, .bmp) to the image input, resized to cover its size and cropped at the centre, in its
layout and value range; audio (.wav, PCM) to the waveform input at 16 kHz mono, as long as the shortest file where
its length is free (cut or padded with silence where it is fixed); text (.txt) to the token ids, through the
tokenizer.json beside the model. One file is one input set; the model's other inputs get plausible values
(runtime/plausible.py: lengths as long as the file's content, masks of ones). Sizes the file does not decide are
those the model runs at (runtime/sizing.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.input_roles import (
    IMAGE,
    SAMPLE_RATE,
    TOKEN_IDS,
    WAVEFORM,
    InputRole,
    input_roles,
    with_given,
)
from onnxsmith.core.errors import InputError
from onnxsmith.io.load import SOURCE_PATH
from onnxsmith.io.paths import read_text
from onnxsmith.runtime.inputs import input_specs, load_npz, random_inputs, symbolic_dim_size, unlike_first
from onnxsmith.runtime.plausible import in_range
from onnxsmith.runtime.real_data import read_image, read_wav, resize, with_channels
from onnxsmith.runtime.sizing import inputs_that_run

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
AUDIO_SUFFIXES = (".wav",)
TEXT_SUFFIXES = (".txt",)
#: What each kind of file is fed to, and how a report names the files.
_KINDS = {IMAGE: (IMAGE_SUFFIXES, "image"), WAVEFORM: (AUDIO_SUFFIXES, "audio"), TOKEN_IDS: (TEXT_SUFFIXES, "text")}
#: A free audio length is the shortest file's, at most this many seconds (a long recording would only be slow).
MAX_SECONDS = 30
#: A free token sequence is the shortest text's, at most this many tokens.
MAX_TOKENS = 512
USABLE = "no .npz arrays, images (.png, .jpg), audio (.wav) or text (.txt)"


def data_files(path: str | os.PathLike) -> tuple[str, list[Path]]:
    """(kind, files) of a data path: ``"npz"`` for an .npz or a folder of them, else the role its files feed
    (:data:`IMAGE`, :data:`WAVEFORM`, :data:`TOKEN_IDS`); a folder with nothing usable, or two kinds, is refused."""
    path = Path(path)
    if not path.is_dir():
        suffix = path.suffix.lower()
        kind = next((k for k, (suffixes, _) in _KINDS.items() if suffix in suffixes), "npz")
        return kind, [path]
    files = sorted(f for f in path.iterdir() if not f.name.startswith(".") and f.is_file())
    npz = [f for f in files if f.suffix.lower() == ".npz"]
    if npz:
        return "npz", npz
    found = {k: [f for f in files if f.suffix.lower() in suffixes] for k, (suffixes, _) in _KINDS.items()}
    found = {k: fs for k, fs in found.items() if fs}
    if not found:
        raise InputError(f"the folder holds {USABLE}", path)
    if len(found) > 1:
        kinds = " and ".join(f"{_KINDS[k][1]} files" for k in found)
        raise InputError(f"the folder holds {kinds}; give one kind of data per folder", path)
    ((kind, chosen),) = found.items()
    return kind, chosen


def load_data(
    path: str | os.PathLike,
    model: ir.Model,
    *,
    shapes: dict[str, tuple[int, ...]] | None = None,
    dims: dict[str, int] | None = None,
    seed: int = 0,
    given: dict[str, dict[str, str]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Input sets from ``path`` (see the module doc): one per .npz, image, audio or text file."""
    path = Path(path)
    kind, files = data_files(path)
    if kind == "npz":
        sets = [load_npz(f, model) for f in files]
        unlike = unlike_first(sets, first=files[0].name)
        if unlike is not None:
            raise InputError(unlike[1], files[unlike[0]])
        return sets
    roles = with_given(input_roles(model), given)
    target = _target(kind, roles, path)
    shapes, dims = dict(shapes or {}), dict(dims or {})
    spec = next(s for s in input_specs(model) if s.name == target.name)
    if kind == TOKEN_IDS:
        contents = _token_ids(files, model, path)
    elif kind == WAVEFORM:
        contents = [read_wav(f) for f in files]
    else:
        contents = [read_image(f) for f in files]
    if kind != IMAGE and target.name not in shapes and spec.dims and not isinstance(spec.dims[-1], int):
        # a free length: the shortest file's, every set the same shape (the gate stacks the outputs)
        cap = MAX_TOKENS if kind == TOKEN_IDS else MAX_SECONDS * SAMPLE_RATE
        length = max(1, min(min(c.size for c in contents), cap))
        if spec.dims[-1] and spec.dims[-1] not in dims:
            dims[spec.dims[-1]] = length  # every input sharing the dim (a mask over the tokens) follows
        elif not spec.dims[-1]:
            leading = [d if isinstance(d, int) else symbolic_dim_size(d, dims) for d in spec.dims[:-1]]
            shapes[target.name] = (*leading, length)
    sized = _sizes(inputs_that_run(model, shapes=shapes, dims=dims, seed=seed, given=given))
    target = with_given(input_roles(model), given)[target.name]  # its range as the model's first Conv said it
    sets = []
    for i, (f, content) in enumerate(zip(files, contents)):
        feeds = random_inputs(model, shapes=sized, dims=dims, seed=seed + i, given=given)
        shape = sized[target.name]
        if kind == IMAGE:
            feeds[target.name] = _picture(content, target, shape, spec.dtype)
        else:
            feeds[target.name] = _along_last(content, shape).astype(spec.dtype)
        if not all(np.isfinite(v).all() for v in feeds.values() if v.dtype.kind == "f"):
            raise InputError("holds values that are not finite", f)
        sets.append(feeds)
    return sets


def _sizes(feeds: list[dict[str, np.ndarray]]) -> dict[str, tuple[int, ...]]:
    return {name: value.shape for name, value in feeds[0].items()}


def describe_data(
    path: str | os.PathLike, model: ir.Model, given: dict[str, dict[str, str]] | None = None
) -> tuple[str, ...]:
    """What each input was taken to be, for a report: the one the files of ``path`` feed (``'x': 3 image
    file(s) as image NCHW, ...``) and the others' plausible values; nothing for arrays (they are the inputs)."""
    kind, files = data_files(path)
    if kind == "npz":
        return ()
    roles = with_given(input_roles(model), given)
    target = _target(kind, roles, Path(path))
    how = {
        IMAGE: f"as image {target.layout}, {target.channels or '?'} channel(s), values {target.value_range}",
        WAVEFORM: f"at {SAMPLE_RATE} Hz mono",
        TOKEN_IDS: "through the tokenizer.json beside the model",
    }[kind]
    why = f" ({target.why})" if target.why else ""
    line = f"'{target.name}': {len(files)} {_KINDS[kind][1]} file(s) {how}{why}"
    return (line, *(r.describe() for r in roles.values() if r.name != target.name))


def _target(kind: str, roles: dict[str, InputRole], path: Path) -> InputRole:
    """The one input files of ``kind`` feed; refused in one line where the model has none, or several."""
    targets = [r for r in roles.values() if r.kind == kind]
    noun = {IMAGE: "image", WAVEFORM: "waveform", TOKEN_IDS: "token ids"}[kind]
    if len(targets) != 1:
        taken = "; ".join(r.describe() for r in roles.values()) or "none"
        has = f"no {noun} input" if not targets else f"{len(targets)} {noun} inputs"
        raise InputError(
            f"holds {_KINDS[kind][1]} files but the model has {has} (its inputs: {taken}); "
            f"say which input it is with --input-role NAME={_word(kind)}",
            path,
        )
    return targets[0]


def _word(kind: str) -> str:
    return {IMAGE: "image", WAVEFORM: "waveform"}.get(kind, "generic")


def _picture(rgb: np.ndarray, role: InputRole, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An image file's pixels as the input takes them: covering its size (aspect kept, cropped at the centre),
    in its channels, range and layout, repeated over the batch."""
    layout = role.layout or "NCHW"
    n, c, h, w = (shape[0], shape[3], shape[1], shape[2]) if layout == "NHWC" else shape
    if not 1 <= c <= 4:
        raise InputError(
            f"input '{role.name}' of shape {list(shape)} has {c} channels in {layout}; give its layout with --input-role"
        )
    src_h, src_w = rgb.shape[:2]
    scale = max(h / src_h, w / src_w)
    covered = resize(rgb, max(h, round(src_h * scale)), max(w, round(src_w * scale)))
    top, left = (covered.shape[0] - h) // 2, (covered.shape[1] - w) // 2
    picture = with_channels(covered[top : top + h, left : left + w], c)
    return in_range(np.repeat(picture[None], n, axis=0), layout, role.value_range or "normalized", dtype)


def _along_last(content: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A 1-D content along the last axis of ``shape``: cut at the end or padded with zeros, in every row."""
    row = np.zeros(shape[-1] if shape else 1, content.dtype)
    row[: min(row.size, content.size)] = content[: row.size]
    return np.broadcast_to(row, shape).copy() if shape else row[0]


def _token_ids(files: list[Path], model: ir.Model, path: Path) -> list[np.ndarray]:
    """Each text file through the tokenizer.json beside the model (none there: refused in one line)."""
    source = model.meta.get(SOURCE_PATH)
    beside = Path(source).parent / "tokenizer.json" if source else None
    if beside is None or not beside.is_file():
        raise InputError("holds text, and there is no tokenizer.json beside the model to make token ids of it", path)
    from tokenizers import Tokenizer  # only a text folder needs it

    try:
        tokenizer = Tokenizer.from_str(read_text(beside, "tokenizer"))
    except InputError:
        raise
    except Exception as err:
        raise InputError(f"not a tokenizer the tokenizers library reads ({err})", beside) from None
    ids = []
    for f in files:
        encoded = np.array(tokenizer.encode(read_text(f)).ids, np.int64)
        if encoded.size == 0:
            raise InputError("holds no text to make token ids of", f)
        ids.append(encoded)
    return ids
