"""Plausible values for a model's inputs from what each is (:mod:`onnxsmith.analysis.input_roles`), seeded.

Real content where onnxsmith ships it (runtime/real_data.py): an image is seeded crops of real photos (a rendered
line of text for a wide, short input) in the range and layout the model reads, a waveform the spoken sentence from
seeded offsets at speech level; generated signals where that data cannot be read (a smooth image with edges and
texture, a voiced-like waveform: harmonic tones with a syllable envelope, plus noise). Lengths equal to the full
length of what they measure (never 0: a zero length masks everything and proves nothing), masks of ones,
timesteps in a diffusion model's range, states at zero (the state a stream starts with), KV caches as long as
the past length given (empty at 0).
"""

from __future__ import annotations

import numpy as np

from onnxsmith.analysis.input_roles import (
    CONDITION,
    IMAGE,
    KV_CACHE,
    LATENT,
    LENGTH,
    MASK,
    MEL,
    POSITIONS,
    SAMPLE_RATE,
    SCALAR,
    STATE,
    TIMESTEP,
    TOKEN_IDS,
    WAVEFORM,
    InputRole,
)
from onnxsmith.runtime.real_data import photo_pictures, speech_clips
from onnxsmith.runtime.spectrogram import mel_frames

#: The mean and std torchvision normalizes 3-channel images with (what "normalized" input most often means).
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
#: Speech's level: an RMS of about -26 dBFS, noise 25 dB below it.
SPEECH_RMS = 0.05
NOISE_RMS = 0.003
#: A length nothing else sizes (no input it measures): a short sequence, as default_dim's 8.
DEFAULT_LENGTH = 8
#: k-diffusion's sigma range (Stable Diffusion's schedule runs from about 0.03 to 14.6).
SIGMA_RANGE = (0.03, 14.6)
DIFFUSION_STEPS = 1000
#: How much of the picture a timestep keeps: Stable Diffusion's schedule (scaled linear betas), ᾱ_t.
SIGNAL_KEPT = np.cumprod(1 - np.linspace(0.00085**0.5, 0.012**0.5, DIFFUSION_STEPS) ** 2)


def role_value(
    role: InputRole,
    dtype: np.dtype,
    shape: tuple[int, ...],
    shapes: dict[str, tuple[int, ...]],
    rng: np.random.Generator,
    *,
    past: int = 0,
) -> np.ndarray | None:
    """A plausible value of ``role`` at ``shape`` (``shapes``: every input's, for what a length measures;
    ``past``: the KV cache's past length, where positions start); None for a generic input (random values
    fitting its type, as before)."""
    kind = role.kind
    if kind == SCALAR and role.value is not None:
        return np.full(shape, role.value, dtype=dtype)  # a voice model's branch for 16 kHz, not for 7 Hz
    if kind == MASK:
        return np.ones(shape, dtype=dtype)  # lengths are full: nothing to pad
    if kind == LENGTH:
        measured = shapes.get(role.measures or "")
        full = measured[role.axis] if measured is not None and role.axis is not None else DEFAULT_LENGTH
        return np.full(shape, max(1, full), dtype=dtype)
    if kind == TOKEN_IDS:
        return rng.integers(0, role.vocab or 10, size=shape).astype(dtype)  # uniform over the vocabulary
    if kind == POSITIONS and shape:
        return np.broadcast_to(np.arange(past, past + shape[-1], dtype=dtype), shape).copy()
    if kind == STATE:
        return np.zeros(shape, dtype=dtype)
    if kind == KV_CACHE:
        return rng.standard_normal(shape).astype(dtype)  # empty at past length 0
    if kind == TIMESTEP:
        return _timestep(role, dtype, shape, rng)
    if kind == LATENT:  # the clean picture: noised_latents adds the noise of its timestep's level
        return image(shape, "NCHW", "0..1", np.float32, rng) * 2 - 1
    if kind == CONDITION:
        return rng.uniform(0, 255 if role.value_range == "0..255" else 1, size=shape).astype(dtype)
    if kind == IMAGE:
        return image(shape, role.layout or "NCHW", role.value_range or "normalized", dtype, rng, pages=bool(role.pages))
    if kind == WAVEFORM:
        return waveform(shape, rng).astype(dtype)
    if kind == MEL and len(shape) == 3:
        return mel_frames(shape, rng, role.value_range or "ln").astype(dtype)
    return None


