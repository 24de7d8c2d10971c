"""Language models for the quantize tests: the GPT-2 fixtures and glassllm, a real trained Llama-style LM.

glassllm (PyPI ``glassllm==0.1.0``, MIT) ships NumPy weights, not ONNX: its folder
(``onnx/model.onnx`` + ``tokenizer.json``) is exported once by tools/glassllm_to_onnx.py
into .cache/glassllm/<key>/, keyed by the script and the weights, under a lock so that
parallel test workers export it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir

from tests.conftest import FIXTURES
from tests.support.realmodels import real_model

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = ROOT / "tools" / "glassllm_to_onnx.py"
CACHE = ROOT / ".cache" / "glassllm"
TEXT = ROOT / "tools" / "fixture_text.txt"


def gpt2_folder(past: bool = True) -> Path:
    """tests/fixtures/gpt2 (with past) or gpt2_nopast: optimum-style exports of a tiny trained GPT-2."""
    return FIXTURES / ("gpt2" if past else "gpt2_nopast")


#: The language models the LM passes are tested on, by parametrize id.
LM_MODELS = ("gpt2", "gpt2_nopast", "glassllm")


def lm_folder(which: str) -> Path:
    """The folder of one of :data:`LM_MODELS`, or ``llama`` (glassllm and llama are exported on first use)."""
    folders = {"gpt2": gpt2_folder, "gpt2_nopast": lambda: gpt2_folder(past=False), "glassllm": glassllm_folder}
    return {**folders, "llama": llama_folder}[which]()


def glassllm_folder() -> Path:
    weights = real_model("glassllm_weights")
    tokenizer = real_model("glassllm_tokenizer")
    command = [sys.executable, str(EXPORTER), str(weights), str(tokenizer)]
    return _exported_once(CACHE, [EXPORTER.read_bytes(), weights.read_bytes(), tokenizer.read_bytes()], command)


def llama_folder(exporter: str = "torchscript") -> Path:
    """A tiny random-weight Llama (grouped-query attention, RoPE, RMSNorm) exported in optimum's layout by the
    TorchScript exporter or torch.export's (``dynamo``) (tools/fixtures/llama/export.py), once into
    .cache/llama/<key>/, keyed by the exporter code."""
    code = [(ROOT / "tools" / "fixtures" / name / "export.py").read_bytes() for name in ("llama", "gpt2")]
    command = [sys.executable, "-m", "tools.fixtures.llama.export"] + (["--dynamo"] if exporter == "dynamo" else [])
    return _exported_once(ROOT / ".cache" / "llama", [exporter.encode(), *code], command)


def _exported_once(cache: Path, keys: list[bytes], command: list[str]) -> Path:
    """The folder ``command OUT`` writes, made once into ``cache``/<hash of keys>/ under a lock (parallel test
    workers export it once); ``OUT`` is a temporary name renamed when the export succeeded."""
    digest = hashlib.sha256()
    for key in keys:
        digest.update(key)
    folder = cache / digest.hexdigest()[:16]
    if (folder / "onnx" / "model.onnx").exists():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "onnx" / "model.onnx").exists():
            tmp = folder.with_name(folder.name + ".part")
            done = subprocess.run([*command, str(tmp)], cwd=ROOT, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command[1:3])} failed:\n{done.stderr[-3000:]}")
            tmp.rename(folder)
    return folder


def glassllm_wheel() -> Path:
    """The glassllm wheel itself (its own tokenizer is importable from it)."""
    real_model("glassllm_weights")
    return sorted((real_model("glassllm_weights").parents[1] / "wheels").glob("glassllm-*.whl"))[-1]


def prompt_ids(folder: Path, text: str) -> list[int]:
    from onnxsmith.tasks.lm import load_tokenizer

    return load_tokenizer(folder).encode(text, add_special_tokens=False).ids


def lm_gate_feeds(model_path: Path, *, count: int = 2, length: int = 16, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Feeds for before/after checks of an LM pass: token sequences sampled from the model itself."""
    from onnxsmith.io.load import load_model
    from onnxsmith.tasks import lm

    ids = lm.sample_sequences(model_path, count=count, length=length, seed=seed)
    return [lm.lm_feeds(lm.lm_signature(load_model(model_path)), ids)]


