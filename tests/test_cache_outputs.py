"""A decoder's KV cache (present.*) judged by its effect on the next step's logits (verify/cache.py), on the
GPT-2 fixture: real torch.onnx.export output in the optimum / transformers.js layout."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxsmith.analysis.lm_signature import CacheLayout, cache_layout
from onnxsmith.analysis.number_formats import FP32
from onnxsmith.io.load import load_model
from onnxsmith.release.variant import produce_variant
from onnxsmith.tasks import lm
from onnxsmith.tasks.lm.scoring import greedy_generate
from onnxsmith.transforms.fp16 import Options as Fp16Options
from onnxsmith.verify import cache
from onnxsmith.verify.compare import Comparison, compare_models
from onnxsmith.verify.gate import Bounds, judge_tensor, verdict
from tests.support.lm_models import gpt2_folder, lm_gate_feeds, prefill_and_decode_feeds, prompt_ids

SOURCE = gpt2_folder() / "onnx" / "model.onnx"
PRESENTS = ("present.0.key", "present.0.value", "present.1.key", "present.1.value")


def cache_edited(path, scale: float, which=("key", "value"), shift: float = 0.0):
    """The GPT-2 fixture with its present.*.<which> outputs replaced by present * scale + shift (an export
    whose cache is off by that much); everything else, the logits included, is the source's."""
    model = ir.load(SOURCE)
    graph = model.graph
    for index, out in enumerate(list(graph.outputs)):
        if not out.name.startswith("present.") or out.name.rsplit(".", 1)[-1] not in which:
            continue
        name = out.name
        out.name = f"{name}_raw"
        constants = []
        for what, value in (("scale", scale), ("shift", shift)):
            constant = ir.Value(name=f"{name}_{what}", const_value=ir.tensor(np.array(value, np.float32)))
            graph.register_initializer(constant)
            constants.append(constant)
        mul = ir.node("Mul", [out, constants[0]])
        add = ir.node("Add", [mul.outputs[0], constants[1]])
        add.outputs[0].name, add.outputs[0].type, add.outputs[0].shape = name, out.type, out.shape
        graph.extend([mul, add])
        graph.outputs[index] = add.outputs[0]
    ir.save(model, path)
    return path


@pytest.fixture(scope="module")
def feeds():
    return lm_gate_feeds(SOURCE) + lm_gate_feeds(SOURCE, seed=1)


def _run(path, feeds):
    from onnxsmith.runtime.runner import prepare_session, run_all

    session, model, _ = prepare_session(path)
    return run_all(session, model, feeds, path)


def test_the_cached_decoder_signature_is_recognised():
    layout = cache_layout(load_model(SOURCE))
    assert layout is not None and layout.logits == "logits" and layout.family == "present.*"
    assert layout.presents == PRESENTS
    assert dict(layout.pairs)["past_key_values.1.value"] == "present.1.value"
    # Without a cache (the same model exported without past) there is nothing to step: tensors as before.
    assert cache_layout(load_model(gpt2_folder(past=False) / "onnx" / "model.onnx")) is None


def test_a_cache_that_differs_in_its_last_digits_is_accepted(tmp_path, feeds):
    """The keys scaled by 1.001: their RMS moves past the fp32 bound (the old judgement refused), the
    next step's logits move by 1e-8 of their magnitude and greedy generation does not change."""
    variant = cache_edited(tmp_path / "keys.onnx", 1 + 1e-3, ("key",))
    comparison = compare_models(SOURCE, variant, feeds)
    assert comparison.bounds.format == "fp32"
    assert comparison.passed, comparison.verdict()
    kinds = {o.name: o.kind for o in comparison.outputs}
    assert kinds == {"logits": "tensor", **dict.fromkeys(PRESENTS, "cache")}
    key = next(o for o in comparison.outputs if o.name == "present.0.key")
    assert key.cache["judged_by"] == "logits" and key.cosine > comparison.bounds.min_cosine
    assert "present.* judged by the next step's logits: cosine " in comparison.summary()
    # Judged by its own values, the same cache is refused (what the gate did before).
    ref, test = _run(SOURCE, feeds), _run(variant, feeds)
    own = judge_tensor("present.0.key", ref["present.0.key"], test["present.0.key"], comparison.bounds)
    assert not own.passed and "magnitude" in own.failed
    prompt = prompt_ids(gpt2_folder(), "The")
    assert greedy_generate(variant, prompt, 8) == greedy_generate(SOURCE, prompt, 8)


@pytest.mark.parametrize(
    ("scale", "which", "shift"), [(1.5, ("key", "value"), 0.0), (1.0, ("value",), 0.3)], ids=["scaled", "shifted"]
)
def test_a_cache_that_makes_generation_diverge_is_refused(tmp_path, feeds, scale, which, shift):
    variant = cache_edited(tmp_path / "broken.onnx", scale, which, shift)
    prompt = prompt_ids(gpt2_folder(), "The")
    assert greedy_generate(variant, prompt, 8)[:6] != greedy_generate(SOURCE, prompt, 8)[:6]  # diverges early
    comparison = compare_models(SOURCE, variant, feeds)
    assert not comparison.passed
    by_name = {o.name: o for o in comparison.outputs}
    assert by_name["logits"].passed  # this step's logits are the source's: only the cache is wrong
    assert all(not by_name[name].passed and by_name[name].kind == "cache" for name in PRESENTS)
    line = comparison.verdict()
    assert line.startswith("output 'present.0.key': present.* judged by the next step's logits: cosine ")
    assert "more of" not in line  # the cache outputs fail as one
    assert "\n" not in line


