"""onnxsmith.tasks.lm (scoring.py and gate.py): tokenizing, scoring, generating, and the LM gate's arithmetic."""

from __future__ import annotations

import sys

import numpy as np
import onnx_ir as ir
import pytest

from onnxsmith.core.errors import InputError
from onnxsmith.io.load import load_model
from onnxsmith.tasks import lm
from onnxsmith.tasks import lm as task
from tests.support.check import save_ir
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


def _with_present_scaled(source, target, factor: float):
    """The GPT-2 fixture whose ``present.0.value`` output is ``factor`` times the source's: the logits of one run
    are untouched, the next steps through that cache are not (a KV cache judged by its effect)."""
    model = load_model(source)
    graph = model.graph
    present = next(v for v in graph.outputs if v.name == "present.0.value")
    scale = ir.Value(name="present_scale", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]))
    scale.const_value = ir.tensor(np.array(factor, np.float32), name="present_scale")
    graph.register_initializer(scale)
    mul = ir.node("Mul", [present, scale])
    graph.append(mul)
    scaled = mul.outputs[0]
    scaled.dtype, scaled.shape = present.dtype, present.shape
    index = list(graph.outputs).index(present)
    present.name = "present.0.value.unscaled"
    scaled.name = "present.0.value"
    graph.outputs[index] = scaled
    return save_ir(model, target)


def test_the_gate_judges_a_kv_cache_by_the_steps_through_it_not_by_its_cosine(tmp_path):
    """A cache scaled by 0.999 (cosine 1, the next steps the same) passes; one scaled by 0.2 has cosine 1 too
    -- a cosine cannot see a scale -- and is refused by its next steps: those steps are what the gate judges."""
    source = gpt2_folder() / "onnx" / "model.onnx"
    feeds = [lm.lm_feeds(lm.lm_signature(load_model(source)), lm.sample_sequences(source, count=2, length=16))]
    close = _with_present_scaled(source, tmp_path / "close.onnx", 0.999)
    comparison = lm.compare_lm(source, close, feeds)
    assert comparison.passed, comparison.problems
    assert comparison.cache_steps["positions"] == 2 * 8 and comparison.cache_steps["top1"] == 1.0
    assert "through its KV cache, 16 steps" in comparison.summary()
    broken = _with_present_scaled(source, tmp_path / "broken.onnx", 0.2)
    comparison = lm.compare_lm(source, broken, feeds)
    assert comparison.mean_kl == pytest.approx(0, abs=1e-9) and comparison.top1 == 1.0  # one run: untouched
    assert not comparison.passed and comparison.cache_steps["mean_kl"] > 0.01
    assert any("through the KV cache" in p for p in comparison.problems)
    assert not any("cosine" in p for p in comparison.problems)


def test_generation_counts_the_tokens_before_the_first_divergence():
    source = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    variant = np.array([[1, 2, 0, 4], [5, 6, 7, 8], [0, 9, 9, 9]])
    generation = lm.Generation.of(source, variant)
    assert generation.agreed == (2, 4, 0)  # what follows a divergence does not count, even where equal again
    assert generation.share == pytest.approx(6 / 12)
    assert generation.describe() == (
        "greedy generation from 3 prompts: 2, 4, 0 of 4 tokens the source's before the first divergence"
    )


def test_the_gate_refuses_a_variant_whose_generation_diverges_early_on_its_own_bound(tmp_path):
    """Real exporter output (the GPT-2 fixture): a cache scaled by 0.999 generates what the source does; one scaled
    by 0.2 leaves one run's logits exact and is refused by its greedy generation even with the KL and top-1
    bounds opened wide: what a user sees of a decoder is what it generates."""
    source = gpt2_folder() / "onnx" / "model.onnx"
    feeds = [lm.lm_feeds(lm.lm_signature(load_model(source)), lm.sample_sequences(source, count=4, length=16))]
    close = lm.compare_lm(source, _with_present_scaled(source, tmp_path / "close.onnx", 0.999), feeds)
    assert close.passed and close.generation is not None
    assert close.generation.agreed == (lm.GENERATED_TOKENS,) * 4
    assert "greedy generation from 4 prompts: 16, 16, 16, 16 of 16 tokens" in close.summary()
    assert close.to_json()["generation"]["share"] == 1.0
    broken = _with_present_scaled(source, tmp_path / "broken.onnx", 0.2)
    loose = lm.compare_lm(source, broken, feeds, max_kl=100, min_top1=0)
    assert loose.generation is not None and loose.generation.share < 0.5
    assert not loose.passed
    assert [p for p in loose.problems if "greedy generation repeats" in p] == loose.problems
    assert lm.compare_lm(source, broken, feeds, max_kl=100, min_top1=0, min_generation=0).passed
