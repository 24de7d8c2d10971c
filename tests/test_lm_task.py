"""onnxsmith.tasks.lm (scoring.py and gate.py): tokenizing, scoring, generating, and the LM gate's arithmetic."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from onnxsmith.core.errors import InputError
from onnxsmith.tasks import lm
from onnxsmith.tasks import lm as task
from tests.support.lm_models import TEXT, glassllm_folder, glassllm_wheel, gpt2_folder, prompt_ids


def test_glassllm_tokenizer_json_matches_glassllm_own_tokenizer():
    """tools/glassllm_to_onnx.py rewrites glassllm's tokenizer for `tokenizers`; it must give the same ids."""
    sys.path.insert(0, str(glassllm_wheel()))
    try:
        from glassllm.tokenizer import Tokenizer
    finally:
        sys.path.pop(0)
    from tests.support.realmodels import real_model

    theirs = Tokenizer.load(real_model("glassllm_tokenizer"))
    ours = task.load_tokenizer(glassllm_folder())
    text = TEXT.read_text()
    assert ours.encode(text, add_special_tokens=False).ids == theirs.encode(text)


def test_text_windows():
    tokenizer = task.load_tokenizer(gpt2_folder())
    windows = task.text_windows(tokenizer, TEXT.read_text(), window=50, max_windows=7)
    assert windows.shape == (7, 50) and windows.dtype == np.int64
    short = task.text_windows(tokenizer, "The keeper", window=50)
    assert short.shape[0] == 1 and 2 <= short.shape[1] < 50
    with pytest.raises(InputError, match="at least 2 are needed"):
        task.text_windows(tokenizer, "", window=50)


def test_a_model_against_itself_has_zero_kl_and_full_agreement():
    model = gpt2_folder(past=False) / "onnx" / "model.onnx"
    windows = task.text_windows(task.load_tokenizer(gpt2_folder()), TEXT.read_text(), window=64, max_windows=4)
    ref, same = task.score_models([model, model], windows)
    assert same.kl == pytest.approx(0, abs=1e-9) and same.top1 == 1 and same.loss == pytest.approx(ref.loss)
    assert ref.tokens == 4 * 63 and np.exp(ref.loss) == pytest.approx(ref.perplexity)
    assert ref.loss < 3  # the fixture model was trained on this text


def test_greedy_generation_through_the_kv_cache_equals_rerunning_the_sequence():
    ids = prompt_ids(gpt2_folder(), "The keeper climbed the stairs")
    with_cache = task.greedy_generate(gpt2_folder() / "onnx" / "model.onnx", ids, 20)
    without = task.greedy_generate(gpt2_folder(past=False) / "onnx" / "model.onnx", ids, 20)
    assert with_cache == without and len(set(with_cache)) > 5


def test_agreement_arithmetic():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 5, 11))
    same = lm.Agreement.of(ref, ref)
    assert np.allclose(same.kl, 0) and same.top1.all()
    shifted = lm.Agreement.of(ref, ref + 3.0)  # a constant shift changes no probability
    assert np.allclose(shifted.kl, 0)
    p = np.exp(lm.log_softmax(ref))
    flat = lm.Agreement.of(ref, np.zeros_like(ref))  # KL(p || uniform) = log V - H(p)
    assert np.allclose(flat.kl, np.log(11) + np.sum(p * np.log(p), axis=-1).reshape(-1))
    assert np.allclose(flat.entropy, -np.sum(p * np.log(p), axis=-1).reshape(-1))


def test_sampled_gate_sequences_are_seeded_and_in_vocabulary():
    model = gpt2_folder() / "onnx" / "model.onnx"
    a = lm.sample_sequences(model, count=2, length=10, seed=3)
    b = lm.sample_sequences(model, count=2, length=10, seed=3)
    assert a.shape == (2, 10) and np.array_equal(a, b) and a.max() < 1001


def test_text_is_tokenized_in_pieces_with_the_ids_of_the_whole(tmp_path):
    """eval-lm reads its text in pieces cut before a word (a 200 MB one-line file once killed it): the ids are
    those of the text tokenized at once, whatever the piece size, runs of spaces and newlines included."""
    tokenizer = task.load_tokenizer(gpt2_folder())
    text = TEXT.read_text() + "  two  spaces,\ttabs\t\tand\n\n  blank lines 'll 's" * 20
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    for size in (1, 7, 64, 1000):
        pieces = list(lm.split_pieces(text[i : i + size] for i in range(0, len(text), size)))
        assert "".join(pieces) == text and (size > len(text) // 2 or len(pieces) > 1)
        assert [i for p in pieces for i in tokenizer.encode(p, add_special_tokens=False).ids] == whole, size
    path = tmp_path / "text.txt"
    path.write_bytes(text.encode("utf-8"))
    streamed = task.text_windows(tokenizer, lm.text_pieces(path, piece=100), window=50, max_windows=7)
    assert np.array_equal(streamed, task.text_windows(tokenizer, text, window=50, max_windows=7))
    assert np.array_equal(
        task.text_windows(tokenizer, lm.text_pieces(path), window=50), task.text_windows(tokenizer, text, window=50)
    )
