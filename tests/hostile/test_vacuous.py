"""A gate that passes on nothing (issue 23 class 3): empty, all-NaN or constant feeds, and source outputs that
are empty, NaN, constant or masked, are not evidence. Every such comparison is refused in one line, exit 2, for
two models that differ (a pass there would have been a lie)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxsmith.core.errors import InputError
from onnxsmith.verify.evidence import check_feeds, check_reference
from tests.conftest import assert_one_line_error
from tests.support.models import masked_frontend, mlp


@pytest.fixture
def two_models(save_proto):
    """Two different models with the same signature: any honest comparison refuses the second."""
    return save_proto(mlp(seed=0), "a.onnx"), save_proto(mlp(seed=1), "b.onnx")


def test_an_empty_input_is_refused(cli, two_models, tmp_path):
    a, b = two_models
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 8), np.float32))
    assert_one_line_error(cli("compare", a, b, "--inputs", tmp_path / "empty.npz"), "empty", "proves nothing")


def test_a_batch_of_zero_is_refused(cli, two_models):
    a, b = two_models
    assert_one_line_error(cli("compare", a, b, "--shape", "batch=0"), "empty", "proves nothing")


@pytest.mark.parametrize(
    ("values", "needle"),
    [(np.full((3, 8), np.nan, np.float32), "all NaN/inf"), (np.full((3, 8), 0.5, np.float32), "one value")],
)
def test_an_all_nan_or_constant_input_is_refused(cli, two_models, tmp_path, values, needle):
    a, b = two_models
    np.savez(tmp_path / "x.npz", x=values)
    assert_one_line_error(cli("compare", a, b, "--inputs", tmp_path / "x.npz"), "input 'x'", needle)


def test_an_all_masked_source_is_refused_naming_the_length(cli, save_proto, tmp_path):
    """NeMo's log-mel front end with a length of 0: both models output the same zeros; the refusal names the
    input that masks them."""
    a = save_proto(masked_frontend(seed=0), "a.onnx")
    b = save_proto(masked_frontend(seed=1), "b.onnx")
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "masked.npz",
        waveforms=rng.standard_normal((2, 1600)).astype(np.float32),
        waveforms_lens=np.array([0, 100], np.int64),
    )
    result = cli("compare", a, b, "--inputs", tmp_path / "masked.npz")
    assert_one_line_error(result, "output 'features'", "do not exercise", "'waveforms_lens'")
    # the same two models on a real length: exercised, and refused for what they are (different weights)
    np.savez(
        tmp_path / "real.npz",
        waveforms=rng.standard_normal((2, 1600)).astype(np.float32),
        waveforms_lens=np.array([1600, 800], np.int64),
    )
    result = cli("compare", a, b, "--inputs", tmp_path / "real.npz")
    assert result.returncode == 1, result.stderr
    assert "do not exercise" not in result.stdout + result.stderr


def test_outputs_the_same_for_every_input_set_are_not_evidence():
    feeds = [{"x": np.full((1, 4), float(i + 1), np.float32) + np.arange(4, dtype=np.float32)} for i in range(3)]
    same = {"y": np.stack([np.arange(4.0, dtype=np.float32)] * 3)}
    with pytest.raises(InputError, match="the same in every input set"):
        check_reference(feeds, same)
    varied = {"y": np.stack([f["x"] for f in feeds]), "anchors": same["y"]}
    evidence = check_reference(feeds, varied)
    assert evidence.exercised == ("y",)
    assert dict(evidence.idle) == {"anchors": "the same in every input set"}
    assert "not evidence: 'anchors'" in evidence.describe()


def test_a_mask_of_ones_is_a_mask_not_a_constant_input():
    check_feeds([{"attention_mask": np.ones((1, 8), np.float32), "x": np.arange(8, dtype=np.float32)}])
    with pytest.raises(InputError, match="input 'image'"):
        check_feeds([{"image": np.ones((1, 3, 4, 4), np.float32)}])


def test_a_state_of_zeros_beside_a_real_input_is_how_a_stream_starts():
    audio = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    check_feeds([{"input": audio, "state": np.zeros((2, 1, 128), np.float32)}])
    with pytest.raises(InputError, match="input 'input' holds one value"):
        check_feeds([{"input": np.zeros((1, 512), np.float32), "state": np.zeros((2, 1, 128), np.float32)}])
