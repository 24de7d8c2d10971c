"""Real content for a model's inputs: photos and a spoken sentence shipped with onnxsmith, and files a user gives.

The shipped data (src/onnxsmith/data/README.md says what each file is and its licence): two public-domain portrait
photos and a spoken English sentence (16 kHz mono). runtime/plausible.py makes an image input's values from crops
of the photos (a line of rendered text for a wide, short one: a text recogniser's), a waveform's from the sentence
at different offsets; runtime/data_folder.py reads a user's images and audio with :func:`read_image` and
:func:`read_wav`. Everything is in 0..1 (pictures, NCHW) or -1..1 (audio) here; the input's value range and
layout are plausible.py's to apply.
"""

from __future__ import annotations

import functools
import os
import wave
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont, UnidentifiedImageError

from onnxsmith.analysis.input_roles import SAMPLE_RATE
from onnxsmith.core.errors import InputError
from onnxsmith.io.paths import open_readable

DATA = Path(__file__).resolve().parent.parent / "data"
PHOTOS = ("astronaut.jpg", "grace_hopper.jpg")
SPEECH = "speech.wav"
#: An image at least this many times as wide as it is high is a text line (PP-OCR's recogniser reads 48 x 320):
#: it gets rendered words, not a squeezed portrait.
TEXT_LINE_ASPECT = 3.0
#: Words a rendered text line is made of.
_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "invoice",
    "total",
    "2024",
    "page",
    "of",
    "model",
    "variant",
    "number",
    "date",
    "street",
    "name",
    "account",
    "17.50",
    "EUR",
    "order",
    "shipped",
    "ONNX",
    "runtime",
    "verified",
    "April",
]
#: A crop of a photo takes at least this share of the largest crop of the input's aspect.
_MIN_CROP = 0.55


@functools.cache
def photos() -> tuple[np.ndarray, ...]:
    """The shipped photos, RGB float32 [H, W, 3] in 0..1 (none where they cannot be read: generated pictures
    stand in)."""
    found = []
    for name in PHOTOS:
        try:
            with Image.open(DATA / name) as image:
                found.append(np.asarray(image.convert("RGB"), np.float32) / 255)
        except (OSError, UnidentifiedImageError):
            continue
    return tuple(found)


@functools.cache
def speech() -> np.ndarray:
    """The shipped spoken sentence, float64 mono at :data:`SAMPLE_RATE` (empty where it cannot be read)."""
    try:
        return read_wav(DATA / SPEECH)
    except InputError:
        return np.zeros(0)


def photo_pictures(
    n: int, channels: int, height: int, width: int, rng: np.random.Generator, *, pages: bool = False
) -> np.ndarray | None:
    """``n`` pictures [n, channels, height, width] in 0..1: seeded crops of the shipped photos (random place,
    scale and mirroring), with ``pages`` pages of printed text with a photo on them (a text detector finds
    nothing in a portrait), or rendered text lines for a wide, short input; None where there are no photos or
    the channels are not 1-4."""
    if not 1 <= channels <= 4 or height < 1 or width < 1:
        return None
    wide = width >= TEXT_LINE_ASPECT * height
    if not wide and not photos():
        return None
    pictures = np.empty((n, channels, height, width), np.float32)
    for i in range(n):
        if wide:
            rgb = text_line(height, width, rng)
        elif pages:
            rgb = _page_with_figure(height, width, rng)
        else:
            rgb = _crop(photos()[rng.integers(len(photos()))], height, width, rng)
        pictures[i] = with_channels(rgb, channels)
    return pictures


