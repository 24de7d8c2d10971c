"""A vocoder's mel input: found by its name and its first Conv, fed frames of speech, its log scale measured by the
round trip through the model (runtime/spectrogram.py, runtime/mel_scale.py)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.input_roles import MEL, input_roles, parse_role_options, plausible, with_given
from onnxsmith.io.load import load_model
from onnxsmith.runtime.sizing import inputs_that_run
from onnxsmith.runtime.spectrogram import FRAMES, HOP, RATE, log_mel
from tests.support.realmodels import real_model


def test_a_tone_lands_in_its_band_and_each_scale_is_the_same_frames():
    t = np.arange(RATE) / RATE
    frames = log_mel(0.5 * np.sin(2 * np.pi * 1000 * t), 80)
    assert frames.shape == (80, RATE // HOP)  # a frame every hop (HiFi-GAN pads by (n_fft - hop) / 2 each side)
    loudest = int(np.argmax(frames[:, 20:-20].mean(axis=1)))
    low, high = (int(np.argmax(log_mel(0.5 * np.sin(2 * np.pi * f * t), 80)[:, 40])) for f in (300, 3000))
    assert low < loudest < high  # 1 kHz between 300 Hz and 3 kHz on the mel axis
    assert np.allclose(log_mel(t, 80, "log10"), log_mel(t, 80) / np.log(10))
    assert np.allclose(log_mel(t, 80, "ln power"), 2 * log_mel(t, 80))


def _conv_reader(save_proto, name: str, bands: int = 80):
    """``name`` [1, bands, T] -> a 1-D Conv over its bands -> y: a vocoder's first layer and nothing after it."""
    weight = np.random.default_rng(0).normal(0, 0.05, (16, bands, 7)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", [name, "w"], ["y"], pads=[3, 3])],
        "mel_reader",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, bands, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")],
    )
    return load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "m.onnx"))


def test_a_mel_input_gets_frames_of_speech_and_its_scale_stays_a_guess_without_audio(save_proto):
    model = _conv_reader(save_proto, "mel_spec")
    role = input_roles(model)["mel_spec"]
    assert (role.kind, role.channels, role.value_range, role.range_guessed) == (MEL, 80, "ln", True)
    (feeds,) = inputs_that_run(model)
    frames = feeds["mel_spec"]
    assert frames.shape == (1, 80, FRAMES)  # about 1.2 s, not the 1 frame an unnamed length gets
    assert frames.min() > -11.6 and frames.max() < 3 and frames.std() > 1  # HiFi-GAN's ln magnitudes of speech
    # no output as long as the frames say: not a vocoder, so nothing tells the scale and int8 takes no scales
    assert input_roles(model)["mel_spec"].range_guessed and not plausible(model)
    # 20 cepstra (LPCNet) or an input named otherwise is not a mel spectrogram
    assert input_roles(_conv_reader(save_proto, "mel", bands=20))["mel"].kind != MEL
    assert input_roles(_conv_reader(save_proto, "hidden"))["hidden"].kind != MEL


def test_a_user_says_an_input_is_a_mel_spectrogram_and_its_scale(save_proto):
    """``--input-role feats=mel,log10``: an input no rule took for one gets frames of speech (100 of them) in the
    scale given, a scale the user states is known (int8 may take activation scales from it)."""
    model = _conv_reader(save_proto, "feats")
    assert input_roles(model)["feats"].kind != MEL and not plausible(model)
    given = parse_role_options("feats=mel,log10")
    role = with_given(input_roles(model), given)["feats"]
    assert (role.kind, role.value_range, role.range_guessed) == (MEL, "log10", False)
    assert plausible(model, given) and "given with --input-role" in role.describe()
    (feeds,) = inputs_that_run(model, given=given)
    assert feeds["feats"].shape == (1, 80, FRAMES)
    (ln,) = inputs_that_run(model, given=parse_role_options("feats=mel"))  # the kind alone: ln, a guess
    assert np.allclose(feeds["feats"] * np.log(10), ln["feats"], atol=1e-4)
    assert with_given(input_roles(model), parse_role_options("feats=ln-power"))["feats"].value_range == "ln power"
    assert with_given(input_roles(model), parse_role_options("feats=mel"))["feats"].range_guessed


def test_hifigan_s_audio_gives_back_its_frames_in_the_natural_log_of_magnitudes():
    """lectura's HiFi-GAN: frames in ln come back 0.5 off (mean |log|), log10 and ln power 2.6 and 3.7: the scale
    is evidence, and made-up frames are what the vocoder reads (int8 may take activation scales from them)."""
    model = load_model(real_model("hifigan"))
    (feeds,) = inputs_that_run(model)
    role = input_roles(model)["mel"]
    assert role.kind == MEL and role.value_range == "ln" and not role.range_guessed
    misses = dict(
        (scale, float(value))
        for scale, value in (item.rsplit(" ", 1) for item in role.why.split("(mean |log| off: ")[1][:-1].split(", "))
    )
    assert misses["ln"] < 1.0 and min(misses["log10"], misses["ln power"]) > 2 * misses["ln"]
    assert feeds["mel"].shape == (1, 80, FRAMES) and plausible(model)
