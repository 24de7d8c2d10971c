#!/usr/bin/env python
"""Generate the ONNX test fixtures of onnxsmith (and, on demand, the full-size ViT-L model).

Usage (from the repository root)::

    .venv/bin/python tools/make_fixtures.py                      # everything -> tests/fixtures
    .venv/bin/python tools/make_fixtures.py --out DIR            # somewhere else
    .venv/bin/python tools/make_fixtures.py --only faceage       # faceage | gpt2 (repeatable)
    .venv/bin/python tools/make_fixtures.py --vitl [CACHE_DIR]   # full-size ViT-L face-age model (not committed)
        [--exporter dynamo|torchscript] [--force]

What it makes (see tests/fixtures/README.md for the details):

* ``faceage_dynamo.onnx`` / ``faceage_torchscript.onnx``: a tiny DINOv3-ViT face-age network
  (transformers.DINOv3ViTModel backbone: 4 register tokens, 2-D RoPE, layer scale; LayerNorm ->
  Linear -> GELU neck on the CLS token; CORAL age head [B,100] and gender head [B,2]) with a planted
  *massive activation*: one residual-stream channel sits at ~1.4e5 (> fp16 max 65,504) on every
  token from block 0's output on, the way DINOv3 ViT-L's channel 757 does.  Facts about it go to
  ``faceage_info.json``.
* ``gpt2/`` and ``gpt2_nopast/``: a tiny GPT-2 LM (tied embeddings) briefly trained on
  ``tools/fixture_text.txt`` with a byte-level BPE tokenizer trained on the same text, exported the
  way optimum-onnx exports ``text-generation-with-past`` / ``text-generation`` (TorchScript exporter,
  opset 18, inputs input_ids / attention_mask / position_ids [/ past_key_values.{i}.key|value],
  outputs logits [/ present.{i}.key|value]), in the folder layout transformers.js expects.

Everything is seeded and runs single-threaded (torch.use_deterministic_algorithms), so re-running
on the same machine gives byte-identical files; their sha256 are recorded in faceage_info.json and
gpt2_info.json.  (Another CPU/BLAS may differ in the last float bits of the calibrated/trained
weights.)  The code path that builds the tiny face-age model also builds the full-size ViT-L one
(``--vitl``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures"
TEXT_PATH = Path(__file__).resolve().parent / "fixture_text.txt"
FP16_MAX = 65504.0

# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[make_fixtures] {msg}", flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def quiet():
    """Silence the exporters' chatter (warnings and progress prints)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buf_out, buf_err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
            yield


def op_counts(model) -> dict[str, int]:
    """Node counts per op type, main graph plus subgraphs (If branches)."""
    counts: collections.Counter = collections.Counter()

    def walk(graph):
        for node in graph.node:
            counts[node.op_type] += 1
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return dict(sorted(counts.items()))


def main_graph_op_counts(model) -> dict[str, int]:
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def setup_torch(threads: int | None = 1):
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    return torch


# --------------------------------------------------------------------------------------------
# 1. face-age network (DINOv3 ViT backbone + neck + CORAL age / gender heads)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FaceAgeSpec:
    name: str
    hidden: int
    heads: int
    intermediate: int
    layers: int
    neck_dim: int
    massive_channel: int  # residual channel carrying the planted massive activation
    massive_value: float  # its value (on every token) from block 0's output on
    massive_unit: int  # block-0 MLP hidden unit that writes it
    registers: int = 4
    patch: int = 16
    image: int = 224
    seed: int = 1234
    calib_images: int = 8  # random images used to calibrate LayerNorm affines and heads
    embed_gain: float = 4.0  # patch-embedding / CLS / register scale: residual stream std ~ 4
    massive_weight: float = 8000.0  # down_proj[c, k]; <= 1e4 so onnxconverter's fp16 clamp leaves it alone
    mean_age: float = 38.0
    age_std_target: float = 6.0  # years, over the calibration images

    @property
    def patches(self) -> int:
        return (self.image // self.patch) ** 2

    @property
    def tokens(self) -> int:
        return self.patches + 1 + self.registers

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


TINY = FaceAgeSpec(
    name="faceage-tiny",
    hidden=128,
    heads=2,
    intermediate=512,
    layers=4,
    neck_dim=64,
    massive_channel=57,
    massive_value=1.4e5,
    massive_unit=300,
)

VITL = FaceAgeSpec(
    name="faceage-vitl",
    hidden=1024,
    heads=16,
    intermediate=4096,
    layers=24,
    neck_dim=512,  # 1024 -> 512 neck: 303.7M parameters in all
    massive_channel=757,  # like DINOv3 ViT-L/16
    massive_value=1.5e5,
    massive_unit=2345,
    calib_images=4,
)


def dinov3_config(spec: FaceAgeSpec):
    from transformers import DINOv3ViTConfig

    return DINOv3ViTConfig(
        hidden_size=spec.hidden,
        num_attention_heads=spec.heads,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_register_tokens=spec.registers,
        patch_size=spec.patch,
        image_size=spec.image,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        rope_theta=100.0,
        query_bias=True,
        key_bias=False,
        value_bias=True,
        proj_bias=True,
        mlp_bias=True,
        layerscale_value=1.0,
        use_gated_mlp=False,
    )


def make_faceage_module(spec: FaceAgeSpec):
    """The face-age network as a torch module (weights still HF-default random)."""
    import torch
    from torch import nn
    from transformers import DINOv3ViTModel

    class FaceAgeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = DINOv3ViTModel(dinov3_config(spec))
            self.neck_norm = nn.LayerNorm(spec.hidden, eps=1e-5)
            self.neck_fc = nn.Linear(spec.hidden, spec.neck_dim)
            self.neck_act = nn.GELU()
            self.age_head = nn.Linear(spec.neck_dim, 100)
            self.gender_head = nn.Linear(spec.neck_dim, 2)

        def features(self, face: torch.Tensor) -> torch.Tensor:
            # DINOv3ViTModel applies its final LayerNorm: last_hidden_state is normed; [:, 0] is CLS.
            cls = self.backbone(pixel_values=face).last_hidden_state[:, 0]
            return self.neck_act(self.neck_fc(self.neck_norm(cls)))

        def forward(self, face: torch.Tensor):
            f = self.features(face)
            return self.age_head(f), self.gender_head(f)

    # a fixed qualified name: the dynamo exporter records it in every node's metadata
    FaceAgeNet.__module__ = "onnxsmith_fixtures"
    FaceAgeNet.__qualname__ = "FaceAgeNet"
    return FaceAgeNet()


def _randn(gen, *shape, std=1.0, mean=0.0):
    import torch

    return torch.randn(*shape, generator=gen) * std + mean


def random_faces(n: int, seed: int, size: int = 224):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g)