def test_the_fp16_variant_of_a_cached_decoder_is_judged_by_its_next_step(tmp_path, feeds):
    result = produce_variant(SOURCE, tmp_path / "fp16.onnx", [("fp16", Fp16Options())], feeds=feeds)
    assert (tmp_path / "fp16.onnx").exists()
    comparison = result.comparison
    assert comparison.bounds.format == "fp16" and comparison.passed
    assert [o.kind for o in comparison.outputs] == ["tensor", "cache", "cache", "cache", "cache"]
    assert all(o.cache["own_cosine"] < 1 for o in comparison.outputs[1:])  # the cache did change
    # Judged as a decoder too: what it generates from prompts the source writes.
    (generation,) = comparison.judgements
    assert generation.name == "generation" and generation.passed
    assert generation.measured["generation"]["agreed"] == [16, 16, 16, 16]
    assert "greedy generation from 4 prompts: 16, 16, 16, 16 of 16 tokens" in comparison.summary()
    assert comparison.to_json()["judgements"][0]["generation"]["share"] == 1.0


def test_a_decoder_whose_generation_diverges_is_refused_by_the_generation_judgement(tmp_path):
    """The judgement every one-gate command adds for a cached decoder, on its own: a cache scaled by 1.5 makes the
    variant write other text; a Comparison whose outputs all passed is refused by it, in one line."""
    broken = lm.generation_judgement(SOURCE, cache_edited(tmp_path / "broken.onnx", 1.5), 0.5)
    assert not broken.passed and broken.problem.startswith("greedy generation repeats ")
    assert broken.measured["generation"]["share"] < 0.5
    assert lm.generation_judgement(SOURCE, cache_edited(tmp_path / "keys.onnx", 1 + 1e-3, ("key",)), 1.0).passed
    comparison = Comparison("model.onnx", "variant.onnx", {}, 1, Bounds.for_format(FP32), [], judgements=[broken])
    assert not comparison.passed and comparison.verdict() == broken.problem


def test_a_decode_step_on_a_filled_cache_is_stepped_once_more(tmp_path):
    """Feeds that already carry a cache (a decode step): the mask grows from past + new by one."""
    decode = prefill_and_decode_feeds(SOURCE)[1]
    assert decode["past_key_values.0.key"].shape[2] > 0
    good = compare_models(SOURCE, cache_edited(tmp_path / "keys.onnx", 1 + 1e-3, ("key",)), [decode])
    assert good.passed, good.verdict()
    bad = compare_models(SOURCE, cache_edited(tmp_path / "bad.onnx", 1.5), [decode])
    assert not bad.passed and "present.* judged by the next step's logits" in bad.verdict()


def test_nan_in_the_cache_is_refused_whatever_the_next_step_says():
    layout = CacheLayout("logits", (("past_key_values.0.key", "present.0.key"),))
    rng = np.random.default_rng(0)
    ref = {"present.0.key": rng.standard_normal((1, 2, 4, 8, 16))}
    test = {"present.0.key": ref["present.0.key"].copy()}
    test["present.0.key"][0, 0, 0, 0, 0] = np.inf
    logits = rng.standard_normal((1, 2, 1, 50))
    bounds = Bounds.for_format(FP32)
    (diff,) = cache.judge_cache(layout, ref, test, logits, logits.copy(), bounds)
    assert not diff.passed and diff.failed == ["nonfinite"] and diff.kind == "cache"
    assert "no bound accepts NaN/inf" in verdict([diff], bounds)
    (same,) = cache.judge_cache(layout, ref, {"present.0.key": ref["present.0.key"] * 3}, logits, logits, bounds)
    assert same.passed  # the cache's own values are not judged: only its effect is
    with pytest.raises(Exception, match="has shape"):
        cache.judge_cache(layout, ref, {"present.0.key": ref["present.0.key"][:, :, :, :4]}, logits, logits, bounds)


def test_compare_judges_two_cached_decoders_by_what_they_generate_too(tmp_path):
    import onnxsmith

    close = onnxsmith.compare(SOURCE, cache_edited(tmp_path / "keys.onnx", 1 + 1e-3, ("key",)), samples=2)
    assert close.passed and [j.name for j in close.judgements] == ["generation"]
    assert "greedy generation from 4 prompts: 16, 16, 16, 16 of 16 tokens" in close.summary()
    strict = onnxsmith.compare(SOURCE, cache_edited(tmp_path / "keys.onnx", 1 + 1e-3, ("key",)), min_generation=1.0)
    assert strict.passed  # the same text to the last token
    no_cache = gpt2_folder(past=False) / "onnx" / "model.onnx"
    assert onnxsmith.compare(no_cache, no_cache).judgements == []  # not a cached decoder: its outputs alone
