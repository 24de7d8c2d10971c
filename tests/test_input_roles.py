"""analysis/input_roles.py + runtime/plausible.py: inputs that exercise the model.

The defect: a NeMo log-mel front end (``waveforms``, ``waveforms_lens``) got random lengths of 0 or 1,
so it masked every frame and the gate compared zeros with zeros. Each input is now taken for what it is
and gets plausible values: a length as long as what it measures, a speech-like waveform, images in the
range the graph reads, token ids over the vocabulary, zero states, diffusion timesteps in range.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.input_roles import (
    CONDITION,
    GENERIC,
    IMAGE,
    KV_CACHE,
    LATENT,
    LENGTH,
    MASK,
    POSITIONS,
    SCALAR,
    STATE,
    TIMESTEP,
    TOKEN_IDS,
    WAVEFORM,
    describe_inputs,
    guessed_ranges,
    input_roles,
    parse_role_options,
    plausible,
    unlike_real,
    with_given,
)
from onnxsmith.core.errors import UsageError
from onnxsmith.io.load import load_model
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import random_inputs
from onnxsmith.runtime.sizing import inputs_that_run
from tests.support.realmodels import real_model

OPSET = [helper.make_opsetid("", 17)]
HOP = 160


def _const(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _front_end(save_proto, lens_name: str = "waveforms_lens"):
    """A NeMo-like log-mel front end (onnx-asr's preprocessor, reduced): pre-emphasis masked by
    ``Range(N) < lens``, STFT, mel MatMul, log, and the features masked by ``Range(T) < lens / hop``."""
    n_fft, mels = 512, 8
    window = np.pad(np.hanning(400), (56, 56)).astype(np.float32)
    rng = np.random.default_rng(0)
    fbank = np.abs(rng.standard_normal((n_fft // 2 + 1, mels))).astype(np.float32) / 10
    nodes = [
        helper.make_node("Shape", ["waveforms"], ["n1"], start=1, end=2),
        helper.make_node("Squeeze", ["n1"], ["n"]),
        helper.make_node("Range", ["zero", "n", "one"], ["steps"]),
        helper.make_node("Unsqueeze", [lens_name, "axis1"], ["lens2"]),
        helper.make_node("Less", ["steps", "lens2"], ["timemask"]),
        helper.make_node("Where", ["timemask", "waveforms", "fzero"], ["masked"]),
        helper.make_node("Pad", ["masked", "pads"], ["padded"]),
        helper.make_node("Unsqueeze", ["padded", "last"], ["signal"]),  # [batch, samples, 1]: a real signal
        helper.make_node("STFT", ["signal", "hop", "window"], ["image"]),
        helper.make_node("ReduceSumSquare", ["image"], ["power"], axes=[-1], keepdims=0),
        helper.make_node("MatMul", ["power", "fbank"], ["mel"]),
        helper.make_node("Add", ["mel", "guard"], ["guarded"]),
        helper.make_node("Log", ["guarded"], ["logmel"]),
        helper.make_node("Transpose", ["logmel"], ["x"], perm=[0, 2, 1]),
        helper.make_node("Div", [lens_name, "hop"], ["frames_lens"]),
        helper.make_node("Shape", ["x"], ["t1"], start=2, end=3),
        helper.make_node("Squeeze", ["t1"], ["t"]),
        helper.make_node("Range", ["zero", "t", "one"], ["frames"]),
        helper.make_node("Unsqueeze", ["frames_lens", "axes12"], ["lens3"]),
        helper.make_node("Less", ["frames", "lens3"], ["mask"]),
        helper.make_node("Where", ["mask", "x", "fzero"], ["features"]),
    ]
    inits = [
        _const("zero", np.int64(0)),
        _const("one", np.int64(1)),
        _const("axis1", np.array([1], np.int64)),
        _const("axes12", np.array([1, 2], np.int64)),
        _const("fzero", np.float32(0)),
        _const("pads", np.array([0, n_fft // 2, 0, n_fft // 2], np.int64)),
        _const("hop", np.int64(HOP)),
        _const("window", window),
        _const("last", np.array([-1], np.int64)),
        _const("fbank", fbank),
        _const("guard", np.float32(2**-24)),
    ]
    graph = helper.make_graph(
        nodes,
        "nemo_like",
        [
            helper.make_tensor_value_info("waveforms", TensorProto.FLOAT, ["batch_size", "N"]),
            helper.make_tensor_value_info(lens_name, TensorProto.INT64, ["batch_size"]),
        ],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch_size", mels, "T"])],
        inits,
    )
    return save_proto(helper.make_model(graph, opset_imports=OPSET), f"front_end_{lens_name}.onnx")


def _run(model, feeds):
    return runner.run(runner.open_session(model), feeds)


@pytest.mark.parametrize("lens_name", ["waveforms_lens", "valid"])  # by its name, and by its use alone
def test_a_front_ends_length_is_the_full_length_and_its_output_is_not_all_masked(save_proto, lens_name):
    model = load_model(_front_end(save_proto, lens_name))
    roles = input_roles(model)
    assert roles["waveforms"].kind == WAVEFORM
    assert (roles[lens_name].kind, roles[lens_name].measures, roles[lens_name].axis) == (LENGTH, "waveforms", 1)

    (feeds,) = inputs_that_run(model)  # nobody sized it: one second at 16 kHz, not 1 sample
    assert feeds["waveforms"].shape == (1, 16000)
    assert feeds[lens_name].tolist() == [16000]
    features = _run(model, feeds)["features"]
    assert np.isfinite(features).all()
    frames = np.abs(features).max(axis=1)[0]
    assert (frames > 0).mean() > 0.95  # every frame but the one past lens / hop is inside: nothing padded

    # what the issue ran: --shape waveforms:1,16000 --shape waveforms_lens:1
    given = random_inputs(model, shapes={"waveforms": (2, 16000), lens_name: (2,)}, seed=3)
    assert given[lens_name].tolist() == [16000, 16000]
    frames = np.abs(_run(model, given)["features"]).max(axis=1)
    assert (frames > 0).mean(axis=-1).min() > 0.95


def test_the_waveform_sounds_like_speech(save_proto):
    model = load_model(_front_end(save_proto))
    wave = random_inputs(model, shapes={"waveforms": (2, 16000), "waveforms_lens": (2,)})["waveforms"]
    assert wave.dtype == np.float32
    assert np.abs(wave).max() <= 1
    rms = np.sqrt(np.mean(wave.astype(np.float64) ** 2, axis=1))
    assert ((rms > 0.02) & (rms < 0.1)).all()  # speech level, not a unit normal's
    assert not np.allclose(wave[0], wave[1])  # each row its own voice
    spectrum = np.abs(np.fft.rfft(wave[0])) ** 2
    freqs = np.fft.rfftfreq(16000, 1 / 16000)
    assert spectrum[(freqs > 80) & (freqs < 4000)].sum() > 0.9 * spectrum.sum()  # voiced, not white noise
    assert random_inputs(model, seed=5)["waveforms"].tobytes() == random_inputs(model, seed=5)["waveforms"].tobytes()


def _image_model(save_proto, first: list[onnx.NodeProto], inits, shape, name, dtype=TensorProto.FLOAT):
    graph = helper.make_graph(
        [*first, helper.make_node("ReduceMean", ["h"], ["y"], keepdims=0)],
        "image",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        inits,
    )
    return load_model(save_proto(helper.make_model(graph, opset_imports=OPSET), name))


MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def _smooth(picture: np.ndarray) -> bool:
    """Neighbouring pixels close compared with the spread: a picture, not white noise."""
    steps = np.abs(np.diff(picture, axis=-1)).mean()
    return steps < 0.5 * picture.std()  # white noise: about 1.1


def test_an_image_the_graph_normalizes_is_fed_in_0_to_1(save_proto):
    model = _image_model(
        save_proto,
        [helper.make_node("Sub", ["x", "mean"], ["c"]), helper.make_node("Div", ["c", "std"], ["h"])],
        [_const("mean", MEAN), _const("std", STD)],
        ["batch", 3, "height", "width"],
        "normalizing.onnx",
    )
    role = input_roles(model)["x"]
    assert (role.kind, role.layout, role.channels, role.value_range) == (IMAGE, "NCHW", 3, "0..1")
    x = random_inputs(model, dims={"height": 64, "width": 96})["x"]
    assert x.shape == (1, 3, 64, 96)
    assert x.min() >= 0 and x.max() <= 1 and x.std() > 0.05
    assert _smooth(x[0, 0])
    normalized = (x - MEAN) / STD  # what the graph makes of it: normalized
    assert abs(normalized.mean()) < 1.5 and 0.2 < normalized.std() < 3


def test_an_image_the_graph_divides_by_255_is_fed_in_0_to_255(save_proto):
    model = _image_model(
        save_proto,
        [helper.make_node("Div", ["x", "k"], ["h"])],
        [_const("k", np.float32(255))],
        [1, "height", "width", 3],
        "div255.onnx",
    )
    role = input_roles(model)["x"]
    assert (role.kind, role.layout, role.value_range) == (IMAGE, "NHWC", "0..255")
    x = random_inputs(model, dims={"height": 32, "width": 32})["x"]
    assert x.shape == (1, 32, 32, 3)
    assert x.min() >= 0 and x.max() <= 255 and x.max() > 100
    assert _smooth(x[0, :, :, 1])
    # a Mul by 1/255 reads the same range; a Conv first reads it normalized
    scaled = _image_model(
        save_proto,
        [helper.make_node("Mul", ["x", "k"], ["h"])],
        [_const("k", np.float32(1 / 255))],
        [1, 3, 8, 8],
        "mul255.onnx",
    )
    assert input_roles(scaled)["x"].value_range == "0..255"
    conv = _image_model(
        save_proto,
        [helper.make_node("Conv", ["x", "w"], ["h"])],
        [_const("w", np.ones((2, 3, 3, 3), np.float32))],
        [1, 3, 16, 16],
        "conv.onnx",
    )
    assert input_roles(conv)["x"].value_range == "normalized"
    assert random_inputs(conv)["x"].min() < 0


def _lm(save_proto):
    """input_ids -> a 1000-row table; attention_mask, position_ids and a KV cache beside it."""
    dims_kv = ["batch", 2, "past_sequence_length", 8]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h"]),
        helper.make_node("Identity", ["attention_mask"], ["m"]),
        helper.make_node("Identity", ["position_ids"], ["p"]),
        helper.make_node("Identity", ["past_key_values.0.key"], ["k"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lm",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch", "past_sequence_length + sequence_length"]
            ),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence_length"]),
            helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, dims_kv),
        ],
        [
            helper.make_tensor_value_info(n, t, None)
            for n, t in (
                ("h", TensorProto.FLOAT),
                ("m", TensorProto.INT64),
                ("p", TensorProto.INT64),
                ("k", TensorProto.FLOAT),
            )
        ],
        [_const("embed", np.zeros((1000, 4), np.float32))],
    )
    return load_model(save_proto(helper.make_model(graph, opset_imports=OPSET), "lm.onnx"))


def test_token_ids_spread_over_the_vocabulary_and_the_rest_is_consistent(save_proto):
    model = _lm(save_proto)
    roles = input_roles(model)
    assert (roles["input_ids"].kind, roles["input_ids"].vocab) == (TOKEN_IDS, 1000)
    assert (roles["attention_mask"].kind, roles["attention_mask"].measures) == (MASK, "input_ids")
    assert roles["position_ids"].kind == POSITIONS
    assert (roles["past_key_values.0.key"].kind, roles["past_key_values.0.key"].axis) == (KV_CACHE, 2)

    feeds = random_inputs(model, dims={"sequence_length": 256})
    ids = feeds["input_ids"]
    assert ids.min() >= 0 and ids.max() < 1000
    assert ids.max() > 800 and ids.min() < 200 and len(np.unique(ids)) > 150  # spread, not 0..9
    assert feeds["past_key_values.0.key"].shape == (1, 2, 0, 8)  # an empty cache
    assert (feeds["attention_mask"] == 1).all() and feeds["attention_mask"].shape == (1, 256)

    # with a past: the mask covers past + new tokens, positions continue after the past
    feeds = random_inputs(model, dims={"sequence_length": 4, "past_sequence_length": 3})
    assert feeds["past_key_values.0.key"].shape == (1, 2, 3, 8)
    assert feeds["attention_mask"].shape == (1, 7) and (feeds["attention_mask"] == 1).all()
    assert feeds["position_ids"].tolist() == [[3, 4, 5, 6]]


def _edm_unet(save_proto):
    """An EDM-preconditioned denoiser as terrain_unet is (reduced): ``noisy`` [B, 1, 16, 16] scaled by
    1/sqrt(sigma² + 0.25) into a Conv, ``difficulty`` [B] embedded by a Linear of one input feature and added,
    ``scale`` [1] (a Mul's) beside them."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Mul", ["sigma", "sigma"], ["s2"]),
        helper.make_node("Add", ["s2", "quarter"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["sd"]),
        helper.make_node("Reshape", ["sd", "b111"], ["sd4"]),
        helper.make_node("Div", ["noisy", "sd4"], ["x"]),
        helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Unsqueeze", ["difficulty", "axis1"], ["d"]),
        helper.make_node("Gemm", ["d", "emb", "emb_b"], ["e"], transB=1),
        helper.make_node("Reshape", ["e", "b811"], ["e4"]),
        helper.make_node("Add", ["h", "e4"], ["he"]),
        helper.make_node("Mul", ["he", "scale"], ["denoised"]),
    ]
    inits = [
        _const("quarter", np.float32(0.25)),
        _const("b111", np.array([-1, 1, 1, 1], np.int64)),
        _const("b811", np.array([-1, 8, 1, 1], np.int64)),
        _const("axis1", np.array([1], np.int64)),
        _const("w", rng.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32)),
        _const("emb", rng.normal(0, 1, (8, 1)).astype(np.float32)),
        _const("emb_b", np.zeros(8, np.float32)),
    ]
    graph = helper.make_graph(
        nodes,
        "edm",
        [
            helper.make_tensor_value_info("noisy", TensorProto.FLOAT, ["batch", 1, 16, 16]),
            helper.make_tensor_value_info("sigma", TensorProto.FLOAT, ["batch"]),
            helper.make_tensor_value_info("difficulty", TensorProto.FLOAT, ["batch"]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("denoised", TensorProto.FLOAT, None)],
        inits,
    )
    return save_proto(helper.make_model(graph, opset_imports=OPSET), "edm.onnx")


def test_a_diffusion_model_sees_a_picture_under_its_timestep_s_noise(save_proto):
    """What a denoiser reads is a picture under noise of its timestep's level: at sigma 10 mostly noise, at a small
    one mostly the picture; a DDPM timestep keeps √ᾱ_t of it. A condition a Linear embeds is found, fed 0..1 and
    named as what keeps made-up inputs from looking real (its range is a guess); a Mul's scale is no condition."""
    model = load_model(_edm_unet(save_proto))
    roles = input_roles(model)
    kinds = {name: role.kind for name, role in roles.items()}
    assert kinds == {"noisy": LATENT, "sigma": TIMESTEP, "difficulty": CONDITION, "scale": GENERIC}
    feeds = random_inputs(model, dims={"batch": 64}, seed=3)
    sigma, noisy = feeds["sigma"].astype(np.float64), feeds["noisy"].astype(np.float64)
    spread = noisy.reshape(64, -1).std(axis=1)
    loud, quiet = sigma > 5, sigma < 0.1
    assert loud.any() and quiet.any()
    assert np.all(np.abs(spread[loud] / sigma[loud] - 1) < 0.2)  # noise of std sigma over the picture
    assert np.all(np.abs(noisy[quiet]).max(axis=(1, 2, 3)) < 1.5)  # the picture in -1..1, barely noised
    assert feeds["difficulty"].min() >= 0 and feeds["difficulty"].max() <= 1 and feeds["difficulty"].std() > 0.1
    assert [r.name for r in unlike_real(model)] == ["difficulty", "scale"] and not plausible(model)
    # the user states the condition's range: known, no longer a guess (the Mul's scale still is nobody's)
    given = parse_role_options("difficulty=0..255")
    role = with_given(roles, given)["difficulty"]
    assert (role.kind, role.value_range, role.range_guessed) == (CONDITION, "0..255", False)
    assert [r.name for r in unlike_real(model, given)] == ["scale"]
    assert random_inputs(model, dims={"batch": 64}, seed=3, given=given)["difficulty"].max() > 100
    with pytest.raises(UsageError, match=r"a condition's range is 0\.\.1 or 0\.\.255"):
        with_given(roles, parse_role_options("difficulty=normalized"))

    ddpm = _identity_model(
        save_proto,
        [
            helper.make_tensor_value_info("latent_sample", TensorProto.FLOAT, ["batch", 4, 8, 8]),
            helper.make_tensor_value_info("timestep", TensorProto.INT64, ["batch"]),
        ],
        "ddpm",
    )
    feeds = random_inputs(ddpm, dims={"batch": 64}, seed=4)
    steps, latent = feeds["timestep"], feeds["latent_sample"].astype(np.float64)
    late, early = steps > 900, steps < 30
    assert late.any() and early.any()
    assert np.all(np.abs(latent[late].reshape(late.sum(), -1).std(axis=1) - 1) < 0.15)  # nearly all noise
    assert np.all(np.abs(latent[early]).max(axis=(1, 2, 3)) < 1.6)  # nearly all picture
    assert plausible(ddpm)  # a latent and its timestep: what the model denoises


def test_int8_names_the_input_whose_made_up_values_are_not_real(save_proto, cli, tmp_path):
    path = _edm_unet(save_proto)
    out = tmp_path / "int8.onnx"
    result = cli("int8", str(path), str(out))
    err = result.stderr
    assert result.returncode == 1 and not out.exists(), err
    assert "made-up values of 'difficulty' (a per-sample condition fed 0..1, a guess" in err, err
    assert "'scale' (random values)" in err
    assert "--input-role difficulty=0..1 states its range, if it is that" in err


def _identity_model(save_proto, inputs: list[onnx.ValueInfoProto], name: str):
    nodes = [helper.make_node("Identity", [i.name], [f"out{k}"]) for k, i in enumerate(inputs)]
    outputs = [
        helper.make_tensor_value_info(f"out{k}", i.type.tensor_type.elem_type, None) for k, i in enumerate(inputs)
    ]
    graph = helper.make_graph(nodes, name, inputs, outputs)
    return load_model(save_proto(helper.make_model(graph, opset_imports=OPSET), f"{name}.onnx"))


def test_a_diffusion_timestep_is_in_the_models_range(save_proto):
    model = _identity_model(
        save_proto,
        [
            helper.make_tensor_value_info("sample", TensorProto.FLOAT, ["batch", 4, 8, 8]),
            helper.make_tensor_value_info("timestep", TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info("sigma", TensorProto.FLOAT, []),
        ],
        "unet",
    )
    roles = input_roles(model)
    assert roles["sample"].kind == LATENT  # a noisy latent: a picture under its timestep's noise
    assert (roles["timestep"].kind, roles["sigma"].kind) == (TIMESTEP, TIMESTEP)
    steps = np.concatenate([random_inputs(model, dims={"batch": 16}, seed=s)["timestep"] for s in range(4)])
    assert steps.min() >= 0 and steps.max() <= 999 and steps.max() > 100  # 0..999, not 0..9
    sigmas = [float(random_inputs(model, seed=s)["sigma"]) for s in range(8)]
    assert all(0.03 <= s <= 14.6 for s in sigmas) and max(sigmas) > 0.2


def test_a_vad_streams_from_a_zero_state_at_16_khz(save_proto):
    model = _identity_model(
        save_proto,
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "samples"]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 128]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        "vad",
    )
    roles = input_roles(model)
    assert (roles["state"].kind, roles["sr"].kind) == (STATE, SCALAR)
    feeds = random_inputs(model, seed=1)
    assert feeds["state"].shape == (2, 1, 128) and not feeds["state"].any()
    assert feeds["sr"].tolist() == 16000


def test_the_report_says_what_each_input_was_taken_to_be(save_proto):
    lines = describe_inputs(load_model(_front_end(save_proto)))
    assert lines[0].startswith("'waveforms': audio waveform")
    assert lines[1].startswith("'waveforms_lens': length of 'waveforms' (axis 1), its full length")


# ---------------------------------------------------------------- a mask by its use, numbered states, known ranges


def _torch_attention(path, style: str, dynamo: bool):
    """One attention layer over embedded token ids, its mask a second input named nothing telling (``in1``):
    BERT's extended mask ``(1 - m) * finfo.min`` added to the scores, ``masked_fill(m == 0, -inf)``, or a bool
    mask given to scaled_dot_product_attention; exported by torch's TorchScript or dynamo exporter."""
    import torch
    import torch.nn.functional as F

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 8)
            self.qkv = torch.nn.Linear(8, 24)

        def forward(self, ids, m):
            h = self.embed(ids)
            q, k, v = self.qkv(h).chunk(3, dim=-1)
            if style == "sdpa":
                return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], m.bool()[:, None, None, :])
            scores = q @ k.transpose(-1, -2) / 8**0.5
            if style == "extended":
                scores = scores + (1.0 - m[:, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
            else:
                scores = scores.masked_fill(m[:, None, :] == 0, float("-inf"))
            return torch.softmax(scores, -1) @ v

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 6))
    with torch.no_grad():
        torch.onnx.export(
            Attention().eval(), (ids, torch.ones_like(ids)), str(path), dynamo=dynamo, input_names=["in0", "in1"]
        )
    return load_model(path)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("style", ["extended", "fill", "sdpa"])