def natural_images(n: int = 2, seed: int = 7, size: int = 224) -> np.ndarray:
    """n deterministic 'natural-ish' images, ImageNet-normalised, float32 [n,3,size,size].

    Even indices: a cartoon face (skin-tone ellipse, hair, eyes, mouth, soft shading) on a smooth
    background, with seeded position / size / colours; odd indices: a smooth low-frequency colour
    field (bilinear-upsampled 6x6 noise) with a soft gradient.
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)

    def ellipse(cx, cy, rx, ry):
        return ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2

    def face_image():
        top, bottom = rng.uniform(0.2, 0.9, 3), rng.uniform(0.2, 0.9, 3)
        img = (top[:, None, None] * (1 - yy) + bottom[:, None, None] * yy).astype(np.float32)
        cx, cy = rng.uniform(0.42, 0.58), rng.uniform(0.45, 0.58)
        rx, ry = rng.uniform(0.22, 0.32), rng.uniform(0.3, 0.4)
        soft = np.clip(1.0 - ellipse(cx, cy, rx, ry), 0, 1) ** 0.3
        skin = rng.uniform([0.55, 0.35, 0.25], [0.95, 0.8, 0.7]).astype(np.float32)
        skin = skin[:, None, None] * (0.85 + 0.15 * (1 - yy))
        img = img * (1 - soft) + skin * soft
        hair = (ellipse(cx, cy - 0.22, rx * 1.1, 0.2) < 1) & (yy < cy - 0.2)
        img[:, hair] = rng.uniform(0.05, 0.6, 3).astype(np.float32)[:, None]
        for dx in (-0.12, 0.12):
            eye = ellipse(cx + dx * rx / 0.3, cy - 0.05, 0.05, 0.025) < 1
            img[:, eye] = np.array([0.1, 0.1, 0.12], np.float32)[:, None]
        mouth = ellipse(cx, cy + 0.2, 0.1, 0.03) < 1
        img[:, mouth] = np.array([0.65, 0.3, 0.3], np.float32)[:, None]
        return img + rng.normal(0, 0.02, img.shape).astype(np.float32)

    def field_image():
        coarse = rng.uniform(0, 1, (3, 6, 6)).astype(np.float32)
        pos = np.linspace(0, 5, size, dtype=np.float32)
        i0 = np.clip(np.floor(pos).astype(int), 0, 4)
        t = pos - i0
        rows = coarse[:, i0, :] * (1 - t)[None, :, None] + coarse[:, i0 + 1, :] * t[None, :, None]
        field = rows[:, :, i0] * (1 - t)[None, None, :] + rows[:, :, i0 + 1] * t[None, None, :]
        return 0.7 * field + 0.3 * xx[None]

    imgs = np.clip(np.stack([face_image() if i % 2 == 0 else field_image() for i in range(n)]), 0, 1)
    mean = np.array([0.485, 0.456, 0.406], np.float32)[None, :, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[None, :, None, None]
    return ((imgs - mean) / std).astype(np.float32)


def _calibrate_layernorm(ln, x, gen, massive_channel: int | None):
    """Set a LayerNorm's affine so that, on the calibration activations x [..., D], each output
    channel has mean ~beta and std ~gamma (gamma ~ 1 + noise, beta small noise).

    Needed after the massive channel appears: it dominates the LN statistics (sigma ~ |x_c| /
    sqrt(D)), so every other channel of the normalised vector is squashed by ~1e-4 and offset by
    -x_c / D / sigma.  A trained model compensates with large LN weights on the ordinary channels
    and a tiny weight on the massive one; that is what this does.
    """
    import torch

    d = x.shape[-1]
    flat = x.reshape(-1, d).double()
    mu = flat.mean(-1, keepdim=True)
    var = flat.var(-1, unbiased=False, keepdim=True)
    z = (flat - mu) / torch.sqrt(var + ln.eps)
    zm, zs = z.mean(0), z.std(0).clamp_min(1e-12)
    gamma = 1.0 + 0.1 * _randn(gen, d).double()
    beta = 0.05 * _randn(gen, d).double()
    w = gamma / zs
    b = beta - gamma * zm / zs
    if massive_channel is not None:
        w[massive_channel] = 1e-3 * gamma[massive_channel]
        b[massive_channel] = beta[massive_channel]
    # round to 6 significant digits so tiny float differences between machines rarely matter
    w = torch.tensor([float(f"{v:.6g}") for v in w.tolist()], dtype=torch.float64)
    b = torch.tensor([float(f"{v:.6g}") for v in b.tolist()], dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(w.float())
        ln.bias.copy_(b.float())


def build_faceage(spec: FaceAgeSpec, log_fn=log):
    """Build the face-age torch model deterministically (random init + planted massive activation
    + calibrated LayerNorms/heads).  Returns (model, build_facts)."""
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    t0 = time.time()
    model = make_faceage_module(spec).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    bb = model.backbone
    D = spec.hidden
    c = spec.massive_channel

    # ---- 1. random, non-trivial weights (std 1/sqrt(fan_in) so signals keep O(1) scale) ----
    with torch.no_grad():
        for _name, mod in model.named_modules():
            if isinstance(mod, (nn.Linear, nn.Conv2d)):
                fan_in = mod.weight[0].numel()
                gain = spec.embed_gain if isinstance(mod, nn.Conv2d) else 1.0
                mod.weight.copy_(_randn(gen, *mod.weight.shape, std=gain / math.sqrt(fan_in)))
                if mod.bias is not None:
                    mod.bias.copy_(_randn(gen, *mod.bias.shape, std=0.05))
            elif isinstance(mod, nn.LayerNorm):
                mod.weight.copy_(1.0 + 0.1 * _randn(gen, D))
                mod.bias.copy_(0.05 * _randn(gen, D))
        emb = bb.embeddings
        emb.cls_token.copy_(_randn(gen, *emb.cls_token.shape, std=0.5 * spec.embed_gain))
        emb.register_tokens.copy_(_randn(gen, *emb.register_tokens.shape, std=0.5 * spec.embed_gain))
        for layer in bb.model.layer:
            for ls in (layer.layer_scale1, layer.layer_scale2):
                ls.lambda1.copy_(0.1 + 0.9 * torch.rand(D, generator=gen))

        # ---- 2. plant the massive activation in block 0's MLP ----
        # hidden unit k of block 0's MLP: almost input-independent, always on (GELU(b) ~ b);
        # down_proj[c, k] * b * layer_scale2[c] = massive_value.  Every weight stays < 65,504 so a
        # fp16 conversion keeps them finite: the overflow happens in the computation.  (They are
        # even <= 1e4, onnxconverter_common's default max_finite_val, so it clamps nothing.)
        layer0 = bb.model.layer[0]
        k = spec.massive_unit
        ls2 = float(layer0.layer_scale2.lambda1[c])
        w_ck = spec.massive_weight
        unit_bias = spec.massive_value / (ls2 * w_ck)
        layer0.mlp.up_proj.weight[k].mul_(0.01)
        layer0.mlp.up_proj.bias[k] = unit_bias
        layer0.mlp.down_proj.weight[c, k] = w_ck

    # ---- 3. calibrate: one manual forward, block by block ----
    # calibration set: half N(0,1) noise, half natural-ish images (different seeds from the checks)
    n_rand = spec.calib_images - spec.calib_images // 2
    calib = torch.cat(
        [
            random_faces(n_rand, seed=spec.seed + 1, size=spec.image),
            torch.from_numpy(natural_images(spec.calib_images // 2, seed=spec.seed + 2, size=spec.image)),
        ]
    )
    facts = {"layernorm_calibrated": []}
    with torch.no_grad():
        h = bb.embeddings(calib)
        pe = bb.rope_embeddings(calib)

        def maybe_calibrate(ln, x, label):
            peak_c = float(x[..., c].abs().min())
            if peak_c > 1e4:  # massive channel present on every token
                _calibrate_layernorm(ln, x, gen, c)
                facts["layernorm_calibrated"].append(label)

        for i, layer in enumerate(bb.model.layer):
            maybe_calibrate(layer.norm1, h, f"block{i}.norm1")
            a, _ = layer.attention(layer.norm1(h), position_embeddings=pe)
            h = h + layer.layer_scale1(a)
            maybe_calibrate(layer.norm2, h, f"block{i}.norm2")
            h = h + layer.layer_scale2(layer.mlp(layer.norm2(h)))
        maybe_calibrate(bb.norm, h, "final_norm")
        cls = bb.norm(h)[:, 0]
        feat = model.neck_act(model.neck_fc(model.neck_norm(cls)))

        # ---- 4. heads: CORAL-style age head (shared direction + ordered thresholds) and gender ----
        # age = sum_k sigmoid(s + tau_k), tau_k = slope * (mean_age - k - 0.5): s = 0 gives mean_age;
        # ds = 1 moves the age by ~1/slope years.
        slope = 0.15
        direction = _randn(gen, spec.neck_dim, std=1.0 / math.sqrt(spec.neck_dim))
        s = feat @ direction
        s_scale = (spec.age_std_target * slope) / float(s.std().clamp_min(1e-6))
        direction *= s_scale
        s_mean = float((feat @ direction).mean())
        taus = torch.tensor([slope * (spec.mean_age - kk - 0.5) for kk in range(100)])
        model.age_head.weight.copy_(direction[None, :] + _randn(gen, 100, spec.neck_dim, std=0.002))
        model.age_head.bias.copy_(taus - s_mean + _randn(gen, 100, std=0.01))
        # gender: threshold at the median over the noise part of the calibration set (so noise
        # inputs split both ways; natural-ish images are a separate cluster)
        g = feat[:n_rand] @ model.gender_head.weight.T
        diff = g[:, 0] - g[:, 1]
        assert n_rand >= 2, "need >= 2 noise calibration images"
        gscale = 2.0 / float(diff.std().clamp_min(1e-6))
        model.gender_head.weight.mul_(gscale)
        gb = model.gender_head.bias
        gb[0] = 0.05 * float(_randn(gen, 1))
        gb[1] = gb[0] + float((diff * gscale).median())

    facts["build_seconds"] = round(time.time() - t0, 1)
    facts["params_total"] = sum(p.numel() for p in model.parameters())
    facts["params_without_mask_token"] = facts["params_total"] - bb.embeddings.mask_token.numel()
    facts["massive_unit_bias"] = unit_bias
    facts["massive_down_proj_weight"] = w_ck
    facts["layer_scale2_at_channel_block0"] = ls2
    log_fn(f"built {spec.name}: {facts['params_total'] / 1e6:.4f}M params in {facts['build_seconds']}s")
    return model, facts


def torch_residual_peaks(model, spec: FaceAgeSpec, x):
    """Per-block peak |x| of the residual stream (block outputs), overall and at the massive
    channel, measured in torch with forward hooks."""
    import torch

    outs = []
    hooks = [
        layer.register_forward_hook(lambda m, i, o: outs.append(o[0] if isinstance(o, tuple) else o))
        for layer in model.backbone.model.layer
    ]
    with torch.no_grad():
        model(x)
    for hk in hooks:
        hk.remove()
    c = spec.massive_channel
    return [
        {
            "peak_abs": float(o.abs().max()),
            "channel_min_abs": float(o[..., c].abs().min()),
            "channel_max_abs": float(o[..., c].abs().max()),
            "argmax_channel": int(o.abs().amax(dim=(0, 1)).argmax()),
        }
        for o in outs
    ]


def export_faceage(model, spec: FaceAgeSpec, path: Path, exporter: str) -> dict:
    """Export with torch.onnx.export; dynamo=True (opset 18) or dynamo=False (TorchScript, opset 17).
    Dynamic batch axis named 'batch'.  Single-file ONNX (no external data)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    x = random_faces(2, seed=99, size=spec.image)
    t0 = time.time()
    with quiet():
        if exporter == "dynamo":
            batch = torch.export.Dim("batch", min=1, max=1024)
            prog = torch.onnx.export(
                model,
                (x,),
                dynamo=True,
                opset_version=18,
                input_names=["face"],
                output_names=["age_logits", "gender_logits"],
                dynamic_shapes=({0: batch},),
                optimize=True,
                external_data=False,
            )
            prog.save(str(path), external_data=False)
            strip_stack_traces(path)
        elif exporter == "torchscript":
            torch.onnx.export(
                model,
                (x,),
                str(path),
                dynamo=False,
                opset_version=17,
                input_names=["face"],
                output_names=["age_logits", "gender_logits"],
                dynamic_axes={"face": {0: "batch"}, "age_logits": {0: "batch"}, "gender_logits": {0: "batch"}},
                do_constant_folding=True,
            )
        else:
            raise ValueError(exporter)
    info = {"exporter": exporter, "export_seconds": round(time.time() - t0, 1)}
    if exporter == "dynamo":
        info.update(
            torch_onnx_call="torch.onnx.export(model, (x,), dynamo=True, opset_version=18, "
            "dynamic_shapes=({0: Dim('batch')},), optimize=True) then .save(path, external_data=False)"
        )
    else:
        info.update(
            torch_onnx_call="torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, "
            "dynamic_axes={'face': {0: 'batch'}, ...}, do_constant_folding=True)"
        )
    return info


