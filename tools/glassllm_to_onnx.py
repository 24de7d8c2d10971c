#!/usr/bin/env python
"""Export glassllm (MIT, PyPI ``glassllm==0.1.0``), a trained tiny Llama-style decoder, to ONNX.

Usage (from the repository root)::

    .venv/bin/python tools/glassllm_to_onnx.py WEIGHTS.npz TOKENIZER.json OUT_DIR

writes ``OUT_DIR/onnx/model.onnx`` (input ``input_ids`` [batch, seq], output ``logits``
[batch, seq, vocab]; TorchScript exporter, opset 17) and ``OUT_DIR/tokenizer.json``, the
package's own tokenizer rewritten for the ``tokenizers`` library, checked to give the
same ids as glassllm's on a sample. Needs torch and tokenizers (both in the dev extra).

The model code is ../shared/tools/glassllm_to_onnx.py (a port of the package's NumPy
decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, tied embedding), unchanged but
for taking the .npz path and seeding the tracing input, so the export is repeatable.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
import unicodedata
from pathlib import Path

import numpy as np

SPACE = "\u2581"
SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
_CHUNK = r"\n|\u2581*[^\u2581\n]+|\u2581+"


def export_onnx(weights: Path, out: Path) -> None:
    import torch
    import torch.nn as nn

    d = np.load(weights)
    cfg = json.loads(str(d["__config__"]))
    W = {k: torch.tensor(d[k].astype(np.float32)) for k in d.files if k != "__config__"}
    D, H, HKV, L, eps = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["n_layers"], cfg["eps"]
    dk = D // H
    i = np.arange(dk // 2)
    theta = cfg["rope_base"] ** (-2.0 * i / dk)
    ang = np.outer(np.arange(cfg["max_len"]), theta)
    COS, SIN = torch.tensor(np.cos(ang), dtype=torch.float32), torch.tensor(np.sin(ang), dtype=torch.float32)

    def rms(x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g

    def rot(x, c, s):
        xe, xo = x[..., 0::2], x[..., 1::2]
        return torch.stack([xe * c - xo * s, xe * s + xo * c], dim=-1).flatten(-2)

    class GlassLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.ParameterDict({k.replace(".", "_"): nn.Parameter(v, requires_grad=False) for k, v in W.items()})
            self.register_buffer("cos", COS)
            self.register_buffer("sin", SIN)

        def forward(self, input_ids):
            P = self.p
            b, n = input_ids.shape
            x = P["E"][input_ids]
            c, s = self.cos[:n], self.sin[:n]
            mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
            for layer in range(L):
                g = lambda name, layer=layer: P[f"blocks_{layer}_{name}"]  # noqa: E731
                h = rms(x, g("norm1_gamma"))
                q = (h @ g("attn_W_Q")).reshape(b, n, H, dk).transpose(1, 2)
                k = (h @ g("attn_W_K")).reshape(b, n, HKV, dk).transpose(1, 2)
                v = (h @ g("attn_W_V")).reshape(b, n, HKV, dk).transpose(1, 2)
                q, k = rot(q, c, s), rot(k, c, s)
                k = k.repeat_interleave(H // HKV, dim=1)
                v = v.repeat_interleave(H // HKV, dim=1)
                sc = (q @ k.transpose(-1, -2)) / math.sqrt(dk)
                sc = sc.masked_fill(mask, float("-inf"))
                a = torch.softmax(sc, -1) @ v
                x = x + a.transpose(1, 2).reshape(b, n, D) @ g("attn_W_O")
                h = rms(x, g("norm2_gamma"))
                x = x + (torch.nn.functional.silu(h @ g("ffn_W1")) * (h @ g("ffn_W3"))) @ g("ffn_W2")
            return rms(x, P["norm_f_gamma"]) @ P["E"].T

    torch.manual_seed(0)
    m = GlassLM().eval()
    ids = torch.randint(0, cfg["vocab_size"], (2, 24))
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        m,
        (ids,),
        str(out),
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
        opset_version=17,
        dynamo=False,
    )


def tokenizer_json(glass_tokenizer: Path) -> str:
    """glassllm's character BPE (NFC, spaces as U+2581, chunks that merges can't cross) as tokenizer.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    data = json.loads(glass_tokenizer.read_text(encoding="utf-8"))
    merges = [tuple(pair) for pair in data["merges"]]
    vocab_list = SPECIALS + list(data["alphabet"]) + [a + b for a, b in merges]
    vocab = {token: i for i, token in enumerate(vocab_list)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(" ", SPACE)])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(_CHUNK), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.Fuse()])
    return tok.to_str(pretty=True)


def glass_encode(glass_tokenizer: Path, text: str) -> list[int]:
    """glassllm's own encoder (tokenizer.py of the package), to check the rewrite against."""
    data = json.loads(glass_tokenizer.read_text(encoding="utf-8"))
    merges = [tuple(p) for p in data["merges"]]
    ranks = {p: r for r, p in enumerate(merges)}
    vocab = SPECIALS + list(data["alphabet"]) + [a + b for a, b in merges]
    ids = {t: i for i, t in enumerate(vocab)}
    out = []
    for chunk in re.findall(_CHUNK, unicodedata.normalize("NFC", text).replace(" ", SPACE)):
        symbols = list(chunk)
        while len(symbols) > 1:
            ranked = [(ranks[p], j) for j, p in enumerate(itertools.pairwise(symbols)) if p in ranks]
            if not ranked:
                break
            best = min(ranked)[0]
            pair = merges[best]
            merged, j = [], 0
            while j < len(symbols):
                if j + 1 < len(symbols) and (symbols[j], symbols[j + 1]) == pair:
                    merged.append(symbols[j] + symbols[j + 1])
                    j += 2
                else:
                    merged.append(symbols[j])
                    j += 1
            symbols = merged
        out += [ids.get(s, ids["<unk>"]) for s in symbols]
    return out


SAMPLE = (
    "Alice was beginning to get very tired of sitting by her sister on the bank,\n"
    "and of having nothing to do: once or twice she had peeped into the book her sister was reading, "
    "\u201cand what is the use of a book,\u201d thought Alice \u201cwithout pictures or conversations?\u201d  Zebra #42!"
)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    weights, glass_tok, out_dir = Path(argv[0]), Path(argv[1]), Path(argv[2])
    from tokenizers import Tokenizer

    text = tokenizer_json(glass_tok)
    ours = Tokenizer.from_str(text).encode(SAMPLE).ids
    theirs = glass_encode(glass_tok, SAMPLE)
    if ours != theirs:
        raise SystemExit(f"tokenizer.json disagrees with glassllm's tokenizer on the sample: {ours} vs {theirs}")
    export_onnx(weights, out_dir / "onnx" / "model.onnx")
    (out_dir / "tokenizer.json").write_text(text, encoding="utf-8")
    print(f"exported {out_dir / 'onnx' / 'model.onnx'} and {out_dir / 'tokenizer.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