def test_a_mask_named_nothing_is_found_by_what_the_graph_does_with_it(tmp_path, style, dynamo):
    model = _torch_attention(tmp_path / f"{style}.onnx", style, dynamo)
    roles = input_roles(model)
    assert (roles["in0"].kind, roles["in0"].vocab) == (TOKEN_IDS, 50)
    assert (roles["in1"].kind, roles["in1"].measures, roles["in1"].why) == (MASK, "in0", "masks attention scores")
    feeds = random_inputs(model, seed=0)
    assert (feeds["in1"] == 1).all()  # nothing masked: random 0s and 1s would mask some positions of each row


def test_an_input_added_to_scores_without_a_large_fill_is_no_mask(save_proto):
    """A relative-position bias (or any float) added before a Softmax is data, not a mask: no -inf, no 1e4."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["bias", "k"], ["scaled"]),
            helper.make_node("Add", ["scores", "scaled"], ["s"]),
            helper.make_node("Softmax", ["s"], ["y"]),
        ],
        "bias",
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 6, 6]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 6, 6]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 6])],
        [_const("k", np.float32(8.0))],
    )
    roles = input_roles(load_model(save_proto(helper.make_model(graph, opset_imports=OPSET), "bias.onnx")))
    assert (roles["scores"].kind, roles["bias"].kind) == (GENERIC, GENERIC)


@pytest.mark.realmodel
def test_albert_s_unnamed_mask_is_all_ones_and_its_output_is_no_constant():
    """sudachi's ALBERT: `onnx::Unsqueeze_1` was random 0/1, so every output was the same: the model vacuous."""
    model = load_model(real_model("sudachi_albert"))
    roles = input_roles(model)
    mask = roles["onnx::Unsqueeze_1"]
    assert (mask.kind, mask.measures) == (MASK, "input.1")  # the token ids (3788 rows), not the token types
    assert (roles["input.1"].kind, roles["input.3"].kind) == (TOKEN_IDS, TOKEN_IDS)
    first, second = (random_inputs(model, seed=s) for s in (0, 1))
    assert (first["onnx::Unsqueeze_1"] == 1).all()
    (a,), (b,) = (list(_run(model, feeds).values()) for feeds in (first, second))
    assert np.abs(a - b).max() > 1  # other tokens, other tags