def strip_stack_traces(path: Path) -> int:
    """Drop the dynamo exporter's per-node 'pkg.torch.onnx.stack_trace' metadata: it holds absolute
    source paths and line numbers (machine-dependent bytes).  The other metadata (namespace,
    class_hierarchy, fx_node, name_scopes) is kept as exported."""
    import onnx

    m = onnx.load(str(path))
    dropped = 0

    def walk(graph):
        nonlocal dropped
        for node in graph.node:
            keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
            dropped += len(node.metadata_props) - len(keep)
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(m.graph)
    onnx.save(m, str(path))
    return dropped


def residual_tensor_names(model_proto) -> list[str]:
    """Inputs of the LayerNormalization nodes in graph order: block i's norm1 reads the residual
    stream entering block i, norm2 the stream after the attention residual add; the second-to-last
    LN (backbone final norm) reads the last block's output; the last LN is the neck's."""
    return [n.input[0] for n in model_proto.graph.node if n.op_type == "LayerNormalization"]


def onnx_residual_peaks(path: Path, spec: FaceAgeSpec, x: np.ndarray) -> dict:
    """Expose the residual stream (LayerNorm inputs) as extra graph outputs of a copy of the model
    and measure peak |x| per block with onnxruntime (fp32)."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(path))
    names = residual_tensor_names(m)
    expected = 2 * spec.layers + 2
    if len(names) != expected:
        raise RuntimeError(f"{path.name}: {len(names)} LayerNormalization nodes, expected {expected}")
    existing = {o.name for o in m.graph.output}
    for n in names:
        if n not in existing:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    vals = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"face": x})))
    c = spec.massive_channel
    res = []
    # block i output = input of block i+1's norm1 (LN index 2(i+1)); last block -> final norm (2L)
    for i in range(spec.layers):
        t = vals[names[2 * (i + 1)]]
        mid = vals[names[2 * i + 1]]
        res.append(
            {
                "block": i,
                "output_tensor": names[2 * (i + 1)],
                "peak_abs": float(np.abs(t).max()),
                "channel_min_abs": float(np.abs(t[..., c]).min()),
                "channel_max_abs": float(np.abs(t[..., c]).max()),
                "argmax_channel": int(np.abs(t).max(axis=(0, 1)).argmax()),
                "mid_block_peak_abs": float(np.abs(mid).max()),
                "tokens_over_fp16_max": int((np.abs(t).max(-1) > FP16_MAX).sum()),
            }
        )
    embed = vals[names[0]]
    return {
        "embeddings_peak_abs": float(np.abs(embed).max()),
        "blocks": res,
        "ln_input_tensors": names,
    }


def ort_session(path_or_bytes):
    import onnxruntime as ort

    src = str(path_or_bytes) if isinstance(path_or_bytes, Path) else path_or_bytes
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"])


def coral_age(logits: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).sum(-1)


def output_stats(path: Path, spec: FaceAgeSpec, n: int = 32) -> dict:
    sess = ort_session(path)
    rand = random_faces(n, seed=2024, size=spec.image).numpy()
    ages, genders, finite = [], [], True
    for i in range(0, n, 8):
        a, g = sess.run(None, {"face": rand[i : i + 8]})
        finite &= bool(np.isfinite(a).all() and np.isfinite(g).all())
        ages.append(coral_age(a))
        genders.append(g.argmax(-1))
    ages = np.concatenate(ages)
    genders = np.concatenate(genders)
    nat = natural_images(2, seed=7, size=spec.image)
    na, ng = sess.run(None, {"face": nat})
    finite &= bool(np.isfinite(na).all() and np.isfinite(ng).all())
    return {
        "random_inputs": f"{n} x N(0,1) [3,224,224], torch.Generator seed 2024 (random_faces({n}, 2024))",
        "age_mean": round(float(ages.mean()), 3),
        "age_std": round(float(ages.std()), 3),
        "age_min": round(float(ages.min()), 3),
        "age_max": round(float(ages.max()), 3),
        "gender_argmax_counts": [int((genders == 0).sum()), int((genders == 1).sum())],
        "natural_images": "natural_images(2, seed=7): [0] cartoon face, [1] smooth colour field (ImageNet-normalised)",
        "natural_ages": [round(float(v), 3) for v in coral_age(na)],
        "natural_gender_argmax": [int(v) for v in ng.argmax(-1)],
        "all_finite": finite,
    }


def ort_opt_level_diff(path: Path, spec: FaceAgeSpec) -> float:
    """Max |output| difference between onnxruntime's ORT_ENABLE_ALL (its own fusions) and
    ORT_DISABLE_ALL on the same fp32 model: the massive channel makes the LayerNorms numerically
    touchy, so this is the noise floor any variant comparison must allow."""
    import onnxruntime as ort

    x = random_faces(4, seed=2024, size=spec.image).numpy()
    outs = []
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.log_severity_level = 3
        outs.append(ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"face": x}))
    return float(max(np.abs(a - b).max() for a, b in zip(*outs)))


def naive_fp16_check(path: Path, spec: FaceAgeSpec) -> dict:
    """What a plain onnxconverter_common fp16 conversion does to the model (informational)."""
    import onnx
    import onnxconverter_common
    import onnxruntime as ort
    from onnxconverter_common import float16

    res = {
        "conversion": f"onnxconverter_common {onnxconverter_common.__version__} "
        "float16.convert_float_to_float16(model, keep_io_types=True), onnxruntime CPU"
    }
    try:
        with quiet():
            m16 = float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    except Exception as e:
        res["result"] = f"conversion raised {type(e).__name__}: {e}"
        return res
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(m16.SerializeToString(), so, providers=["CPUExecutionProvider"])
        a, g = sess.run(None, {"face": random_faces(4, seed=2024, size=spec.image).numpy()})
    except Exception as e:
        res["result"] = f"onnxruntime raised {type(e).__name__}: {str(e)[:300]}"
        return res
    res["age_logits_nan_fraction"] = float(np.isnan(a).mean())
    res["gender_logits_nan_fraction"] = float(np.isnan(g).mean())
    res["inf_count"] = int(np.isinf(a).sum() + np.isinf(g).sum())
    res["result"] = "all outputs NaN" if np.isnan(a).all() and np.isnan(g).all() else "some finite outputs"
    return res


def torch_vs_onnx(model, path: Path, spec: FaceAgeSpec) -> float:
    import torch

    x = random_faces(3, seed=5, size=spec.image)
    with torch.no_grad():
        ta, tg = model(x)
    oa, og = ort_session(path).run(None, {"face": x.numpy()})
    return float(max(np.abs(ta.numpy() - oa).max(), np.abs(tg.numpy() - og).max()))


def graph_facts(path: Path) -> dict:
    import onnx

    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    facts = {
        "opset": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "producer": f"{m.producer_name} {m.producer_version}",
        "ir_version": m.ir_version,
        "num_nodes_main_graph": len(m.graph.node),
        "op_counts_main_graph": main_graph_op_counts(m),
        "op_counts_with_subgraphs": op_counts(m),
        "num_initializers": len(m.graph.initializer),
        "inputs": {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input},
        "outputs": {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output},
    }
    # how do Cos / Sin get their angles?
    producers = {o: n for n in m.graph.node for o in n.output}
    trig = {}
    for n in m.graph.node:
        if n.op_type in ("Cos", "Sin"):
            src = n.input[0]
            if src in inits:
                shape = list(inits[src].dims)
                trig[n.op_type] = {"input": src, "from": "initializer", "shape": shape}
            elif src in producers:
                p = producers[src]
                trig[n.op_type] = {"input": src, "from": f"node {p.op_type}"}
                if p.op_type == "Constant":
                    t = onnx.numpy_helper.to_array(p.attribute[0].t)
                    trig[n.op_type]["shape"] = list(t.shape)
    facts["rope_trig_inputs"] = trig
    # largest |value| in any float initializer or Constant (onnxconverter_common's fp16 conversion
    # clamps constants to max_finite_val=1e4 by default)
    biggest = ("", 0.0)
    for t in list(m.graph.initializer) + [
        a.t for n in m.graph.node if n.op_type == "Constant" for a in n.attribute if a.t.dims or a.t.data_type
    ]:
        if t.data_type != onnx.TensorProto.FLOAT:
            continue
        arr = onnx.numpy_helper.to_array(t)
        if arr.size and float(np.abs(arr).max()) > biggest[1]:
            biggest = (t.name, float(np.abs(arr).max()))
    facts["max_abs_float_constant"] = {"name": biggest[0], "value": biggest[1]}
    return facts


def block_excerpt(path: Path, block: int = 1, max_nodes: int = 200) -> list[str]:
    """Node sequence (op_type: name) of one transformer block: from block's norm1 to the next
    norm1 (graph order)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    lns = [i for i, n in enumerate(m.graph.node) if n.op_type == "LayerNormalization"]
    start, end = lns[2 * block], lns[2 * block + 2]
    out = []
    for n in m.graph.node[start:end][:max_nodes]:
        out.append(f"{n.op_type}({', '.join(n.input)}) -> {', '.join(n.output)}")
    return out


