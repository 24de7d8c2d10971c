"""int8 of a causal LM with a KV cache (transforms/int8.py, quantize_engine.make_decoder_int8): block-wise 8-bit
weights judged as a language model, on the GPT-2 fixture (real torch.onnx.export output in the optimum layout)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxsmith.core.errors import UsageError
from onnxsmith.io.load import load_model
from onnxsmith.release.variant import produce_variant
from onnxsmith.settings.int8 import Int8Options
from onnxsmith.tasks.lm import LMComparison, greedy_generate
from onnxsmith.transforms.int8 import as_decoder
from tests.conftest import run_cli_in_process
from tests.support.lm_models import gpt2_folder, lm_gate_feeds, prompt_ids

SOURCE = gpt2_folder() / "onnx" / "model.onnx"
NO_CACHE = gpt2_folder(past=False) / "onnx" / "model.onnx"


def test_a_cached_decoder_gets_8_bit_blocks_judged_as_a_language_model(tmp_path):
    out = tmp_path / "model_int8.onnx"
    result = produce_variant(SOURCE, out, [("int8", Int8Options())], feeds=lm_gate_feeds(SOURCE))
    comparison = result.comparison
    assert isinstance(comparison, LMComparison) and comparison.passed
    assert comparison.text == "4 sequences the source wrote"  # not the made-up feeds: text the source writes
    assert comparison.generation is not None and comparison.generation.share >= 0.5
    assert comparison.mean_kl < 0.02 and comparison.cache_steps["top1"] >= 0.9
    model = load_model(out)
    ops = [node.op_type for node in model.graph]
    nbits = [node for node in model.graph if node.op_type == "MatMulNBits"]
    assert len(nbits) == 9  # 8 body weights and the tied head
    assert {(n.attributes["bits"].as_int(), n.attributes["accuracy_level"].as_int()) for n in nbits} == {(8, 4)}
    assert "MatMulIntegerToFloat" not in ops and "DynamicQuantizeLinear" not in ops
    source = load_model(SOURCE)
    assert [(v.name, str(v.shape)) for v in model.graph.outputs] == [
        (v.name, str(v.shape)) for v in source.graph.outputs
    ]
    assert out.stat().st_size < 0.4 * SOURCE.stat().st_size
    step = result.report.steps[0]
    assert step.notes[0].startswith("a causal LM with a KV cache: its MatMul weights int8 in blocks of 32")
    assert step.stats["measured_speedup"] > 0
    assert any(note.startswith("measured decode step (one token after 64 cached") for note in step.notes)
    assert not any(line.startswith("inputs taken to be") for line in result.report.headline)
    prompt = prompt_ids(gpt2_folder(), "The keeper climbed the stairs")
    assert greedy_generate(out, prompt, 8) == greedy_generate(SOURCE, prompt, 8)


def test_the_decoder_gate_refuses_on_its_own_bounds_and_writes_nothing(tmp_path):
    out = tmp_path / "model_int8.onnx"
    done = run_cli_in_process("int8", SOURCE, out, "--max-kl", "1e-9", "--no-speed")
    assert done.returncode == 1 and not out.exists()
    assert "verification failed, variant not written: mean KL(source || variant)" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_which_models_are_taken_as_decoders():
    assert as_decoder(load_model(SOURCE), Int8Options())
    assert not as_decoder(load_model(SOURCE), Int8Options(decoder=False))  # --no-decoder: as any model
    assert not as_decoder(load_model(NO_CACHE), Int8Options())  # no KV cache: int8 as for any model
    with pytest.raises(UsageError, match="not a causal LM with a KV cache"):
        as_decoder(load_model(NO_CACHE), Int8Options(decoder=True))
    cut = load_model(SOURCE)
    cut.graph.outputs.pop()  # a past input without its present output: not recognised
    assert not as_decoder(cut, Int8Options())


def test_inputs_given_for_a_decoder_are_said_to_be_unused(tmp_path):
    feeds = lm_gate_feeds(SOURCE)[0]
    np.savez(tmp_path / "feeds.npz", **feeds)
    out = tmp_path / "model_int8.onnx"
    done = run_cli_in_process("int8", SOURCE, out, "--inputs", tmp_path / "feeds.npz", "--no-speed")
    assert done.returncode == 0, done.stderr
    assert "the inputs given are not used: 8-bit weight blocks need no calibration" in done.stdout
    plain = run_cli_in_process("int8", SOURCE, tmp_path / "plain.onnx", "--no-speed")
    assert plain.returncode == 0 and "the inputs given are not used" not in plain.stdout