def test_numbered_stream_states_are_zeros_not_images(save_proto):
    """fsmn_vad's in_cache0..3 [1, 128, 19, 1] were taken for 1-channel NHWC images."""
    caches = [helper.make_tensor_value_info(f"in_cache{i}", TensorProto.FLOAT, [1, 128, 19, 1]) for i in range(4)]
    model = _identity_model(
        save_proto,
        [
            helper.make_tensor_value_info("speech", TensorProto.FLOAT, [1, "T", 400]),
            *caches,
            *[helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 1, 8]) for name in ("state1", "enc.cache_2")],
        ],
        "fsmn",
    )
    roles = input_roles(model)
    assert roles["speech"].kind == GENERIC  # features per frame, not samples
    assert {name: roles[name].kind for name in roles if name != "speech"} == dict.fromkeys(
        [f"in_cache{i}" for i in range(4)] + ["state1", "enc.cache_2"], STATE
    )
    feeds = random_inputs(model, dims={"T": 10})
    assert feeds["in_cache3"].shape == (1, 128, 19, 1) and not feeds["in_cache3"].any()


@pytest.mark.parametrize(
    ("shape", "kind"),
    [(["batch", "samples"], WAVEFORM), (["batch", 1, "samples"], WAVEFORM), (["batch", "frames", 80], GENERIC)],
)
def test_a_speech_input_is_a_waveform_only_in_a_waveform_s_shape(save_proto, shape, kind):
    """Samples per channel ([B, T], [B, 1, T]) are a waveform; [B, T, 80] named `speech` is features per frame."""
    model = _identity_model(
        save_proto, [helper.make_tensor_value_info("speech", TensorProto.FLOAT, shape)], f"speech{len(shape)}"
    )
    assert input_roles(model)["speech"].kind == kind