def noised_latents(
    roles: dict[str, InputRole], feeds: dict[str, np.ndarray], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """``feeds`` with each diffusion latent (its clean picture, :func:`role_value`) noised as its timestep says: a
    sigma adds that much noise (k-diffusion, EDM), a timestep t keeps √ᾱ_t of the picture under √(1 - ᾱ_t) of
    noise (DDPM, Stable Diffusion's schedule). The model then sees what it denoises at that level, not a picture
    at every level."""
    step = next((r for r in roles.values() if r.kind == TIMESTEP and r.name in feeds), None)
    if step is None:
        return feeds
    noised = dict(feeds)
    for role in roles.values():
        if role.kind != LATENT or role.name not in feeds:
            continue
        clean = feeds[role.name].astype(np.float64)
        level = np.asarray(feeds[step.name], dtype=np.float64).reshape(-1)
        level = level.reshape(-1, 1, 1, 1) if level.size == clean.shape[0] else np.full((1, 1, 1, 1), level.mean())
        noise = rng.standard_normal(clean.shape)
        if _sigma(step, feeds[step.name].dtype):
            latent = clean + level * noise
        else:
            kept = SIGNAL_KEPT[np.clip(np.rint(level).astype(int), 0, DIFFUSION_STEPS - 1)]
            latent = np.sqrt(kept) * clean + np.sqrt(1 - kept) * noise
        noised[role.name] = latent.astype(feeds[role.name].dtype)
    return noised


def past_length(roles: dict[str, InputRole], shapes: dict[str, tuple[int, ...]]) -> int:
    """The past length of a model with a KV cache: its past axis's size (0 without one)."""
    for other in roles.values():
        if other.kind == KV_CACHE and other.axis is not None and other.name in shapes:
            return int(shapes[other.name][other.axis])
    return 0


def _sigma(role: InputRole, dtype) -> bool:
    """Whether a timestep input is k-diffusion's noise level (a float named sigma), not a step 0..999."""
    return np.dtype(dtype).kind == "f" and "sigma" in role.name.lower()


def _timestep(role: InputRole, dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if _sigma(role, dtype):
        low, high = np.log(SIGMA_RANGE[0]), np.log(SIGMA_RANGE[1])
        return np.exp(rng.uniform(low, high, size=shape)).astype(dtype)
    return rng.integers(0, DIFFUSION_STEPS, size=shape).astype(dtype)  # diffusers feeds whole steps as floats too


def image(
    shape: tuple[int, ...], layout: str, value_range: str, dtype: np.dtype, rng: np.random.Generator, pages=False
):
    """Pictures at ``shape`` in ``value_range`` (0..255, 0..1, or ImageNet-normalized) and ``layout``: crops of
    the shipped photos (:func:`~onnxsmith.runtime.real_data.photo_pictures`; with ``pages``, pages of
    printed text with a photo on each), else generated ones."""
    n, c, h, w = (shape[0], shape[3], shape[1], shape[2]) if layout == "NHWC" else shape
    pictures = photo_pictures(n, c, h, w, rng, pages=pages)
    if pictures is None:
        pictures = generated_pictures((n, c, h, w), rng)
    return in_range(pictures, layout, value_range, dtype)


def generated_pictures(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Smooth pictures [N, C, H, W] in 0..1: a colour gradient with a few low-frequency waves, some flat shapes
    (edges) and a fine texture."""
    n, c, h, w = shape
    yy, xx = np.meshgrid(np.linspace(0, 1, h, dtype=np.float32), np.linspace(0, 1, w, dtype=np.float32), indexing="ij")
    pictures = np.empty((n, c, h, w), np.float32)
    for i in range(n):
        picture = rng.uniform(0.25, 0.75, (c, 1, 1)).astype(np.float32)
        picture = picture + rng.uniform(-0.25, 0.25, (c, 1, 1)) * xx + rng.uniform(-0.25, 0.25, (c, 1, 1)) * yy
        for _ in range(3):
            fx, fy = rng.uniform(0.5, 4, 2)
            phase = rng.uniform(0, 2 * np.pi)
            picture = picture + rng.uniform(0.03, 0.1, (c, 1, 1)) * np.sin(2 * np.pi * (fx * xx + fy * yy) + phase)
        for _ in range(4):  # flat shapes: rectangles and discs with sharp edges
            cx, cy, rx, ry = rng.uniform(0, 1, 2).tolist() + rng.uniform(0.05, 0.3, 2).tolist()
            inside = (
                (np.abs(xx - cx) < rx) & (np.abs(yy - cy) < ry)
                if rng.random() < 0.5
                else ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 < 1
            )
            picture = np.where(inside, rng.uniform(0.05, 0.95, (c, 1, 1)), picture)
        picture = picture + rng.normal(0, 0.02, (c, h, w))  # texture
        pictures[i] = np.clip(picture, 0, 1)
    return pictures


def in_range(pictures: np.ndarray, layout: str, value_range: str, dtype: np.dtype) -> np.ndarray:
    """Pictures [N, C, H, W] in 0..1 in the range and layout an image input reads: 0..255 (whole numbers for an
    integer input), 0..1, or normalized (ImageNet's mean and std for 3 channels)."""
    c = pictures.shape[1]
    if value_range == "0..255":
        pictures = pictures * 255
        if np.dtype(dtype).kind in "iu":
            pictures = np.rint(pictures)
    elif value_range == "normalized":
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if c == 3 else (np.float32(0.5), np.float32(0.25))
        pictures = (pictures - np.reshape(mean, (-1, 1, 1))) / np.reshape(std, (-1, 1, 1))
    if layout == "NHWC":
        pictures = pictures.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(pictures).astype(dtype)


def waveform(shape: tuple[int, ...], rng: np.random.Generator, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Speech along the last axis: the shipped sentence (:func:`~onnxsmith.runtime.real_data.speech_clips`) at
    speech level (RMS :data:`SPEECH_RMS` over each row), plus white noise; else :func:`generated_speech`."""
    clips = speech_clips(shape, rng) if rate == SAMPLE_RATE else None
    if clips is None:
        return generated_speech(shape, rng, rate)
    if clips.size == 0:
        return clips
    for row in clips.reshape(-1, shape[-1]):
        rms = np.sqrt(np.mean(row**2))
        if rms > 0:
            row *= SPEECH_RMS * rng.uniform(0.7, 1.3) / rms
        row[:] = np.clip(row + rng.normal(0, NOISE_RMS, row.shape), -1, 1)
    return clips


def generated_speech(shape: tuple[int, ...], rng: np.random.Generator, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Speech-like audio along the last axis: a voiced tone (a 100-220 Hz fundamental with vibrato and
    harmonics falling off as 1/k up to 4 kHz) under a syllable envelope (about 4 a second, with pauses),
    at speech level (RMS :data:`SPEECH_RMS`), plus white noise; every row a different voice."""
    out = np.zeros(shape, np.float64)
    if not shape or 0 in shape:
        return out
    rows = out.reshape(-1, shape[-1])
    t = np.arange(shape[-1]) / rate
    for row in rows:
        f0 = rng.uniform(100, 220) * (1 + 0.03 * np.sin(2 * np.pi * rng.uniform(4, 6) * t))
        phase = 2 * np.pi * np.cumsum(f0) / rate
        voiced = np.zeros_like(t)
        for k in range(1, int(4000 // f0.max()) + 1):
            voiced += rng.uniform(0.5, 1.0) / k * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
        syllables = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 2 * np.pi)), 0, None)
        voiced *= syllables
        rms = np.sqrt(np.mean(voiced**2))
        if rms > 0:
            voiced *= SPEECH_RMS / rms
        row[:] = np.clip(voiced + rng.normal(0, NOISE_RMS, t.shape), -1, 1)
    return out