def prefill_and_decode_feeds(
    model_path: Path, *, count: int = 2, length: int = 12, tail: int = 3, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """Feeds that exercise a decoder as generation does: a prefill from an empty cache and, for a model
    with a KV cache, a step of ``tail`` tokens on top of the cache the prefill returned.

    Sequences are sampled from the model; without a cache both feeds are full-sequence runs.
    """
    from onnxsmith.io.load import load_model
    from onnxsmith.runtime import runner
    from onnxsmith.tasks import lm

    sig = lm.lm_signature(load_model(model_path))
    ids = lm.sample_sequences(model_path, count=count, length=length, seed=seed)
    prefill = lm.lm_feeds(sig, ids[:, :-tail])
    if not sig.past:
        return [prefill, lm.lm_feeds(sig, ids)]
    outputs = runner.run(runner.open_session(model_path), prefill)
    step = {lm.IDS: ids[:, -tail:].astype(sig.ids)}
    if sig.mask is not None:
        step[lm.MASK] = np.ones((count, length), dtype=sig.mask)
    if sig.positions is not None:
        step[lm.POSITIONS] = np.tile(np.arange(length - tail, length, dtype=sig.positions), (count, 1))
    for p in sig.past:
        step[p.name] = outputs[p.name.replace("past_key_values", "present")]
    return [prefill, step]


def assert_lm_pass_preserves_outputs(source: Path, after, tmp_path: Path, **tolerances) -> None:
    """Run the source and the rewritten decoder on a prefill and (with a cache) a decode step; assert they agree."""
    from tests.support.check import assert_pass_preserves_outputs, save_ir

    after_path = save_ir(after, tmp_path / "after.onnx") if not isinstance(after, Path) else after
    for feeds in prefill_and_decode_feeds(source):  # one at a time: their shapes differ
        assert_pass_preserves_outputs(source, after_path, tmp_path, feeds=[feeds], **tolerances)


def float_tables_after_load(path, size: int, scratch) -> dict[str, list[int]]:
    """fp32 initializers of ``size`` elements that onnxruntime holds after loading ``path``, by name: their dims.

    Loaded as onnxruntime-web loads a q4 model (``session.disable_quant_qdq=1``: the
    DequantizeLinear nodes fold into fp32 tables at load), read back from the optimised model.
    """
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(Path(scratch) / f"optimized-{Path(path).stem}.onnx")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath)
    return {
        t.name: list(t.dims)
        for t in optimized.graph.initializer
        if int(np.prod(t.dims)) == size and t.data_type == onnx.TensorProto.FLOAT
    }


def on_q4_1_grid(w: np.ndarray, block: int = 32) -> np.ndarray:
    """``w`` [K, N] as a GGUF Q4_1 file holds it, dequantized: each block of ``block`` along K is
    ``m + d * q``, q in 0..15, d and m fp16 (multiplied out in fp32, as transformers' GGUF loader does)."""
    k, n = w.shape
    grouped = w.reshape(k // block, block, n).astype(np.float32)
    m = grouped.min(axis=1).astype(np.float16).astype(np.float32)
    d = ((grouped.max(axis=1) - m) / 15).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint((grouped - m[:, None]) / d[:, None]), 0, 15)
    return (m[:, None] + d[:, None] * q).reshape(k, n).astype(np.float32)


def on_q8_0_grid(w: np.ndarray, block: int = 32) -> np.ndarray:
    """``w`` [K, N] as a GGUF Q8_0 file holds it, dequantized: each block of ``block`` along K is ``d * q``, q a
    whole number in -127..127, d = absmax / 127 in fp16 (multiplied out in fp32)."""
    k, n = w.shape
    grouped = w.reshape(k // block, block, n).astype(np.float32)
    d = (np.abs(grouped).max(axis=1) / 127).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint(grouped / np.where(d == 0, 1, d)[:, None]), -127, 127)
    return (d[:, None] * q).reshape(k, n).astype(np.float32)


def gpt2_on_gguf_grids(folder: Path) -> Path:
    """The GPT-2 fixture folder on GGUF grids (:func:`on_gguf_grids`)."""
    return on_gguf_grids(gpt2_folder(), folder)


def on_gguf_grids(source: Path, folder: Path) -> Path:
    """A fixture folder copied to ``folder``, its body weights snapped to Q4_1 grids (:func:`on_q4_1_grid`),
    as a model dequantized from a GGUF file holds them; the tied table and head are left as they are."""
    import shutil

    from onnxsmith.io.load import load_model
    from onnxsmith.passes.gemm_to_matmul import GemmToMatMulPass
    from onnxsmith.passes.quantize_weights import quantizable_weights
    from onnxsmith.passes.tied_head import find_lm_head
    from tests.support.check import save_ir

    shutil.copytree(source, folder)
    model = load_model(folder / "onnx" / "model.onnx")
    GemmToMatMulPass()(model)
    for weight, _ in quantizable_weights(model, {find_lm_head(model).matmul}):
        weight.const_value = ir.tensor(on_q4_1_grid(weight.const_value.numpy()), name=weight.name)
    (folder / "onnx" / "model.onnx").unlink()
    save_ir(model, folder / "onnx" / "model.onnx")
    return folder