@pytest.mark.parametrize(("in_channels", "kind"), [(1, WAVEFORM), (4, GENERIC)])
def test_samples_a_1d_conv_filters_over_one_channel_are_a_waveform(save_proto, in_channels, kind):
    """silero VAD's `input` [batch, samples]: padded, unsqueezed to [B, 1, T] and read by a Conv with weight
    [258, 1, 256] (its STFT). The same signal split into 4 channels is something else."""
    nodes = [
        helper.make_node("Reshape", ["input", "split"], ["frames"]),
        helper.make_node("Conv", ["frames", "w"], ["y"], strides=[16]),
    ]
    graph = helper.make_graph(
        nodes,
        "filters",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            _const("split", np.array([1, in_channels, 512 // in_channels], np.int64)),
            _const("w", np.ones((8, in_channels, 16), np.float32)),
        ],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=OPSET), f"conv{in_channels}.onnx"))
    assert input_roles(model)["input"].kind == kind


@pytest.mark.realmodel
@pytest.mark.parametrize("name", ["silero_vad", "silero_vad_op15"])
def test_silero_vad_s_input_is_a_waveform(name):
    """Named only `input`: its STFT is a Conv over one channel (in an If per sample rate, or not)."""
    roles = input_roles(load_model(real_model(name)))
    assert (roles["input"].kind, roles["state"].kind, roles["sr"].kind) == (WAVEFORM, STATE, SCALAR)