def _page_with_figure(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A page of printed lines with a photo on it (a document with a figure), RGB [H, W, 3] in 0..1: text in
    every picture, and a photo's content too."""
    page = text_page(height, width, rng)
    fh, fw = (max(1, round(side * rng.uniform(0.3, 0.6))) for side in (height, width))
    top, left = int(rng.integers(0, height - fh + 1)), int(rng.integers(0, width - fw + 1))
    page[top : top + fh, left : left + fw] = _crop(photos()[rng.integers(len(photos()))], fh, fw, rng)
    return page


def text_page(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A page of printed lines (seeded sizes, places and words: dark ink on light paper), RGB [H, W, 3] in 0..1."""
    paper, ink = rng.uniform(0.7, 1.0, 3), rng.uniform(0.0, 0.35, 3)
    page = Image.new("RGB", (width, height), tuple(int(v * 255) for v in paper))
    draw = ImageDraw.Draw(page)
    y = int(rng.integers(2, 12))
    while y < height - 16:
        size = int(rng.integers(14, 32))
        words = " ".join(rng.choice(_WORDS, size=int(rng.integers(3, 12))).tolist())
        x = int(rng.integers(0, max(1, width // 4)))
        draw.text((x, y), words, fill=tuple(int(v * 255) for v in ink), font=ImageFont.load_default(size=size))
        y += size + int(rng.integers(6, 24))
    return np.asarray(page, np.float32) / 255


def with_channels(rgb: np.ndarray, channels: int) -> np.ndarray:
    """An RGB [H, W, 3] picture as ``channels`` planes [C, H, W]: luminance for 1, with an opaque alpha for 2 and 4."""
    gray = rgb @ np.array([0.299, 0.587, 0.114], np.float32)
    opaque = np.ones_like(gray)
    planes = {1: [gray], 2: [gray, opaque], 3: list(rgb.transpose(2, 0, 1)), 4: [*rgb.transpose(2, 0, 1), opaque]}
    return np.stack(planes[channels])


def _crop(photo: np.ndarray, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A crop of ``photo`` with the input's aspect, at a seeded place and scale, maybe mirrored, resized."""
    h, w = photo.shape[:2]
    aspect = width / height
    full_h, full_w = (h, h * aspect) if h * aspect <= w else (w / aspect, w)
    scale = rng.uniform(_MIN_CROP, 1.0)
    ch, cw = max(1, round(full_h * scale)), max(1, round(full_w * scale))
    top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    piece = photo[top : top + ch, left : left + cw]
    if rng.random() < 0.5:
        piece = piece[:, ::-1]
    return resize(piece, height, width)


def resize(picture: np.ndarray, height: int, width: int) -> np.ndarray:
    """An [H, W, C] float picture in 0..1 resized (bilinear, antialiased) to ``height`` x ``width``."""
    if picture.shape[:2] == (height, width):
        return np.ascontiguousarray(picture, np.float32)
    planes = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(picture[:, :, c], np.float32), "F").resize(
                (width, height), Image.BILINEAR
            )
        )
        for c in range(picture.shape[2])
    ]
    return np.clip(np.stack(planes, axis=-1), 0, 1).astype(np.float32)