def make_faceage(out: Path) -> dict:
    torch = setup_torch(1)
    spec = TINY
    model, build = build_faceage(spec)
    info: dict = {
        "description": "tiny DINOv3-ViT face-age network with a planted massive activation (see README.md)",
        "generator": "tools/make_fixtures.py --only faceage",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "hidden_size": spec.hidden,
        "num_layers": spec.layers,
        "num_heads": spec.heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate,
        "register_tokens": spec.registers,
        "patch_size": spec.patch,
        "image_size": spec.image,
        "patch_count": spec.patches,
        "token_count": spec.tokens,
        "token_layout": "[CLS, 4 registers, 196 patches]",
        "rope": {
            "theta": 100.0,
            "angle_table_shape": [spec.patches, spec.head_dim],
            "applied_to": "patch tokens only (q,k of tokens 5..200)",
        },
        "attn_implementation": model.backbone.config._attn_implementation,
        "hidden_act": "gelu (exact, erf)",
        "layer_norm_eps": 1e-5,
        "neck": f"LayerNorm({spec.hidden}) -> Linear({spec.hidden},{spec.neck_dim}) -> GELU on last_hidden_state[:,0] "
        "(DINOv3ViTModel's last_hidden_state is already final-normed)",
        "neck_dim": spec.neck_dim,
        "heads": {
            "age_logits": "Linear -> 100 CORAL logits; age_years = sum(sigmoid(age_logits))",
            "gender_logits": "Linear -> 2",
        },
        "input": {"name": "face", "shape": ["batch", 3, spec.image, spec.image], "dtype": "float32"},
        "outputs": {"age_logits": ["batch", 100], "gender_logits": ["batch", 2]},
        "massive_activation": {
            "channel": spec.massive_channel,
            "planted_value": spec.massive_value,
            "tokens": "all tokens (CLS, registers and patches), from block 0's output on",
            "how": f"block 0 MLP hidden unit {spec.massive_unit}: up_proj row scaled by 0.01, "
            f"up_proj.bias = {build['massive_unit_bias']:.6g} (GELU ~ identity there), "
            f"down_proj.weight[{spec.massive_channel},{spec.massive_unit}] = {build['massive_down_proj_weight']:g}, "
            f"layer_scale2[{spec.massive_channel}] = {build['layer_scale2_at_channel_block0']:.6g}; "
            "every weight is <= 1e4 (so onnxconverter_common's default clamp changes nothing) and the overflow "
            "happens in computation (down_proj MatMul output ~ planted/layer_scale2 > 65504), not in an initializer",
            "mlp_unit": spec.massive_unit,
            "layernorms_calibrated": build["layernorm_calibrated"],
            "layernorm_note": "every LN after block 0's MLP sees the massive channel; its weight is tiny "
            "(1e-3 scale) at that channel and large (~sigma/std) at the others, so the model still works in fp32",
        },
        "fp16_max": FP16_MAX,
        "params": build["params_total"],
        "params_in_onnx": build["params_without_mask_token"],
        "files": {},
    }
    x_nat = natural_images(2, seed=7, size=spec.image)
    x_rand = random_faces(2, seed=2024, size=spec.image).numpy()
    x_meas = np.concatenate([x_rand, x_nat])
    info["torch_residual_peaks"] = torch_residual_peaks(model, spec, torch.from_numpy(x_meas))
    for exporter in ("dynamo", "torchscript"):
        path = out / f"faceage_{exporter}.onnx"
        log(f"exporting {path.name}")
        ex = export_faceage(model, spec, path, exporter)
        facts = graph_facts(path)
        peaks = onnx_residual_peaks(path, spec, x_meas)
        stats = output_stats(path, spec)
        diff = torch_vs_onnx(model, path, spec)
        info["files"][path.name] = {
            **ex,
            "bytes": path.stat().st_size,
            "sha256": sha256_file(path),
            **facts,
            "residual_measured_on": "2 random N(0,1) images (random_faces(2, 2024)) + natural_images(2, seed=7), onnxruntime fp32",
            "residual": peaks,
            "residual_peak_per_block": [b["peak_abs"] for b in peaks["blocks"]],
            "outputs_check": stats,
            "max_abs_diff_vs_torch": diff,
            "max_abs_diff_ort_enable_all_vs_disable_all": ort_opt_level_diff(path, spec),
            "naive_fp16": naive_fp16_check(path, spec),
        }
        log(
            f"  {path.stat().st_size / 1e6:.2f} MB, {facts['num_nodes_main_graph']} nodes, peaks "
            f"{[round(b['peak_abs']) for b in peaks['blocks']]}, age std {stats['age_std']}, "
            f"gender {stats['gender_argmax_counts']}, |torch-onnx| {diff:.2e}"
        )
        check_faceage(info["files"][path.name], spec)
    for f in info["files"].values():  # timings vary run to run: logged, not recorded
        f.pop("export_seconds", None)
    first = info["files"]["faceage_dynamo.onnx"]
    info["residual_peak_per_block"] = first["residual_peak_per_block"]
    info["exporters"] = {name: f["exporter"] for name, f in info["files"].items()}
    (out / "faceage_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def check_faceage(f: dict, spec: FaceAgeSpec) -> None:
    s = f["outputs_check"]
    problems = []
    if not s["all_finite"]:
        problems.append("non-finite outputs")
    if s["age_std"] < 0.5:
        problems.append(f"age std {s['age_std']} < 0.5")
    if not (s["age_min"] > 0 and s["age_max"] < 100) or s["age_min"] < 2 or s["age_max"] > 98:
        problems.append("age saturated")
    if min(s["gender_argmax_counts"]) == 0:
        problems.append("gender argmax constant")
    for b in f["residual"]["blocks"]:
        if b["channel_min_abs"] <= FP16_MAX:
            problems.append(f"block {b['block']}: massive channel min |x| {b['channel_min_abs']} <= fp16 max")
        if b["argmax_channel"] != spec.massive_channel:
            problems.append(f"block {b['block']}: peak at channel {b['argmax_channel']}")
    if f["max_abs_float_constant"]["value"] > 1e4:
        problems.append(f"constant {f['max_abs_float_constant']} > 1e4 (onnxconverter would clamp it)")
    if f["max_abs_diff_vs_torch"] > 1e-2:
        problems.append(f"onnx vs torch diff {f['max_abs_diff_vs_torch']}")
    if problems:
        raise RuntimeError("face-age fixture check failed: " + "; ".join(problems))


# --------------------------------------------------------------------------------------------
# 2. tiny GPT-2 LM, exported the way optimum-onnx exports it
# --------------------------------------------------------------------------------------------

GPT2_VOCAB = 1024
GPT2_SEED = 4321
GPT2_TRAIN_STEPS = 1500
GPT2_PROMPT = "The keeper climbed the stairs"
EOT = "<|endoftext|>"


def train_tokenizer(text: str, vocab_size: int = GPT2_VOCAB):
    """Byte-level BPE like GPT-2's (ByteLevel pre-tokenizer without prefix space, ByteLevel
    decoder and post-processor), trained on the fixture text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    tok.train_from_iterator(paragraphs, trainer=trainer)
    return tok


def gpt2_config(vocab_size: int, eot_id: int):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=None,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        initializer_range=0.02,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        tie_word_embeddings=True,
        use_cache=True,
        architectures=["GPT2LMHeadModel"],
    )


def train_gpt2(tok, text: str):
    import torch
    from transformers import GPT2LMHeadModel

    eot = tok.token_to_id(EOT)
    ids = []
    for para in [p.strip() for p in text.split("\n\n") if p.strip()]:
        ids += tok.encode(para).ids + [eot]
    data = torch.tensor(ids, dtype=torch.long)
    torch.manual_seed(GPT2_SEED)
    model = GPT2LMHeadModel(gpt2_config(tok.get_vocab_size(), eot))
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "embeddings not tied"
    model.train()
    gen = torch.Generator().manual_seed(GPT2_SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))
    steps, bsz, ctx = GPT2_TRAIN_STEPS, 16, 64
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    t0 = time.time()
    losses = []
    for step in range(steps):
        starts = torch.randint(0, len(data) - ctx - 1, (bsz,), generator=gen)
        batch = torch.stack([data[s : s + ctx] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 250 == 0 or step == steps - 1:
            log(f"  gpt2 step {step:5d} loss {loss.item():.3f}")
    model.eval()
    facts = {
        "train_tokens": len(ids),
        "train_steps": steps,
        "batch": bsz,
        "context": ctx,
        "final_loss_avg_last50": round(sum(losses[-50:]) / 50, 4),
        "first_loss": round(losses[0], 4),
        "train_seconds": round(time.time() - t0, 1),
    }
    return model, facts


@contextlib.contextmanager
def optimum_style_patches():
    """What optimum-onnx's ModelPatcher does that matters here: DynamicLayer.update must not
    concatenate past keys onto a lazily created empty 1-D tensor (TorchScript would bake that
    constant); sdpa's is_causal must be a Python bool."""
    import torch
    from transformers import cache_utils

    orig_update = cache_utils.DynamicLayer.update
    orig_sdpa = torch.nn.functional.scaled_dot_product_attention

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.device = key_states.device
            self.keys, self.values = key_states, value_states
            self.is_initialized = True
        else:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        if isinstance(is_causal, torch.Tensor):
            is_causal = bool(is_causal.item())
        kw.pop("enable_gqa", None)
        return orig_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    cache_utils.DynamicLayer.update = update
    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        cache_utils.DynamicLayer.update = orig_update
        torch.nn.functional.scaled_dot_product_attention = orig_sdpa


@contextlib.contextmanager
def optimum_style_forward(model, use_past: bool):
    """Replace model.forward (an instance attribute, as optimum's ModelPatcher does) by a function
    whose positional signature is optimum's ONNX input order for GPT-2 -- ordered by the
    transformers<=4.57 GPT2LMHeadModel.forward signature: input_ids, past_key_values, ...,
    attention_mask, ..., position_ids -- so parameter and node names stay the model's own
    (transformer.wte.weight, /transformer/h.0/attn/...)."""
    from transformers import DynamicCache

    n_layer = model.config.n_layer
    orig_forward = model.forward

    def forward(input_ids, *args):
        if use_past:
            past = args[: 2 * n_layer]
            attention_mask, position_ids = args[2 * n_layer :]
            cache = DynamicCache(config=model.config)
            for i in range(n_layer):
                cache.update(past[2 * i], past[2 * i + 1], i)
        else:
            attention_mask, position_ids = args
            cache = None
        out = orig_forward(
            input_ids=input_ids,
            cache=cache,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_past,
            logits_to_keep=0,
        )
        if not use_past:
            return out.logits
        present = getattr(out, "past_key_values", None) or getattr(out, "cache", None)
        flat = []
        for i in range(n_layer):
            layer = present.layers[i]
            flat += [layer.keys, layer.values]
        return (out.logits, *flat)

    model.forward = forward
    try:
        yield model
    finally:
        del model.forward


def deduplicate_tied_lm_head(path: Path) -> dict:
    """optimum's post-processing (optimum.onnx.remove_duplicate_weights_from_tied_info ->
    _deduplicate_gather_matmul): TorchScript constant folding turns the tied lm_head's
    Transpose(wte) into a separate initializer [n_embd, vocab]; optimum removes it and inserts
    `Transpose_{len(nodes)+1}(transformer.wte.weight) -> transformer.wte.weight_transposed` before
    the MatMul that read it."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {t.name: i for i, t in enumerate(m.graph.initializer)}
    ref = "transformer.wte.weight"
    ref_arr = numpy_helper.to_array(m.graph.initializer[inits[ref]])
    users = [n for n in m.graph.node if ref in n.input]
    assert {n.op_type for n in users} == {"Gather"}, [n.op_type for n in users]
    removed = None
    for name, idx in list(inits.items()):
        t = m.graph.initializer[idx]
        if name == ref or list(t.dims) != [ref_arr.shape[1], ref_arr.shape[0]]:
            continue
        if t.data_type == m.graph.initializer[inits[ref]].data_type and np.array_equal(
            ref_arr.T, numpy_helper.to_array(t)
        ):
            out_name = f"{ref}_transposed"
            first = next(i for i, n in enumerate(m.graph.node) if name in n.input)
            node = onnx.helper.make_node(
                "Transpose", name=f"Transpose_{len(m.graph.node) + 1}", inputs=[ref], outputs=[out_name]
            )
            m.graph.node.insert(first, node)
            for n in m.graph.node:
                for j, x in enumerate(n.input):
                    if x == name:
                        n.input[j] = out_name
            m.graph.initializer.pop(idx)
            removed = {
                "removed_initializer": name,
                "shape": list(t.dims),
                "transpose_node": node.name,
                "output": out_name,
            }
            break
    if removed is None:
        raise RuntimeError("tied lm_head: no transposed duplicate of transformer.wte.weight found")
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return removed


def gpt2_io_names(n_layer: int, use_past: bool):
    if use_past:
        past = [f"past_key_values.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]
        present = [f"present.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]
        inputs = ["input_ids", *past, "attention_mask", "position_ids"]
        outputs = ["logits", *present]
        axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}}
        for n in past:
            axes[n] = {0: "batch_size", 2: "past_sequence_length"}
        axes["attention_mask"] = {0: "batch_size", 1: "past_sequence_length + sequence_length"}
        axes["position_ids"] = {0: "batch_size", 1: "sequence_length"}
        axes["logits"] = {0: "batch_size", 1: "sequence_length"}
        for n in present:
            axes[n] = {0: "batch_size", 2: "past_sequence_length + sequence_length"}
    else:
        inputs = ["input_ids", "attention_mask", "position_ids"]
        outputs = ["logits"]
        axes = {n: {0: "batch_size", 1: "sequence_length"} for n in inputs + outputs}
    return inputs, outputs, axes


def export_gpt2(model, path: Path, use_past: bool) -> dict:
    """torch.onnx.export(dynamo=False, opset 18, do_constant_folding=True) with optimum-onnx's
    dummy shapes (batch 2, sequence 16, past 16) and dynamic axes."""
    import torch

    cfg = model.config
    n_layer, n_head, hd = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head
    gen = torch.Generator().manual_seed(0)
    b, s, p = 2, 16, 16
    input_ids = torch.randint(0, cfg.vocab_size, (b, s), generator=gen)
    if use_past:
        past = [torch.rand(b, n_head, p, hd, generator=gen) for _ in range(2 * n_layer)]
        attention_mask = torch.ones(b, p + s, dtype=torch.int64)
        position_ids = torch.arange(p, p + s).unsqueeze(0).expand(b, s).contiguous()
        args = (input_ids, *past, attention_mask, position_ids)
    else:
        attention_mask = torch.ones(b, s, dtype=torch.int64)
        position_ids = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
        args = (input_ids, attention_mask, position_ids)
    inputs, outputs, axes = gpt2_io_names(n_layer, use_past)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    with quiet(), optimum_style_patches(), optimum_style_forward(model, use_past) as patched, torch.no_grad():
        torch.onnx.export(
            patched,
            args,
            str(path),
            dynamo=False,
            opset_version=18,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            do_constant_folding=True,
        )
    dedup = deduplicate_tied_lm_head(path)
    return {
        "inputs": inputs,
        "outputs": outputs,
        "dynamic_axes": {k: {str(a): n for a, n in v.items()} for k, v in axes.items()},
        "tied_weight_deduplication": dedup,
    }


def _np_inputs(n_layer, n_head, hd, ids, mask, pos, past=None):
    feed = {
        "input_ids": ids.astype(np.int64),
        "attention_mask": mask.astype(np.int64),
        "position_ids": pos.astype(np.int64),
    }
    if past is not None:
        for i in range(n_layer):
            feed[f"past_key_values.{i}.key"] = past[2 * i]
            feed[f"past_key_values.{i}.value"] = past[2 * i + 1]
    return feed


def verify_gpt2(model, past_path: Path, nopast_path: Path, tok) -> dict:
    import torch

    cfg = model.config
    n_layer, n_head, hd = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head
    s_past, s_nopast = ort_session(past_path), ort_session(nopast_path)
    paragraphs = [p.strip() for p in TEXT_PATH.read_text().split("\n\n") if p.strip()]
    # one sentence the model has seen, and one it has not
    seen = tok.encode(paragraphs[2]).ids[:24]
    unseen = tok.encode("Mara and the sailors painted the small boat red, and the baker sang about the stars.").ids
    unseen = (unseen * 3)[:24]
    seqs = [seen, unseen]
    ids = np.array(seqs, dtype=np.int64)
    B, T = ids.shape
    mask = np.ones((B, T), np.int64)
    pos = np.tile(np.arange(T), (B, 1))
    with torch.no_grad():
        ref = model(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            position_ids=torch.from_numpy(pos),
            use_cache=False,
        ).logits.numpy()
    (nopast_logits,) = s_nopast.run(None, _np_inputs(n_layer, n_head, hd, ids, mask, pos))
    diff_nopast = float(np.abs(nopast_logits - ref).max())
    # with-past model, full prompt with an empty past (past_sequence_length 0)
    empty = [np.zeros((B, n_head, 0, hd), np.float32) for _ in range(2 * n_layer)]
    out = s_past.run(None, _np_inputs(n_layer, n_head, hd, ids, mask, pos, empty))
    diff_past_full = float(np.abs(out[0] - ref).max())
    # with-past model step by step: 5 tokens with empty past, then one token at a time
    out = s_past.run(None, _np_inputs(n_layer, n_head, hd, ids[:, :5], mask[:, :5], pos[:, :5], empty))
    step_logits = [out[0]]
    past = out[1:]
    for t in range(5, T):
        out = s_past.run(
            None, _np_inputs(n_layer, n_head, hd, ids[:, t : t + 1], mask[:, : t + 1], pos[:, t : t + 1], past)
        )
        step_logits.append(out[0])
        past = out[1:]
    stepped = np.concatenate(step_logits, axis=1)
    diff_steps = float(np.abs(stepped - nopast_logits).max())
    # one token at a time from the very first token (past 0 -> 1 -> ...)
    out = s_past.run(None, _np_inputs(n_layer, n_head, hd, ids[:, :1], mask[:, :1], pos[:, :1], empty))
    one = [out[0]]
    past = out[1:]
    for t in range(1, T):
        out = s_past.run(
            None, _np_inputs(n_layer, n_head, hd, ids[:, t : t + 1], mask[:, : t + 1], pos[:, t : t + 1], past)
        )
        one.append(out[0])
        past = out[1:]
    diff_one = float(np.abs(np.concatenate(one, axis=1) - nopast_logits).max())
    # left-padded batch (transformers.js pads on the left for batched generation)
    pad_ids = ids.copy()
    pad_mask = mask.copy()
    pad_ids[1, :3] = tok.token_to_id(EOT)
    pad_mask[1, :3] = 0
    pad_pos = np.clip(np.cumsum(pad_mask, -1) - 1, 0, None)
    with torch.no_grad():
        ref_pad = model(
            input_ids=torch.from_numpy(pad_ids),
            attention_mask=torch.from_numpy(pad_mask),
            position_ids=torch.from_numpy(pad_pos),
            use_cache=False,
        ).logits.numpy()
    (o_pad,) = s_nopast.run(None, _np_inputs(n_layer, n_head, hd, pad_ids, pad_mask, pad_pos))
    diff_pad = float(np.abs(o_pad[pad_mask.astype(bool)] - ref_pad[pad_mask.astype(bool)]).max())

    greedy = greedy_generate(s_past, tok, n_layer, n_head, hd, GPT2_PROMPT, 40)
    res = {
        "max_abs_logits_diff_onnx_nopast_vs_torch": diff_nopast,
        "max_abs_logits_diff_onnx_past_empty_vs_torch": diff_past_full,
        "max_abs_logits_diff_past_prefill5_then_steps_vs_nopast": diff_steps,
        "max_abs_logits_diff_past_token_by_token_vs_nopast": diff_one,
        "max_abs_logits_diff_left_padded_nopast_vs_torch": diff_pad,
        "verify_sequences": seqs,
        "greedy_prompt": GPT2_PROMPT,
        "greedy_40_ids": greedy["ids"],
        "greedy_40_text": greedy["text"],
    }
    bad = {k: v for k, v in res.items() if k.startswith("max_abs") and not v < 1e-4}
    if bad:
        raise RuntimeError(f"gpt2 fixture verification failed: {bad}")
    return res


def greedy_generate(sess, tok, n_layer, n_head, hd, prompt: str, n_new: int) -> dict:
    ids = np.array([tok.encode(prompt).ids], np.int64)
    past = [np.zeros((1, n_head, 0, hd), np.float32) for _ in range(2 * n_layer)]
    mask = np.ones((1, ids.shape[1]), np.int64)
    pos = np.arange(ids.shape[1])[None]
    cur = ids
    new = []
    for _ in range(n_new):
        out = sess.run(None, _np_inputs(n_layer, n_head, hd, cur, mask, pos, past))
        nxt = int(out[0][0, -1].argmax())
        new.append(nxt)
        past = out[1:]
        cur = np.array([[nxt]], np.int64)
        pos = np.array([[pos[0, -1] + 1]], np.int64)
        mask = np.ones((1, mask.shape[1] + 1), np.int64)
    return {"ids": new, "text": tok.decode(new)}


def write_hf_files(folder: Path, model, tok) -> list[str]:
    """config.json, generation_config.json, tokenizer.json, tokenizer_config.json (the folder
    layout transformers.js reads next to onnx/model.onnx)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        cfg = json.loads((Path(tmp) / "config.json").read_text())
        gen = json.loads((Path(tmp) / "generation_config.json").read_text())
    cfg.pop("transformers_version", None)
    cfg["transformers_version"] = __import__("transformers").__version__
    cfg.pop("dtype", None)
    cfg["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    tok.save(str(folder / "tokenizer.json"), pretty=True)
    tok_cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model.config.n_positions,
        "tokenizer_class": "GPT2Tokenizer",
        "added_tokens_decoder": {
            str(tok.token_to_id(EOT)): {
                "content": EOT,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
        },
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    return ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]


def gpt2_graph_facts(path: Path) -> dict:
    import onnx

    m = onnx.load(str(path))
    inits = {i.name: list(i.dims) for i in m.graph.initializer}
    producers = {o: n for n in m.graph.node for o in n.output}
    facts = {
        "opset": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "num_nodes": len(m.graph.node),
        "op_counts": main_graph_op_counts(m),
        "initializers": len(inits),
        "params_in_initializers": int(sum(np.prod(d) for d in inits.values())),
        "inputs": {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input},
        "outputs": {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output},
    }
    # the LM head: MatMul producing logits
    logits_node = producers.get("logits")
    head = {"logits_producer": logits_node.op_type if logits_node else None}
    if logits_node is not None and logits_node.op_type == "MatMul":
        rhs = logits_node.input[1]
        if rhs in inits:
            head["rhs"] = {"initializer": rhs, "shape": inits[rhs]}
        elif rhs in producers:
            p = producers[rhs]
            head["rhs"] = {"node": p.op_type, "reads": list(p.input), "reads_shapes": [inits.get(x) for x in p.input]}
    facts["lm_head"] = head
    gather = [n for n in m.graph.node if n.op_type == "Gather" and n.input[0] in inits and len(inits[n.input[0]]) == 2]
    facts["embedding_gathers"] = {n.input[0]: inits[n.input[0]] for n in gather}
    return facts


def make_gpt2(out: Path) -> dict:
    torch = setup_torch(1)
    text = TEXT_PATH.read_text()
    tok = train_tokenizer(text)
    log(f"tokenizer: vocab {tok.get_vocab_size()}")
    model, train = train_gpt2(tok, text)
    log(f"  trained in {train.pop('train_seconds')}s")  # timings vary run to run: logged, not recorded
    info = {
        "description": "tiny GPT-2 LM (tied embeddings), optimum-onnx-style export; see README.md",
        "generator": "tools/make_fixtures.py --only gpt2",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "optimum_used": False,
        "why_not_optimum": "optimum-onnx 0.1.0 (latest on PyPI) pins transformers<4.58; the export is mimicked: "
        "torch.onnx.export(dynamo=False, opset_version=18, do_constant_folding=True), optimum's input order, "
        "names, dynamic axes and dummy shapes (batch 2, seq 16, past 16), and its DynamicLayer.update/sdpa patches",
        "config": {
            k: getattr(model.config, k)
            for k in (
                "vocab_size",
                "n_positions",
                "n_embd",
                "n_layer",
                "n_head",
                "activation_function",
                "bos_token_id",
                "eos_token_id",
                "tie_word_embeddings",
            )
        },
        "attn_implementation": model.config._attn_implementation,
        "tokenizer": {
            "type": "byte-level BPE (tokenizers)",
            "vocab_size": tok.get_vocab_size(),
            "special": {EOT: tok.token_to_id(EOT)},
            "trained_on": "tools/fixture_text.txt",
        },
        "training": train,
        "params": sum(p.numel() for p in model.parameters()),
        "folders": {},
    }
    for folder, use_past in (("gpt2", True), ("gpt2_nopast", False)):
        d = out / folder
        files = write_hf_files(d, model, tok)
        onnx_path = d / "onnx" / "model.onnx"
        log(f"exporting {folder}/onnx/model.onnx (use_past={use_past})")
        io_info = export_gpt2(model, onnx_path, use_past)
        info["folders"][folder] = {
            "use_past": use_past,
            "files": files + ["onnx/model.onnx"],
            "onnx_bytes": onnx_path.stat().st_size,
            "onnx_sha256": sha256_file(onnx_path),
            **io_info,
            **gpt2_graph_facts(onnx_path),
        }
    info["verification"] = verify_gpt2(
        model, out / "gpt2" / "onnx" / "model.onnx", out / "gpt2_nopast" / "onnx" / "model.onnx", tok
    )
    log(f"  verified: {json.dumps({k: v for k, v in info['verification'].items() if k.startswith('max')})}")
    log(f"  greedy: {GPT2_PROMPT!r} -> {info['verification']['greedy_40_text']!r}")
    (out / "gpt2_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


# --------------------------------------------------------------------------------------------
# 3. full-size ViT-L face-age model (not committed; built on demand into a cache folder)
# --------------------------------------------------------------------------------------------

DEFAULT_VITL_CACHE = Path(os.environ.get("ONNXSMITH_VITL_CACHE", Path.home() / ".cache" / "onnxsmith" / "vitl"))


def vitl_recipe(exporter: str) -> dict:
    """Everything that determines the built file; a cached build is reused only if it matches."""
    import torch
    import transformers

    return {
        "spec": dataclasses.asdict(VITL),
        "exporter": exporter,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "generator_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }


def make_vitl(cache_dir: Path, exporter: str = "dynamo", force: bool = False, stats_images: int = 8) -> dict:
    """Build the full ViT-L/16 face-age model (24 layers, hidden 1024, 16 heads, MLP 4096, 4
    registers, 303.7M parameters, channel 757 at ~1.5e5 from block 0 on) into cache_dir as a
    single-file ONNX (~1.2 GB < 2 GB protobuf limit).  Idempotent: if cache_dir holds the file and
    its manifest records the same recipe and the file's sha256, nothing is rebuilt."""
    import torch

    cache_dir = Path(cache_dir).expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"faceage_vitl_{exporter}.onnx"
    manifest_path = cache_dir / f"faceage_vitl_{exporter}.json"
    recipe = vitl_recipe(exporter)
    if path.exists() and manifest_path.exists() and not force:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("recipe") == recipe:
            t0 = time.time()
            if sha256_file(path) == manifest.get("sha256"):
                log(f"{path} is up to date (sha256 checked in {time.time() - t0:.1f}s); not rebuilding")
                manifest["reused"] = True
                return manifest
            log(f"{path}: sha256 differs from the manifest; rebuilding")
        else:
            log(f"{path}: recipe changed; rebuilding")
    t_start = time.time()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    torch.use_deterministic_algorithms(True)
    spec = VITL
    model, build = build_faceage(spec)
    tmp = path.with_suffix(".onnx.tmp")
    log(f"exporting {path.name} ({exporter})")
    ex = export_faceage(model, spec, tmp, exporter)
    log(f"  exported in {ex['export_seconds']}s, {tmp.stat().st_size / 1e9:.3f} GB")
    x_meas = np.concatenate(
        [random_faces(1, seed=2024, size=spec.image).numpy(), natural_images(1, seed=7, size=spec.image)]
    )
    t0 = time.time()
    peaks = onnx_residual_peaks(tmp, spec, x_meas)
    log(
        f"  residual peaks per block (ORT fp32): {[round(b['peak_abs']) for b in peaks['blocks']]} ({time.time() - t0:.0f}s)"
    )
    t0 = time.time()
    stats = output_stats(tmp, spec, n=stats_images)
    log(
        f"  outputs: age std {stats['age_std']} over {stats_images} noise images, gender {stats['gender_argmax_counts']}, "
        f"natural ages {stats['natural_ages']} ({time.time() - t0:.0f}s)"
    )
    facts = graph_facts(tmp)
    del model
    os.replace(tmp, path)
    manifest = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
        "single_file": True,
        "external_data": False,
        "recipe": recipe,
        "params": build["params_total"],
        "params_in_onnx": build["params_without_mask_token"],
        "massive_activation": {
            "channel": spec.massive_channel,
            "planted_value": spec.massive_value,
            "layernorms_calibrated": len(build["layernorm_calibrated"]),
        },
        **ex,
        **facts,
        "residual": peaks,
        "residual_peak_per_block": [b["peak_abs"] for b in peaks["blocks"]],
        "outputs_check": stats,
        "build_seconds_total": round(time.time() - t_start, 1),
        "reused": False,
    }
    check_faceage({**manifest, "max_abs_diff_vs_torch": 0.0}, spec)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    log(
        f"built {path} in {manifest['build_seconds_total']}s ({manifest['bytes'] / 1e9:.3f} GB, "
        f"{manifest['params'] / 1e6:.2f}M params)"
    )
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", action="append", choices=["faceage", "gpt2"])
    ap.add_argument(
        "--vitl",
        nargs="?",
        const=str(DEFAULT_VITL_CACHE),
        metavar="CACHE_DIR",
        help=f"build the full-size ViT-L face-age model into CACHE_DIR (default {DEFAULT_VITL_CACHE}, "
        "or $ONNXSMITH_VITL_CACHE) instead of the fixtures",
    )
    ap.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo", help="for --vitl")
    ap.add_argument("--force", action="store_true", help="for --vitl: rebuild even if the cached file matches")
    args = ap.parse_args(argv)
    if args.vitl:
        m = make_vitl(Path(args.vitl), args.exporter, args.force)
        print(
            json.dumps(
                {
                    k: m[k]
                    for k in (
                        "file",
                        "bytes",
                        "sha256",
                        "params",
                        "residual_peak_per_block",
                        "build_seconds_total",
                        "reused",
                    )
                    if k in m
                },
                indent=2,
            )
        )
        return 0
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only or ["faceage", "gpt2"])
    if "faceage" in only:
        make_faceage(out)
    if "gpt2" in only:
        make_gpt2(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
