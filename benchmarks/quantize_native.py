#!/usr/bin/env python
"""Decode speed of ``onnxsmith quantize`` on native onnxruntime CPU (issue 28), side by side in one run.

A decoder the size of SmolLM2-135M's vocabulary: a GPT-2 (4 layers, hidden 576, 9 heads) with a tied
``[49152, 576]`` table, random weights (a speed test only: the LM gate is run with ``--min-top1 0``,
a random model's next tokens being near ties), exported as optimum exports ``text-generation-with-past``
(tools/fixtures/gpt2/export.py), cached under .cache/benchmarks/quantize_native. Side by side:

* the fp32 source;
* ``onnxsmith quantize`` (q4, the web format ``qdq``), run natively without session options;
* ``onnxsmith quantize --format nbits`` (MatMulNBits, the head 8-bit MatMulNBits; passes/nbits_head.py);
* onnxruntime's own ``MatMulNBitsQuantizer`` (block 32, accuracy level 4), what a user would pick instead
  (it leaves the head, which reads ``Transpose(table)``, in fp32).

Each decode step feeds one token after 64 cached ones (batch 1, 2 threads); interleaved rounds of 5
steps, the median of 7 rounds per model; the ratio is the source's time over the variant's.

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/quantize_native.py [--out docs/quantize_native.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CACHE = REPO / ".cache" / "benchmarks" / "quantize_native"
PAST, ROUNDS, PER_ROUND = 64, 7, 5


def source_folder() -> Path:
    folder = CACHE / "gpt2_smollm_vocab"
    if (folder / "onnx" / "model.onnx").exists():
        return folder
    import torch
    from tools.fixtures.gpt2.export import export_gpt2
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=49152, n_positions=256, n_embd=576, n_layer=4, n_head=9, tie_word_embeddings=True, use_cache=True
    )
    config.bos_token_id = config.eos_token_id = 0
    (folder / "onnx").mkdir(parents=True, exist_ok=True)
    export_gpt2(GPT2LMHeadModel(config).eval(), folder / "onnx" / "model.onnx", use_past=True)
    config.to_json_file(folder / "config.json")
    return folder


def variants(folder: Path) -> dict[str, Path]:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    made = {"fp32 source": folder / "onnx" / "model.onnx"}
    for label, args in (("onnxsmith quantize (qdq)", []), ("onnxsmith quantize --format nbits", ["--format", "nbits"])):
        out = CACHE / ("nbits" if args else "qdq")
        command = [sys.executable, "-m", "onnxsmith", "quantize", str(folder), str(out), "--min-top1", "0", *args]
        subprocess.run(command, check=True, capture_output=True, text=True)
        made[label] = out / "onnx" / "model_q4.onnx"
    logging.getLogger().setLevel(logging.WARNING)  # onnxruntime's quantizer logs every node at INFO
    ours = CACHE / "ort_matmulnbits.onnx"
    quantizer = MatMulNBitsQuantizer(onnx.load(made["fp32 source"]), block_size=32, accuracy_level=4)
    quantizer.process()
    quantizer.model.save_model_to_file(str(ours), use_external_data_format=False)
    made["onnxruntime MatMulNBitsQuantizer"] = ours
    return made


def decode_feeds(session) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([[17]], np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, PAST + 1), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.array([[PAST]], np.int64)
        else:  # past_key_values.N.key / .value: [batch, heads, past, head_dim]
            shape = [1, i.shape[1], PAST, i.shape[3]]
            feeds[i.name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    return feeds


def time_decode(models: dict[str, Path], configs: dict[str, dict[str, str]] | None = None) -> dict[str, float]:
    """Each model's median decode step in ms, interleaved; ``configs``: session config entries by label."""
    import onnxruntime as ort

    sessions = {}
    for label, path in models.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
        for key, value in (configs or {}).get(label, {}).items():
            options.add_session_config_entry(key, value)
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feeds = decode_feeds(session)
        session.run(["logits"], feeds)
        sessions[label] = (session, feeds)
    times: dict[str, list[float]] = {label: [] for label in models}
    for _ in range(ROUNDS):
        for label, (session, feeds) in sessions.items():
            started = time.perf_counter()
            for _ in range(PER_ROUND):
                session.run(["logits"], feeds)
            times[label].append((time.perf_counter() - started) / PER_ROUND * 1000)
    return {label: float(np.median(t)) for label, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "quantize_native.json")
    args = parser.parse_args()
    import onnxruntime as ort

    models = variants(source_folder())
    ms = time_decode(models)
    base = ms["fp32 source"]
    rows = [
        {"model": label, "bytes": path.stat().st_size, "decode_ms": ms[label], "speed": base / ms[label]}
        for label, path in models.items()
    ]
    for row in rows:
        print(f"{row['model']:36s} {row['bytes'] / 2**20:7.1f} MB {row['decode_ms']:8.2f} ms {row['speed']:5.2f}x")
    args.out.write_text(
        json.dumps(
            {"onnxruntime": ort.__version__, "machine": platform.machine(), "past": PAST, "rows": rows}, indent=1
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
