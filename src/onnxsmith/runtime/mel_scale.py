"""Which log scale a vocoder's mel input is in: the one whose frames come back from the model's audio.

The shipped sentence's frames in each scale of runtime/spectrogram.SCALES go through the model; where it gives
audio as long as its frames say (``hop`` samples a frame), the audio's own frames (HiFi-GAN's features, at the
rate that hop implies) are compared with the frames it was made from. The scale that comes back close, while
every other comes back at least twice as far off, is evidence (HiFi-GAN: 0.54 mean |log| off, against 2.6 and
more in the others): the input's values are then known, and int8 calibrates its Convs on them. Otherwise (no
such output: an ASR encoder reading mel features) the scale stays a guess. The result is kept on the model in
memory (``model.meta``), as image ranges are (runtime/image_range.py).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.input_roles import MEL, MEL_SCALES, input_roles
from onnxsmith.core.errors import InputError
from onnxsmith.runtime import runner
from onnxsmith.runtime.spectrogram import HOP, RATE, SCALES, log_mel, mel_frames, rescaled

#: The best scale is evidence where every other comes back at least this many times further off ...
_DECISIVE = 2.0
#: ... and it comes back within this mean |log| difference (a model that reproduces nothing tells nothing).
_CLOSE = 1.5
#: Fewer samples a frame than this is no vocoder's hop.
_MIN_HOP = 64


def infer_mel_scales(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, tuple[str, str, bool]]:
    """Each mel input whose scale a round trip through the model tells (see the module doc), with (scale, why,
    evidence); ``feeds``: an input set the model runs on. Kept in ``model.meta``: measured once per model."""
    if MEL_SCALES in model.meta:
        return model.meta[MEL_SCALES]
    model.meta[MEL_SCALES] = {}
    mels = [r for r in input_roles(model).values() if r.kind == MEL and r.name in feeds and feeds[r.name].ndim == 3]
    if not mels:
        return {}
    try:
        session = runner.open_session(model, label="the model")
    except InputError:
        return {}
    found = {}
    for role in mels:
        decided = _round_trip(session, feeds, role.name)
        if decided is not None:
            found[role.name] = decided
    model.meta[MEL_SCALES] = found
    return found


def _round_trip(session, feeds: dict[str, np.ndarray], name: str) -> tuple[str, str, bool] | None:
    template = feeds[name]
    frames = template.shape[2]
    misses = {}
    reference = mel_frames(template.shape, np.random.default_rng(0), "ln")  # the same sentence in every scale
    for scale in SCALES:
        mel = rescaled(reference, scale)
        try:
            outputs = runner.run(session, {**feeds, name: mel.astype(template.dtype)}, label=name)
        except InputError:
            return None
        audio = [np.asarray(v, np.float64) for v in outputs.values() if np.asarray(v).dtype.kind == "f"]
        audio = [a.reshape(a.shape[0], -1) for a in audio if a.ndim >= 2 and a.shape[0] == template.shape[0]]
        audio = [a for a in audio if a.shape[1] % frames == 0 and a.shape[1] // frames >= _MIN_HOP]
        if not audio:
            return None  # no output as long as the frames say: not a vocoder
        hop = audio[0].shape[1] // frames
        rate = round(RATE * hop / HOP)
        back = np.stack([log_mel(row, template.shape[1], "ln", rate, hop)[:, :frames] for row in audio[0]])
        misses[scale] = float(np.mean(np.abs(back - reference[:, :, : back.shape[2]])))
    best = min(misses, key=misses.__getitem__)
    others = min(v for s, v in misses.items() if s != best)
    measured = ", ".join(f"{s} {v:.2f}" for s, v in misses.items())
    if misses[best] <= _CLOSE and others >= _DECISIVE * misses[best]:
        return best, f"its audio gives back the frames it was made from in {best} (mean |log| off: {measured})", True
    return None
