"""`onnxsmith quantize` and `onnxsmith eval-lm` end to end, on the GPT-2 fixtures and on glassllm."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.cli.main import main
from onnxsmith.io.files import sha256_file
from onnxsmith.io.save import PROVENANCE_KEY
from onnxsmith.quantize_engine.report import quantization_parameters
from onnxsmith.release.lm_folder import quantize_folder
from onnxsmith.tasks import lm as task
from onnxsmith.transforms.quantize import QuantizeOptions
from tests.conftest import assert_one_line_error
from tests.support.lm_models import TEXT, glassllm_folder, gpt2_folder, gpt2_on_gguf_grids, llama_folder
from tests.support.models import mlp

FOLD = {"session.disable_quant_qdq": "1"}


def run_main(capsys, *args) -> subprocess.CompletedProcess:
    """``onnxsmith ARGS`` in this process (the CLI subprocess costs seconds of imports per call)."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.fixture(scope="module")
def gpt2_q4(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpt2") / "q4"
    before = sha256_file(gpt2_folder() / "onnx" / "model.onnx")
    quantize_folder(gpt2_folder(), out, QuantizeOptions())
    assert sha256_file(gpt2_folder() / "onnx" / "model.onnx") == before  # the source is never modified
    return out


@pytest.fixture(scope="module")
def glass_q4(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("glass") / "q4"
    quantize_folder(glassllm_folder(), out, QuantizeOptions())
    return out


def _initializers(path: Path) -> list[onnx.TensorProto]:
    return list(onnx.load(path).graph.initializer)


def test_gpt2_folder_is_laid_out_for_transformers_js(gpt2_q4):
    source = gpt2_folder()
    assert sorted(p.name for p in (gpt2_q4 / "onnx").iterdir()) == ["model_q4.onnx", "model_q4_full.onnx"]
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (gpt2_q4 / name).read_bytes() == (source / name).read_bytes()
    report = json.loads((gpt2_q4 / "quantize_report.json").read_text())
    assert report["session_options"] == FOLD
    assert "onnxruntime-web (WASM)" in report["targets"]
    assert [v["logits"] for v in report["variants"]] == ["last position", "every position"]
    assert all(v["gate"]["passed"] and v["gate"]["mean_kl"] < 0.1 for v in report["variants"])
    assert any("tied embedding/LM head" in n and "gather its columns" in n for n in report["notes"])  # has a cache
    # the graph passes: optimum's shape arithmetic is gone, the head is laid out for a GEMV
    assert any(n.startswith("graph simplified: 8 Reshape pair(s) around MatMuls removed") for n in report["notes"])
    assert report["nodes"]["after"] < 0.5 * report["nodes"]["before"]

    published = onnx.load(gpt2_q4 / "onnx" / "model_q4.onnx")
    full = onnx.load(gpt2_q4 / "onnx" / "model_q4_full.onnx")
    assert {o.domain or "": o.version for o in published.opset_import}[""] == 21
    assert 10 <= published.ir_version <= 13  # onnxruntime-web 1.31 reads IR versions up to 13
    logits = next(
        [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim]
        for o in published.graph.output
        if o.name == "logits"
    )
    assert logits[1:] == [1, 1001]
    assert [d.dim_param for d in full.graph.output[0].type.tensor_type.shape.dim][1] == "sequence_length"
    ops = [n.op_type for n in published.graph.node]
    assert "Gemm" not in ops and ops.count("DequantizeLinear") == 9  # 8 body weights + the head
    assert ops.count("Shape") <= 5 and ops.count("Reshape") == 15  # was 51 and 32
    head = next(n for n in published.graph.node if n.op_type == "MatMul" and "logits" in n.output)
    head_weight = next(n for n in published.graph.node if head.input[1] in n.output)
    assert head_weight.op_type == "DequantizeLinear"
    assert [list(t.dims) for t in published.graph.initializer if t.name == head_weight.input[0]] == [[1, 64, 1001]]
    for node in published.graph.node:
        if node.op_type == "MatMul" and node.input[1].startswith("transformer."):
            producer = next(n for n in published.graph.node if node.input[1] in n.output)
            assert producer.op_type == "DequantizeLinear"
    # the tied table is stored once, int8; no float copy of it is left
    vocab_sized = [t for t in published.graph.initializer if int(np.prod(t.dims)) == 1001 * 64]
    assert [t.data_type for t in vocab_sized] == [TensorProto.INT8]
    assert json.loads(published.metadata_props[0].value)["steps"][0]["name"] == "quantize"
    assert published.metadata_props[0].key == PROVENANCE_KEY


CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"


def test_an_instruct_models_chat_template_is_published_like_its_tokenizer(capsys, tmp_path):
    """transformers saves an instruct model's chat template as chat_template.jinja beside the tokenizer files:
    the folder is copied with it (and says so), and a link out of the folder is refused as theirs are."""
    folder = tmp_path / "instruct"
    shutil.copytree(gpt2_folder(), folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    out = tmp_path / "out"
    fast = ["--gate-samples", 1, "--gate-length", 8, "--no-last-token"]
    result = run_main(capsys, "quantize", folder, out, *fast)
    assert result.returncode == 0, result.stderr
    assert (out / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert "copied chat_template.jinja" in result.stdout.splitlines()
    assert "chat_template.jinja" in json.loads((out / "quantize_report.json").read_text())["copied"]

    (folder / "chat_template.jinja").unlink()
    elsewhere = tmp_path / "elsewhere" / "template.jinja"
    elsewhere.parent.mkdir()
    elsewhere.write_text(CHAT_TEMPLATE)
    (folder / "chat_template.jinja").symlink_to(elsewhere)
    refused = run_main(capsys, "quantize", folder, tmp_path / "out2", *fast)
    assert_one_line_error(refused, "chat_template.jinja", "symbolic link out of the model folder", "--allow-outside")
    assert not (tmp_path / "out2").exists()


def test_same_source_and_options_give_the_same_bytes(gpt2_q4, tmp_path):
    quantize_folder(gpt2_folder(), tmp_path / "again", QuantizeOptions())
    for name in ("model_q4.onnx", "model_q4_full.onnx"):
        assert (tmp_path / "again" / "onnx" / name).read_bytes() == (gpt2_q4 / "onnx" / name).read_bytes()


def test_glassllm_is_a_quarter_of_fp32_and_loses_under_two_percent(glass_q4):
    """glassllm is a trained Llama-style LM; its FFN down-projection has K=341 (not a multiple of 32)."""
    source = glassllm_folder() / "onnx" / "model.onnx"
    published = glass_q4 / "onnx" / "model_q4.onnx"
    assert published.stat().st_size <= 0.25 * source.stat().st_size
    report = json.loads((glass_q4 / "quantize_report.json").read_text())
    assert any("K is not a multiple of the block size 32" in n and "(K=341)" in n for n in report["notes"])
    assert (glass_q4 / "tokenizer.json").exists()
    tokenizer = task.load_tokenizer(glass_q4)
    windows = task.text_windows(tokenizer, TEXT.read_text(), window=128)
    ref, quant = task.score_models([source, glass_q4 / "onnx" / "model_q4_full.onnx"], windows, configs=[None, FOLD])
    assert ref.tokens == quant.tokens > 2000
    assert quant.loss_increase <= 0.02 and quant.kl < 0.05 and quant.top1 > 0.85


def test_gpt2_without_past(tmp_path):
    source = gpt2_folder(past=False)
    _, results, report = quantize_folder(source, tmp_path / "q4", QuantizeOptions())
    assert all(r.comparison.passed for _, r in results)
    assert report["variants"][0]["gate"]["positions"] == 4 * 32
    # no KV cache: every step looks up the whole sequence, so the tied table keeps row lookups
    assert any("tied embedding/LM head" in n and "gather rows" in n for n in report["notes"])


def test_graph_passes_can_be_turned_off(tmp_path):
    """The ablation: --no-simplify --no-gemv-head leaves the source's shape arithmetic and a 2-D head."""
    _, results, report = quantize_folder(
        gpt2_folder(), tmp_path / "off", QuantizeOptions(simplify=False, gemv_head=False, last_token=False)
    )
    assert results[0][1].comparison.passed
    assert not any("graph simplified" in n or "[1, 64, 1001]" in n for n in report["notes"])
    model = onnx.load(tmp_path / "off" / "onnx" / "model_q4.onnx")
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Reshape") == 32 and ops.count("Shape") > 40
    assert [list(t.dims) for t in model.graph.initializer if t.name.endswith("_transposed_quantized")] == [[64, 1001]]


def test_nbits_format_keeps_the_opset_and_runs_matmulnbits(tmp_path):
    _, results, report = quantize_folder(
        gpt2_folder(), tmp_path / "nbits", QuantizeOptions(format="nbits", accuracy_level=4, last_token=False)
    )
    model = onnx.load(tmp_path / "nbits" / "onnx" / "model_q4.onnx")
    fused = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(fused) == 9 and all(n.domain == "com.microsoft" for n in fused)  # the body's 8 and the head
    assert {a.name: a.i for a in fused[0].attribute}["accuracy_level"] == 4
    bits = sorted({a.name: a.i for a in n.attribute}["bits"] for n in fused)
    assert bits == [4] * 8 + [8]  # the head 8-bit, its rows gathered by the lookup: no DequantizeLinear at all
    assert not any(n.op_type == "DequantizeLinear" for n in model.graph.node)
    assert {o.domain or "": o.version for o in model.opset_import}[""] == 18
    assert report["session_options"] == {}
    assert results[0][1].comparison.passed


def test_a_target_picks_the_format_and_a_format_it_does_not_run_is_refused(cli, tmp_path):
    assert (QuantizeOptions().format, QuantizeOptions().accuracy_level) == ("qdq", None)  # web-wasm
    assert (QuantizeOptions(target="cpu").format, QuantizeOptions(target="cpu").accuracy_level) == ("nbits", 4)
    assert QuantizeOptions(target="cpu", accuracy_level=0).accuracy_level == 0  # given: kept
    assert QuantizeOptions(format="nbits").accuracy_level is None  # a format without a target: as before
    made = cli("quantize", gpt2_folder(), tmp_path / "cpu", "--target", "cpu", "--no-last-token")
    assert made.returncode == 0, made.stderr
    model = onnx.load(tmp_path / "cpu" / "onnx" / "model_q4.onnx")
    fused = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(fused) == 9 and {a.i for n in fused for a in n.attribute if a.name == "accuracy_level"} == {4}
    report = json.loads((tmp_path / "cpu" / "quantize_report.json").read_text())
    assert (report["options"]["target"], report["options"]["format"]) == ("cpu", "nbits")
    assert report["session_options"] == {}  # native onnxruntime runs it as it is
    refused = cli("quantize", gpt2_folder(), tmp_path / "no", "--target", "cpu", "--format", "qdq")
    assert_one_line_error(refused, "--format qdq is not what --target cpu runs (nbits)")
    assert not (tmp_path / "no").exists()


def test_cpu_target_fuses_a_llama_decoders_attention_into_grouped_query_attention(tmp_path):
    """--target cpu: each layer's attention and cache one GroupQueryAttention (the web targets keep theirs: a page
    may batch left-padded prompts), judged by the LM gate's generation, its limits in the headline."""
    from onnxsmith.rules.decoder_attention import LIMITS

    source = llama_folder()
    _, results, report = quantize_folder(source, tmp_path / "cpu", QuantizeOptions(target="cpu", scheme="q8"))
    assert all(r.comparison.passed for _, r in results)
    model = onnx.load(tmp_path / "cpu" / "onnx" / "model_quantized.onnx")
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("GroupQueryAttention") == 2 and ops.count("RotaryEmbedding") == 4 and "Softmax" not in ops
    assert "2 decoder layer(s): attention and KV cache -> RotaryEmbedding + GroupQueryAttention" in report["notes"]
    assert LIMITS in report["headline"]
    _, _, web = quantize_folder(source, tmp_path / "web", QuantizeOptions(scheme="q8"))
    web_ops = [n.op_type for n in onnx.load(tmp_path / "web" / "onnx" / "model_quantized.onnx").graph.node]
    assert "GroupQueryAttention" not in web_ops and LIMITS not in web["headline"]


@pytest.mark.parametrize("head", ["q4", "keep"])
def test_head_ablations(tmp_path, head):
    _, results, report = quantize_folder(gpt2_folder(), tmp_path / head, QuantizeOptions(head=head, last_token=False))
    model = onnx.load(tmp_path / head / "onnx" / "model_q4.onnx")
    inits = {t.name: t for t in model.graph.initializer}
    if head == "keep":
        assert inits["transformer.wte.weight"].data_type == TensorProto.FLOAT
        assert any("LM head kept" in n for n in report["notes"])
    else:
        stored = inits["transformer.wte.weight_transposed_quantized"]
        assert stored.data_type == TensorProto.UINT4 and list(stored.dims) == [1, 64, 1001]  # GEMV layout
    assert results[0][1].comparison.passed


def test_cli_writes_the_folder_and_says_what_each_runtime_needs(cli, tmp_path):
    result = cli("quantize", gpt2_folder(), tmp_path / "out", "--report", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    assert "session.disable_quant_qdq=1" in result.stdout and "gate passed" in result.stdout
    assert (tmp_path / "out" / "onnx" / "model_q4.onnx").exists() and (tmp_path / "r.json").exists()


def _lm_without_weights(save_proto):
    """input_ids -> embedding -> logits through the tied head, and no other weight."""
    table = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["wte", "input_ids"], ["h"]),
            helper.make_node("Transpose", ["wte"], ["wte_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["h", "wte_t"], ["logits"]),
        ],
        "noweights",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 16])],
        [numpy_helper.from_array(table, "wte")],
    )
    return save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "noweights.onnx")


