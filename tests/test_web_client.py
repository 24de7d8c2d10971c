"""The Node.js client (clients/web) on onnxruntime-web's WASM backend generates the tokens Python onnxruntime does.

`make test` installs onnxruntime-web (`npm ci` in clients/web, pinned by its lock file).
Both sides run the published model with session.disable_quant_qdq=1, as a web page must.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from onnxsmith.release.lm_folder import quantize_folder
from onnxsmith.tasks.lm import greedy_generate
from onnxsmith.transforms.quantize import QuantizeOptions
from tests.support.lm_models import glassllm_folder, gpt2_folder, llama_folder, prompt_ids

CLIENT = Path(__file__).resolve().parents[1] / "clients" / "web"
FOLD = {"session.disable_quant_qdq": "1"}
NEW_TOKENS = 24


def generate_in_node(model: Path, prompt: list[int], new_tokens: int = NEW_TOKENS) -> dict:
    assert shutil.which("node"), "node is not on PATH (the web client tests need Node.js >= 18)"
    assert (CLIENT / "node_modules" / "onnxruntime-web").is_dir(), (
        "onnxruntime-web is not installed: run `make test` (or `npm ci` in clients/web)"
    )
    result = subprocess.run(
        ["node", "generate.mjs", str(model), "--ids", ",".join(map(str, prompt)), "--new-tokens", str(new_tokens)],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "which,prompt",
    [
        ("gpt2", "The keeper climbed the stairs"),  # with a KV cache, last-position logits
        (
            "glassllm",
            "Alice was beginning to get very tired of sitting by her sister",
        ),  # no cache: whole sequence per token
    ],
)
def test_node_generates_what_python_onnxruntime_generates(tmp_path, which, prompt):
    folder = gpt2_folder() if which == "gpt2" else glassllm_folder()
    quantize_folder(folder, tmp_path / "q4", QuantizeOptions(), gate_samples=2, gate_length=16)
    model = tmp_path / "q4" / "onnx" / "model_q4.onnx"
    ids = prompt_ids(folder, prompt)
    expected = greedy_generate(model, ids, NEW_TOKENS, config=FOLD)
    got = generate_in_node(model, ids)
    assert got["ids"] == expected
    assert len(got["ms"]) == NEW_TOKENS
    assert len(set(expected)) > 3  # real text, not one token repeated


def test_node_generates_through_grouped_query_attention(tmp_path):
    """quantize --attention (a web target asking for it): onnxruntime-web's WASM backend runs RotaryEmbedding and
    GroupQueryAttention, which check that attention_mask is exactly the cache plus the new tokens long (the client
    once fed one more)."""
    quantize_folder(llama_folder(), tmp_path / "q8", QuantizeOptions(scheme="q8", attention=True), gate_samples=2)
    model = tmp_path / "q8" / "onnx" / "model_quantized.onnx"
    assert b"GroupQueryAttention" in model.read_bytes()
    ids = [3, 141, 59, 26, 53, 58]
    assert generate_in_node(model, ids)["ids"] == greedy_generate(model, ids, NEW_TOKENS, config=FOLD)


@pytest.mark.parametrize("data_name", ["model_q4.onnx.data", "model_q4.onnx_data"])
def test_node_loads_a_model_whose_weights_are_in_a_data_file_beside_it(tmp_path, data_name):
    """onnxsmith's `.data` and optimum's / transformers.js's `_data` files: the same tokens as one file."""
    import onnx

    quantize_folder(gpt2_folder(), tmp_path / "q4", QuantizeOptions(), gate_samples=2, gate_length=16)
    single = tmp_path / "q4" / "onnx" / "model_q4.onnx"
    split = tmp_path / "split" / "model_q4.onnx"
    split.parent.mkdir()
    onnx.save(onnx.load(single), split, save_as_external_data=True, location=data_name)
    assert (split.parent / data_name).stat().st_size > split.stat().st_size  # the weights are in the data file
    ids = prompt_ids(gpt2_folder(), "The keeper climbed the stairs")
    assert generate_in_node(split, ids)["ids"] == greedy_generate(single, ids, NEW_TOKENS, config=FOLD)


#: A chat template as transformers (>= 4.4x) saves it: in chat_template.jinja, not in tokenizer_config.json.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def test_transformers_js_loads_the_release_and_chats_with_its_template(tmp_path):
    """The quantized GPT-2 fixture, its template only in chat_template.jinja, in transformers.js (Node.js, local
    files only): the template it applies is the folder's, and it generates what Python onnxruntime does. Without
    the template written into tokenizer_config.json, transformers.js refuses to apply one."""
    import jinja2

    from onnxsmith.tasks.lm import load_tokenizer

    source = tmp_path / "chat"
    shutil.copytree(gpt2_folder(), source)
    (source / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    out = tmp_path / "chat_q4"
    quantize_folder(source, out, QuantizeOptions(), gate_samples=2, gate_length=16)
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert "chat_template" not in json.loads((source / "tokenizer_config.json").read_text())  # source untouched
    message = "The keeper climbed the stairs"
    assert (CLIENT / "node_modules" / "@huggingface" / "transformers").is_dir(), "run `make test` (npm ci)"
    done = subprocess.run(
        ["node", "chat.mjs", str(out), "--message", message, "--new-tokens", "8"],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    text = (
        jinja2.Environment()
        .from_string(CHAT_TEMPLATE)
        .render(messages=[{"role": "user", "content": message}], add_generation_prompt=True)
    )
    assert got["text"] == text == f"user: {message}\nassistant:"
    assert got["prompt"] == load_tokenizer(out).encode(text).ids
    assert got["ids"] == greedy_generate(out / "onnx" / "model_q4.onnx", got["prompt"], 8, config=FOLD)


def test_the_webgpu_target_generates_in_a_browser_what_python_onnxruntime_generates(tmp_path):
    """--target web-webgpu (MatMulNBits: the 4-bit body and the 8-bit head) in headless Chromium on onnxruntime-web's
    WebGPU backend (SwiftShader: no GPU needed), through clients/web/webgpu.html: the tokens Python generates."""
    from tests.support.browser import run_page

    quantize_folder(gpt2_folder(), tmp_path / "webgpu", QuantizeOptions(target="web-webgpu"))
    model = tmp_path / "webgpu" / "onnx" / "model_q4.onnx"
    ids = prompt_ids(gpt2_folder(), "The keeper climbed the stairs")
    got = run_page(CLIENT, f"webgpu.html?model=model.onnx&ids={','.join(map(str, ids))}&new=8", {"model.onnx": model})
    assert "error" not in got, got["error"]
    assert got["adapter"].startswith("google")  # SwiftShader's WebGPU, not a fallback to WASM
    assert got["ids"] == greedy_generate(model, ids, 8)
    assert len(set(got["ids"])) > 3
