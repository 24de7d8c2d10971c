"""Log-mel spectrograms of the shipped sentence: what a vocoder (HiFi-GAN and its kin) is fed.

Most vocoders were trained on HiFi-GAN's features: a 1024-point STFT's magnitude (not its power) through a
Slaney mel filterbank up to 8 kHz, at 22050 Hz with a hop of 256, and the natural log of that, clamped at 1e-5.
Others take the log10 of it (ParallelWaveGAN's) or the log of the power (:data:`SCALES`): 2.3 and 2 times off in
scale. Which one a model reads is measured by runtime/mel_scale.py.
"""

from __future__ import annotations

import functools

import numpy as np

from onnxsmith.runtime.real_data import SAMPLE_RATE, resample, speech_clips

#: The log scales tried, HiFi-GAN's first: the natural log of magnitudes, their log10, the log of powers.
SCALES = ("ln", "log10", "ln power")
#: HiFi-GAN's features: sample rate, hop, frames per second follow; the STFT is 4 hops long.
RATE, HOP, FMAX = 22050, 256, 8000.0
#: A vocoder's frames where nobody sized them: about 1.2 s of speech.
FRAMES = 100
#: The floor of the magnitudes before the log (HiFi-GAN's clamp).
_FLOOR = 1e-5


def log_mel(samples: np.ndarray, bands: int, scale: str = "ln", rate: int = RATE, hop: int = HOP) -> np.ndarray:
    """[bands, frames] of ``samples`` (one row of audio at ``rate``), a frame every ``hop`` samples, in ``scale``."""
    n_fft = 4 * hop
    pad = (n_fft - hop) // 2
    padded = np.pad(samples, (pad, pad), mode="reflect" if samples.size > pad else "constant")
    if padded.size < n_fft:
        padded = np.pad(padded, (0, n_fft - padded.size))
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop]
    magnitude = np.sqrt(np.abs(np.fft.rfft(frames * np.hanning(n_fft + 1)[:-1], axis=1)) ** 2 + 1e-9)
    mel = np.maximum(_filterbank(rate, n_fft, bands, min(FMAX, rate / 2)) @ magnitude.T, _FLOOR)
    return rescaled(np.log(mel), scale)


def rescaled(ln_frames: np.ndarray, scale: str) -> np.ndarray:
    """Frames in ``ln`` (the natural log of magnitudes) in another of :data:`SCALES`."""
    if scale == "log10":
        return ln_frames / np.log(10)
    if scale == "ln power":
        return 2 * ln_frames
    return ln_frames


@functools.cache
def _filterbank(rate: float, n_fft: int, bands: int, fmax: float) -> np.ndarray:
    """Slaney's mel filterbank [bands, n_fft // 2 + 1]: triangles equal in area (librosa's default)."""
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(fmax), bands + 2))
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising, falling = (freqs - low) / (centre - low), (high - freqs) / (high - centre)
    return np.maximum(0, np.minimum(rising, falling)) * (2.0 / (high - low))


def _hz_to_mel(hz):
    hz = np.asarray(hz, np.float64)
    return np.where(hz >= 1000, 15 + np.log(np.maximum(hz, 1e-9) / 1000) / (np.log(6.4) / 27), hz / (200 / 3))


def _mel_to_hz(mel):
    mel = np.asarray(mel, np.float64)
    return np.where(mel >= 15, 1000 * np.exp((np.log(6.4) / 27) * (mel - 15)), mel * (200 / 3))


def mel_frames(shape: tuple[int, ...], rng: np.random.Generator, scale: str = "ln", hop: int = HOP) -> np.ndarray:
    """[B, bands, frames] log-mel frames of seeded stretches of the shipped sentence (zeros' floor where it cannot
    be read), at the rate whose frames per second HiFi-GAN's are for ``hop``."""
    batch, bands, frames = shape
    rate = round(RATE * hop / HOP)
    samples = -(-frames * hop * SAMPLE_RATE // rate) + 1  # at the sentence's rate, enough for the frames
    clips = speech_clips((batch, samples), rng)
    out = np.empty(shape, np.float64)
    for row, clip in zip(out, clips if clips is not None else np.zeros((batch, samples))):
        audio = resample(clip, SAMPLE_RATE, rate)[: frames * hop]
        row[:] = log_mel(audio, bands, scale, rate, hop)[:, :frames]
    return out