@pytest.mark.realmodel
def test_fsmn_vad_streams_from_zero_caches():
    """Its `speech` is [1, frames, 400]: features per frame (80 mel bins x 5 frames stacked), not samples."""
    roles = input_roles(load_model(real_model("fsmn_vad")))
    assert [roles[f"in_cache{i}"].kind for i in range(4)] == [STATE] * 4
    assert roles["speech"].kind == GENERIC


def _conv_image(save_proto, name: str, metadata: dict[str, str] | None = None):
    """An image a Conv reads first: nothing in the graph says its range."""
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("ReduceMean", ["c"], ["y"], keepdims=0),
        ],
        "image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [_const("w", np.ones((2, 3, 3, 3), np.float32))],
    )
    proto = helper.make_model(graph, opset_imports=OPSET)
    helper.set_model_props(proto, metadata or {})
    return load_model(save_proto(proto, name))


def test_an_image_range_nothing_states_is_a_guess_until_someone_states_it(save_proto):
    conv = _conv_image(save_proto, "conv.onnx")
    role = input_roles(conv)["x"]
    assert (role.value_range, role.range_guessed) == ("normalized", True)
    assert role.describe().endswith("(read as it comes: normalized outside the model)")
    assert guessed_ranges(conv) == ["x"]
    assert guessed_ranges(conv, parse_role_options("x=NCHW")) == ["x"]  # a layout says nothing of the range
    given = parse_role_options("x=0..255")
    assert guessed_ranges(conv, given) == []
    corrected = with_given(input_roles(conv), given)["x"]
    assert (corrected.value_range, corrected.range_guessed) == ("0..255", False)

    # read from the graph: known, and a layout given beside it keeps it known
    scaled = _image_model(
        save_proto, [helper.make_node("Mul", ["x", "k"], ["h"])], [_const("k", np.float32(1 / 255))], [1, 3, 8, 8], "m"
    )
    assert input_roles(scaled)["x"].range_guessed is False
    assert guessed_ranges(scaled) == guessed_ranges(scaled, parse_role_options("x=NCHW")) == []