def text_line(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A line of dark words on a light page (PIL's default font), as a text recogniser or detector reads,
    RGB [height, width, 3] in 0..1."""
    font = ImageFont.load_default()
    words = " ".join(rng.choice(_WORDS, size=12).tolist())
    left, top, _right, bottom = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox((0, 0), words, font=font)
    text_h = max(1, bottom - top)
    canvas_h = max(text_h + 4, round(text_h * rng.uniform(1.3, 1.8)))
    canvas_w = max(canvas_h, round(canvas_h * width / height))
    paper, ink = rng.uniform(0.75, 1.0, 3), rng.uniform(0.0, 0.3, 3)
    page = Image.new("RGB", (canvas_w, canvas_h), tuple(int(v * 255) for v in paper))
    x = int(rng.integers(0, max(1, canvas_h)))
    ImageDraw.Draw(page).text(
        (x - left, (canvas_h - text_h) // 2 - top), words, font=font, fill=tuple(int(v * 255) for v in ink)
    )
    return resize(np.asarray(page, np.float32) / 255, height, width)


def speech_clips(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray | None:
    """The shipped sentence along the last axis of ``shape`` (float64), each row from its own seeded offset:
    a row shorter than the sentence is a voiced stretch of it (a streaming model's 32 ms window lands on speech,
    not on a pause between words), a longer one repeats it after a short pause. None where it cannot be read."""
    sentence = speech()
    if sentence.size == 0:
        return None
    out = np.zeros(shape, np.float64)
    if not shape or 0 in shape:
        return out
    length = shape[-1]
    if length <= sentence.size:
        # offsets whose window holds at least half the sentence's mean power
        power = np.concatenate([[0.0], np.cumsum(sentence**2)])
        windows = (power[length:] - power[:-length]) / length
        voiced = np.flatnonzero(windows >= 0.5 * power[-1] / sentence.size)
        starts = voiced if voiced.size else np.arange(windows.size)
        for row in out.reshape(-1, length):
            start = int(starts[rng.integers(starts.size)])
            row[:] = sentence[start : start + length]
        return out
    loop = np.concatenate([sentence, np.zeros(SAMPLE_RATE // 5)])  # a pause between sayings
    for row in out.reshape(-1, length):
        start = int(rng.integers(0, loop.size))
        row[:] = np.tile(loop, -(-(start + length) // loop.size))[start : start + length]
    return out


def read_image(path: str | os.PathLike) -> np.ndarray:
    """An image file as RGB float32 [H, W, 3] in 0..1; a file that is not one is refused in one line."""
    path = Path(path)
    try:
        with open_readable(path, "image") as f, Image.open(f) as image:
            image.load()
            return np.asarray(image.convert("RGB"), np.float32) / 255
    except InputError:
        raise
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise InputError(f"not a readable image ({err})", path) from None


def read_wav(path: str | os.PathLike, rate: int = SAMPLE_RATE) -> np.ndarray:
    """A PCM .wav file as float64 mono in -1..1 at ``rate`` (channels averaged, resampled by FFT)."""
    path = Path(path)
    try:
        with open_readable(path, "audio file") as f, wave.open(f) as w:
            width, channels, source_rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except InputError:
        raise
    except (OSError, EOFError, wave.Error) as err:
        raise InputError(f"not a readable PCM .wav file ({err})", path) from None
    if width == 1:
        samples = (np.frombuffer(raw, np.uint8).astype(np.float64) - 128) / 128
    elif width in (2, 4):
        samples = np.frombuffer(raw, f"<i{width}").astype(np.float64) / 2 ** (8 * width - 1)
    elif width == 3:
        bytes3 = np.frombuffer(raw[: len(raw) // 3 * 3], np.uint8).reshape(-1, 3).astype(np.int32)
        value = bytes3[:, 0] | (bytes3[:, 1] << 8) | (bytes3[:, 2] << 16)
        samples = np.where(value >= 2**23, value - 2**24, value).astype(np.float64) / 2**23
    else:
        raise InputError(f"has {8 * width}-bit samples; onnxsmith reads 8-, 16-, 24- and 32-bit PCM", path)
    samples = samples[: samples.size // channels * channels].reshape(-1, channels).mean(axis=1)
    if samples.size == 0:
        raise InputError("holds no audio samples", path)
    return resample(samples, source_rate, rate)


def resample(samples: np.ndarray, source_rate: int, rate: int) -> np.ndarray:
    """``samples`` at ``source_rate`` resampled to ``rate`` (by FFT: band-limited, as exact as it gets for a clip)."""
    if source_rate == rate or samples.size < 2:
        return samples
    count = max(1, round(samples.size * rate / source_rate))
    spectrum = np.fft.rfft(samples)
    kept = np.zeros(count // 2 + 1, complex)
    n = min(kept.size, spectrum.size)
    kept[:n] = spectrum[:n]
    return np.clip(np.fft.irfft(kept, count) * count / samples.size, -1, 1)