def _lm_without_head(save_proto):
    w = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("Expand", ["f", "shape"], ["x"]),
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Softmax", ["h"], ["logits"]),
        ],
        "nohead",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s", 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 16])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, 1, 32], np.int64), "shape")],
    )
    return save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "nohead.onnx")


def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, save_proto):
    empty = tmp_path / "empty_folder"
    (empty / "onnx").mkdir(parents=True)
    cases = [
        ([empty], "no onnx/model.onnx in the folder"),
        ([tmp_path / "missing"], "no such file or folder"),
        ([save_proto(mlp(), "mlp.onnx")], "not a causal language model: no 'input_ids' input"),
        ([_lm_without_weights(save_proto)], "no MatMul or Gemm with a constant 2-D weight to quantize"),
        ([_lm_without_head(save_proto)], "cannot find the LM head: output 'logits' is not computed by a MatMul"),
        ([gpt2_folder(), "--block-size", "24"], "block_size must be a power of two"),
    ]
    for i, (args, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        result = run_main(capsys, "quantize", args[0], out, *args[1:])
        assert_one_line_error(result, message)
        assert not out.exists()
        assert not list(tmp_path.glob(".onnxsmith-tmp-*"))


def test_failed_gate_exits_1_and_leaves_the_output_as_it_was(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run_main(capsys, "quantize", gpt2_folder(), out, "--max-kl", "1e-9")
    assert_one_line_error(result, "verification failed, variant not written", "mean KL(source || variant)", code=1)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_a_refused_folder_still_writes_the_report_asked_for_saying_it_was_refused(capsys, tmp_path):
    """--report is what a user decides on when the gate refuses: written (atomically, alone), saying refused."""
    out, report = tmp_path / "out", tmp_path / "r.json"
    result = run_main(capsys, "quantize", gpt2_folder(), out, "--max-kl", "1e-9", "--report", report)
    assert_one_line_error(
        result, "verification failed, variant not written", f"its measurements are in {report}", code=1
    )
    assert not out.exists()
    written = json.loads(report.read_text())
    assert next(iter(written)) == "refused" and "mean KL(source || variant)" in written["refused"]
    [refused] = written["variants"]  # the full-logits twin was never made
    assert refused["gate"]["passed"] is False and refused["gate"]["mean_kl"] > 1e-9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no staging folder left beside it


def test_eval_lm_reports_loss_kl_and_top1(capsys, gpt2_q4, tmp_path):
    source = gpt2_folder() / "onnx" / "model.onnx"
    result = run_main(
        capsys,
        "eval-lm",
        source,
        gpt2_q4 / "onnx" / "model_q4_full.onnx",
        "--text",
        TEXT,
        "--window",
        64,
        "--json",
        "--session-config",
        "session.disable_quant_qdq=1",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["session_config"] == FOLD
    scores = data["scores"]
    assert scores[0]["kl"] is None and scores[1]["kl"] > 0
    assert scores[0]["tokens"] == scores[1]["tokens"] > 1000
    assert abs(scores[1]["loss"] - scores[0]["loss"]) < 0.1 * scores[0]["loss"]
    assert 0.9 < scores[1]["top1"] <= 1


def test_eval_lm_bad_input(capsys, gpt2_q4, tmp_path, save_proto):
    lone = tmp_path / "lone"
    (lone / "onnx").mkdir(parents=True)
    (lone / "onnx" / "model.onnx").write_bytes((gpt2_folder() / "onnx" / "model.onnx").read_bytes())
    result = run_main(capsys, "eval-lm", lone / "onnx" / "model.onnx", "--text", TEXT)
    assert_one_line_error(result, "no tokenizer.json here")
    result = run_main(
        capsys,
        "eval-lm",
        gpt2_folder() / "onnx" / "model.onnx",
        gpt2_q4 / "onnx" / "model_q4.onnx",
        "--text",
        TEXT,
        "--window",
        32,
    )
    assert_one_line_error(result, "returns logits for the last position only", "model_q4.onnx")
    result = run_main(capsys, "eval-lm", gpt2_folder() / "onnx" / "model.onnx", "--text", tmp_path / "nope.txt")
    assert_one_line_error(result, "nope.txt: no such file")


def _gpt2_copy(folder: Path, edit=None) -> Path:
    """The GPT-2 fixture's model at FOLDER/onnx/model.onnx, ``edit``ed (a ModelProto changed in place)."""
    model = onnx.load(gpt2_folder() / "onnx" / "model.onnx")
    if edit is not None:
        edit(model)
    (folder / "onnx").mkdir(parents=True)
    onnx.save(model, folder / "onnx" / "model.onnx")
    return folder / "onnx" / "model.onnx"


def _wrong_value_info(model: onnx.ModelProto) -> None:
    """A value_info whose shape onnx.checker's inference contradicts (rank 5 for a rank-4 MatMul): onnxruntime
    warns and merges leniently, the checker refuses the model."""
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    model.graph.value_info.append(helper.make_tensor_value_info(matmul.output[0], TensorProto.FLOAT, [7] * 5))


def test_eval_lm_labels_same_named_models_by_their_shortest_distinct_path(capsys, tmp_path):
    """Two model.onnx in different folders get rows told apart by their folders; one onnx.checker refuses but
    onnxruntime runs (as onnxruntime-genai's builder writes them) is scored: onnxruntime judges what it runs."""
    fp32 = _gpt2_copy(tmp_path / "fp32")
    odd = _gpt2_copy(tmp_path / "odd", _wrong_value_info)
    with pytest.raises(onnx.shape_inference.InferenceError):  # the disagreement
        onnx.shape_inference.infer_shapes(onnx.load(odd), check_type=True, strict_mode=True)
    window = ["--text", TEXT, "--tokenizer", gpt2_folder(), "--window", 16, "--max-windows", 2]
    report = tmp_path / "scores.json"
    result = run_main(capsys, "eval-lm", fp32, odd, *window, "--report", report)
    assert result.returncode == 0, result.stderr
    assert "fp32/onnx/model.onnx" in result.stdout and "odd/onnx/model.onnx" in result.stdout
    data = json.loads(report.read_text())
    assert [s["model"] for s in data["scores"]] == ["fp32/onnx/model.onnx", "odd/onnx/model.onnx"]
    assert data["reference"] == "fp32/onnx/model.onnx"
    assert data["scores"][1]["kl"] < 1e-9 and data["scores"][1]["top1"] == 1  # the same weights
    # distinct names stay names
    assert task.model_labels(["a/q4.onnx", "b/fp32.onnx"]) == ["q4.onnx", "fp32.onnx"]
    assert task.model_labels(["x/q4/model.onnx", "x/fp32/model.onnx"]) == ["q4/model.onnx", "fp32/model.onnx"]


def test_eval_lm_refuses_in_one_line_a_model_onnxruntime_cannot_load(capsys, tmp_path):
    """Neither onnxruntime nor onnx.checker accepts it: refused before any work, in the checker's words."""

    def unknown_op(model: onnx.ModelProto) -> None:
        node = next(n for n in model.graph.node if n.op_type == "Tanh")
        node.op_type = "NoSuchOp"  # in the default domain: no runtime has it

    broken = _gpt2_copy(tmp_path / "broken", unknown_op)
    result = run_main(capsys, "eval-lm", gpt2_folder() / "onnx" / "model.onnx", broken, "--text", TEXT)
    assert_one_line_error(result, str(broken), "not a valid ONNX model (onnx.checker:", "NoSuchOp")


def test_quantize_is_judged_by_the_lm_gate_with_its_defaults():
    """The transform only declares its gate; the lm task's gate bounds are quantize's option defaults."""
    from onnxsmith.transforms import get_transform

    quantize = get_transform("quantize")
    assert quantize.gate_task == "lm" and quantize.gate_task_for(None, QuantizeOptions()) == "lm"
    settings = quantize.task_gate_settings(QuantizeOptions())
    defaults = (task.DEFAULT_MAX_KL, task.DEFAULT_MIN_TOP1, task.DEFAULT_MIN_GENERATION)
    assert (settings["max_kl"], settings["min_top1"], settings["min_generation"]) == defaults
    assert settings["candidate_config"] == {"session.disable_quant_qdq": "1"}
    assert quantize.task_gate_settings(QuantizeOptions(format="nbits"))["candidate_config"] is None


@pytest.mark.parametrize("fmt", ["qdq", "nbits"])
def test_weights_on_gguf_grids_pass_a_gate_only_exact_weights_pass(tmp_path, cli, fmt):
    """Weights that sit on 4-bit grids (a model dequantized from a GGUF file) are stored exactly in either format:
    with the head kept, the folder passes a gate of KL 1e-6 that rounding them to integer zero points fails."""
    folder = gpt2_on_gguf_grids(tmp_path / "gguf")
    made = cli("quantize", folder, tmp_path / fmt, "--format", fmt, "--head", "keep", "--max-kl", "0.000001")
    assert made.returncode == 0, made.stderr
    report = json.loads((tmp_path / fmt / "quantize_report.json").read_text())
    assert "8 weight(s) already on a 4-bit grid" in json.dumps(report)
    off_grid = gpt2_folder()  # the same command on weights that are not on grids: rounded, refused by the gate
    refused = cli("quantize", off_grid, tmp_path / "rounded", "--format", fmt, "--head", "keep", "--max-kl", "0.000001")
    assert_one_line_error(refused, "mean KL", code=1)
    # The grids' block offsets are quantization parameters, not weights kept fp32 (the headline tells them apart).
    model = ir.load(tmp_path / fmt / "onnx" / "model_q4.onnx")
    params = quantization_parameters(model)
    offsets = {name for name in model.graph.initializers if name.endswith("_offsets")}
    assert len(offsets) == 8 and offsets <= params
    norms = {v.name for node in model.graph if node.op_type == "LayerNormalization" for v in node.inputs[1:]}
    assert norms and not norms & params