def test_an_ultralytics_export_says_its_images_are_0_to_1(save_proto):
    model = _conv_image(save_proto, "yolo.onnx", {"author": "Ultralytics", "task": "detect"})
    role = input_roles(model)["x"]
    assert (role.layout, role.channels, role.value_range, role.range_guessed) == ("NCHW", 3, "0..1", False)
    assert "Ultralytics" in role.describe() and guessed_ranges(model) == []
    x = random_inputs(model)["x"]
    assert x.min() >= 0 and x.max() <= 1 and x.max() > 0.5
    assert input_roles(_conv_image(save_proto, "other.onnx", {"author": "someone"}))["x"].range_guessed


@pytest.mark.realmodel
def test_real_images_ranges_known_and_guessed():
    def image(name):
        (role,) = [r for r in input_roles(load_model(real_model(name))).values() if r.kind == IMAGE]
        return role.value_range, role.range_guessed

    assert image("nudenet_320n") == image("isbnx_yolo_e2e") == ("0..1", False)  # Ultralytics exports
    assert image("captcha_crnn") == ("0..255", False)  # the graph multiplies by 1/255
    assert image("ppocr_det") == ("normalized", True)  # PaddleOCR normalizes outside: a guess


def test_a_run_of_inputs_taken_to_be_the_same_is_one_line():
    """A decoder's cache tensors (4 here, 60 on SmolLM2) are one line naming the first and the last, not one each;
    its ids are read as ids over the embedding table although the TorchScript export reshapes them first."""
    from tests.support.lm_models import gpt2_folder

    model = load_model(gpt2_folder() / "onnx" / "model.onnx")
    lines = describe_inputs(model)
    past = [name for name in input_roles(model) if name.startswith("past_key_values")]
    assert len(past) >= 4 and len(lines) == len(input_roles(model)) - len(past) + 1
    grouped = f"'{past[0]}' ... '{past[-1]}' ({len(past)} inputs): kv cache, past axis 2"
    assert any(line.startswith(grouped) for line in lines), lines
    # its ids are flattened before the lookup: still ids over the table's rows
    assert lines[0].startswith("'input_ids': token ids spread over 0..") and "indexes a table of" in lines[0]
