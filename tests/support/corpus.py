"""Run onnxsmith's commands on one corpus model as a new user would, and say what came of each.

Shared by the conformance test (tests/corpus) and benchmark (benchmarks/conformance.py). Only the
command line is used (in this process, or in a child process for the models over 1 GB), so this
survives any reorganisation of the package behind it. No ``--shape``, no options: the defaults a
user gets are what is recorded.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The commands of the corpus, in the order they run (validate judges a variant made before it).
COMMANDS = ("inspect", "fp16", "fuse-fp32", "fuse-fp16", "shrink", "int8", "validate")
TRANSFORMS = {
    "fp16": ["fp16"],
    "fuse-fp32": ["fuse", "--precision", "fp32"],
    "fuse-fp16": ["fuse", "--precision", "fp16"],
    "shrink": ["shrink"],
    "int8": ["int8"],
}
# issue 11's acceptance: fp16 >= 0.999 storage-faithful cosine and <= 0.6x the source where fp32
# weights are >= 80 % of it; fuse fp32 and shrink >= 0.99999 and at most 1 % larger than the source.
# int8 (issue 14): its own gate (cosine >= 0.995), and never larger than the source.
ACCEPT_COSINE = {"fp16": 0.999, "fuse-fp16": 0.999, "fuse-fp32": 0.99999, "shrink": 0.99999, "int8": 0.995}
ACCEPT_SIZE = {"fuse-fp32": 1.01, "shrink": 1.01, "int8": 1.01}
FP16_SIZE, FP16_WHEN_FP32_SHARE = 0.6, 0.8
# The variants validate judges, those of these that were written (else the source against itself).
VALIDATE_AGAINST = ("fp16", "fuse-fp32", "fuse-fp16", "shrink", "int8")


@dataclass
class Observed:
    """What one command did: ``kind`` is ok | variant | refused | traceback."""

    command: str
    kind: str
    code: int
    message: str = ""  # refusal: the first line of the error; traceback: its last line
    cosine: float | None = None  # variant: the command's own verification, min over float outputs
    size_ratio: float | None = None  # variant: bytes (with external data) / the source's
    seconds: float = 0.0
    against: str = ""  # validate: the variants it judged (comma-separated), or "source"
    output: str = ""  # variant path
    stderr: list[str] = field(default_factory=list)  # the last lines, for the findings

    def to_json(self) -> dict:
        return asdict(self)


def model_bytes(path: Path) -> int:
    """A model's size with the data files it keeps weights in (the files next to it named <model>*.data)."""
    path = Path(path)
    return path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + "*.data"))


def fp32_share(inspect: Observed, source: Path) -> float:
    """The share of the source's bytes that are fp32 weights, from ``inspect --json``."""
    if inspect.kind != "ok":
        return 0.0
    return json.loads(inspect.message).get("FLOAT", 0) / model_bytes(source)


def accepted(command: str, cosine: float | None, size_ratio: float | None, share: float) -> str:
    """Why a variant falls short of issue 11's acceptance ('' when it does not); cosine None: no float output."""
    if cosine is not None and not cosine >= ACCEPT_COSINE[command]:
        return f"cosine {cosine:.6f} < {ACCEPT_COSINE[command]}"
    limit = ACCEPT_SIZE.get(command)
    if command == "fp16" and share >= FP16_WHEN_FP32_SHARE:
        limit = FP16_SIZE
    if limit is not None and size_ratio > limit:
        return f"size {size_ratio:.2f}x > {limit}x"
    return ""


def cli(args: list[str], isolated: bool = False) -> tuple[int, str, str]:
    """``onnxsmith ARGS``: (exit code, stdout, stderr); an escaping exception is a traceback on stderr."""
    if isolated:
        done = subprocess.run([sys.executable, "-m", "onnxsmith", *args], capture_output=True, text=True, timeout=1800)
        return done.returncode, done.stdout, done.stderr
    from onnxsmith.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse
            code = exit_.code if isinstance(exit_.code, int) else 2
        except Exception:
            traceback.print_exc()
            code = 1
    return code, stdout.getvalue(), stderr.getvalue()


def make_feeds(feeds: dict, folder: Path, sets: int = 3, seed: int = 0) -> Path:
    """Plausible inputs (a manifest entry's ``feeds``) as ``sets`` seeded .npz files in ``folder``."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(sets):
        arrays = {name: _feed(feed, rng) for name, feed in feeds.items()}
        np.savez(folder / f"inputs{k}.npz", **arrays)
    return folder


def plausible_feeds(feeds: dict, seed: int = 0) -> dict:
    """One set of a manifest entry's plausible inputs, as arrays."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {name: _feed(feed, rng) for name, feed in feeds.items()}


def _feed(feed, rng):
    import numpy as np

    if feed.kind == "uniform":
        return rng.uniform(feed.low, feed.high, feed.shape).astype(feed.dtype)
    if feed.kind == "int":
        return rng.integers(int(feed.low), int(feed.high), feed.shape).astype(feed.dtype)
    if feed.kind == "zeros":
        return np.zeros(feed.shape, feed.dtype)
    if feed.kind == "ones":
        return np.ones(feed.shape, feed.dtype)
    if feed.kind == "text":
        return _text_page(feed, rng)
    if feed.kind == "photo":
        return _photo(feed, rng)
    if feed.kind == "mel":
        return _mel(feed, rng)
    return np.full(feed.shape, feed.low, feed.dtype)


def _mel(feed, rng):
    """HiFi-GAN's log-mel frames of a voiced tone (a gliding 90-250 Hz fundamental, harmonics falling as 1/k,
    about 4 syllables a second)."""
    import numpy as np

    from onnxsmith.runtime.spectrogram import HOP, RATE, log_mel

    _, bands, frames = feed.shape
    t = np.arange(frames * HOP) / RATE
    out = np.empty(feed.shape, feed.dtype)
    for row in out:
        f0 = rng.uniform(90, 250) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
        phase = 2 * np.pi * np.cumsum(f0) / RATE
        tone = sum(np.sin(k * phase) / k for k in range(1, int(4000 / f0.max()) + 1))
        envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, np.pi)), 0, None)
        row[:] = log_mel(0.1 * tone * envelope + rng.normal(0, 0.002, t.size), bands)[:, :frames]
    return out


_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}  # PIL's mode for an image input's channel count
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_LINE_IMAGE = 96  # lower than this, a text image is one line (a recogniser's crop), not a page


def _layout(shape) -> tuple[int, int, int, int, bool]:
    """(batch, channels, height, width, nhwc) of an image input: NCHW when shape[1] is 1..4, else NHWC."""
    if len(shape) != 4:
        raise ValueError(f"an image feed is 4-D, not {shape}")
    if 1 <= shape[1] <= 4:
        (batch, channels, height, width), nhwc = shape, False
    else:
        (batch, height, width, channels), nhwc = shape, True
    if channels not in _MODES:
        raise ValueError(f"an image feed has 1..4 channels, not {shape}")
    return batch, channels, height, width, nhwc


def _pixels(images: list, feed, nhwc: bool):
    """PIL images (one per batch element) as the feed's tensor: 0..255 mapped linearly onto [low, high]."""
    import numpy as np

    # float32 arithmetic, as the text pages were always made (their values are recorded in tests/corpus)
    stack = np.stack([np.asarray(image, np.float32).reshape(image.height, image.width, -1) for image in images])
    values = (stack if nhwc else stack.transpose(0, 3, 1, 2)) / 255 * (feed.high - feed.low) + feed.low
    if np.issubdtype(np.dtype(feed.dtype), np.integer):
        values = np.rint(values)
    return values.astype(feed.dtype)


def _text_page(feed, rng):
    """Rendered text (see :class:`Feed`): a page of lines of random words, or one line, per batch element."""
    from PIL import Image, ImageDraw, ImageFont

    batch, channels, height, width, nhwc = _layout(feed.shape)
    pages = []
    for _ in range(batch):
        paper, ink = rng.integers(170, 256, 3), rng.integers(0, 90, 3)
        page = Image.new("RGB", (width, height), tuple(int(v) for v in paper))
        draw = ImageDraw.Draw(page)
        fill = tuple(int(v) for v in ink)
        if height < _LINE_IMAGE:
            _text_line(draw, rng, width, height, fill)
        else:
            y = int(rng.integers(2, 12))
            while y < height - 16:
                size = int(rng.integers(14, 32))
                font = ImageFont.load_default(size=size)
                text = _words(rng)  # before the place: the pages' draws, and so the recorded pages, as they were
                draw.text((int(rng.integers(0, width // 4)), y), text, fill=fill, font=font)
                y += size + int(rng.integers(6, 24))
        pages.append(page.convert(_MODES[channels]))
    return _pixels(pages, feed, nhwc)


def _words(rng) -> str:
    return " ".join(
        "".join(rng.choice(list(_LETTERS), int(rng.integers(2, 9)))) for _ in range(int(rng.integers(1, 5)))
    )


def _text_line(draw, rng, width: int, height: int, fill) -> None:
    """One line of text as a recogniser is fed it: glyphs 50..80 % of the height, cut to fit the width."""
    from PIL import ImageFont

    size = int(rng.integers(height // 2, height * 4 // 5 + 1))
    font = ImageFont.load_default(size=size)
    x = int(rng.integers(0, max(1, width // 10)))
    y = (height - size) // 2 + int(rng.integers(-(height - size) // 4, (height - size) // 4 + 1))
    text = _words(rng)
    while len(text) > 1 and draw.textlength(text, font=font) > width - x:
        text = text[:-1].rstrip()
    draw.text((x, y), text, fill=fill, font=font)


@functools.cache
def _photos() -> tuple:
    """The real photos of the "photo" feeds (realmodels.PHOTOS), as RGB images, fetched once."""
    from PIL import Image

    from tests.support.realmodels import PHOTOS, real_model

    photos = []
    for name in PHOTOS:
        with Image.open(real_model(name)) as image:
            photos.append(image.convert("RGB"))
    return tuple(photos)


def _photo(feed, rng):
    """A seeded crop of a real photo per batch element (see :class:`Feed`): a random photo, a crop of the
    input's aspect ratio 40..100 % as wide as the largest that fits, at a random place, mirrored half the
    time, resized to the input's height and width."""
    from PIL import Image

    batch, channels, height, width, nhwc = _layout(feed.shape)
    photos = _photos()
    crops = []
    for _ in range(batch):
        photo = photos[int(rng.integers(len(photos)))]
        widest = min(photo.width, photo.height * width / height)
        scale = rng.uniform(0.4, 1.0)
        crop_w = min(photo.width, max(1, round(widest * scale)))
        crop_h = min(photo.height, max(1, round(widest * scale * height / width)))
        left = int(rng.integers(0, photo.width - crop_w + 1))
        top = int(rng.integers(0, photo.height - crop_h + 1))
        crop = photo.crop((left, top, left + crop_w, top + crop_h))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        crops.append(crop.resize((width, height), Image.Resampling.BILINEAR).convert(_MODES[channels]))
    return _pixels(crops, feed, nhwc)


def run_model(
    source: Path,
    work: Path,
    feeds: Path,
    isolated: bool = False,
    commands=COMMANDS,
    before: dict[str, Observed] | None = None,
) -> dict[str, Observed]:
    """Every corpus command on ``source`` (``commands``: some of them); variants are written into ``work``.
    ``before``: what earlier runs of the other commands observed (what ``validate`` judges).

    The transforms run as a user runs them (their own inputs); ``validate`` then judges every variant
    they wrote on ``feeds`` (a folder of .npz: inputs a user would feed), so a variant verified only at
    the sizes a command guessed is caught at a real size.
    """
    source = Path(source)
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Observed] = dict(before or {})
    judged: dict[str, Observed] = {}  # validate's verdict on each variant, taken as soon as it was written
    for command in commands:
        started = time.perf_counter()
        if command == "validate":
            observed = _validate_all(source, work, feeds, results, isolated, judged)
        else:
            output = report = None
            if command == "inspect":
                args = ["inspect", "--json", str(source)]
            else:
                output = work / f"{command}.onnx"
                report = work / f"{command}.json"
                transform = TRANSFORMS[command]
                args = [transform[0], str(source), str(output), *transform[1:], "--report", str(report)]
            code, stdout, stderr = cli(args, isolated)
            observed = _observe(command, code, stdout, stderr, source, output, report)
        # Messages name files: say MODEL and WORK/ instead, so that a recorded message is the same anywhere.
        observed.message = observed.message.replace(str(source), "MODEL").replace(str(work), "WORK")
        observed.stderr = [line.replace(str(source), "MODEL").replace(str(work), "WORK") for line in observed.stderr]
        observed.seconds = round(time.perf_counter() - started, 2)
        results[command] = observed
        if observed.kind == "variant" and "validate" in commands:
            judged[command] = _validate_one(source, work, feeds, command, Path(observed.output), isolated)
            if isolated:  # a model over 1 GB: one variant on disk at a time (CI's disk is not ours)
                _remove_variant(Path(observed.output))
    return {c: results[c] for c in commands}


def _validate_all(
    source: Path,
    work: Path,
    feeds: Path,
    results: dict[str, Observed],
    isolated: bool,
    judged: dict[str, Observed] | None = None,
) -> Observed:
    """``validate --task generic --data FEEDS`` of each written variant (of the source itself if none);
    ``judged``: the verdicts already taken on some of them."""
    written = [c for c in VALIDATE_AGAINST if c in results and results[c].kind == "variant"]
    cosines = []
    for name in written or ["source"]:
        observed = (judged or {}).get(name)
        if observed is None:
            candidate = Path(results[name].output) if written else source
            observed = _validate_one(source, work, feeds, name, candidate, isolated)
        if observed.kind != "ok":
            return observed
        cosines.append(observed.cosine)
    floats = [c for c in cosines if c is not None]
    return Observed("validate", "ok", 0, cosine=min(floats) if floats else None, against=",".join(written) or "source")


def _validate_one(source: Path, work: Path, feeds: Path, name: str, candidate: Path, isolated: bool) -> Observed:
    report = work / f"validate-{name}.json"
    args = ["validate", str(source), str(candidate), "--task", "generic", "--data", str(feeds)]
    code, stdout, stderr = cli([*args, "--json", str(report)], isolated)
    observed = _observe("validate", code, stdout, stderr, source, None, report)
    observed.against = name
    if observed.kind != "ok":  # "fuse-fp32: <the problem>", without the line's prefix and file name
        observed.message = f"{name}: " + re.sub(r"^onnxsmith: error: [^ ]+: ", "", observed.message)
    return observed


def _remove_variant(output: Path) -> None:
    """The variant's model file and its data file; its report stays."""
    for path in (output, output.with_name(output.name + ".data")):
        path.unlink(missing_ok=True)


def _observe(command, code, stdout, stderr, source, output, report) -> Observed:
    lines = [line for line in stderr.splitlines() if line.strip()]
    tail = lines[-6:]
    if "Traceback (most recent call last)" in stderr:
        return Observed(command, "traceback", code, lines[-1].strip(), stderr=tail)
    if code != 0:
        errors = [line for line in lines if line.startswith("onnxsmith: error:")]
        message = errors[0] if errors else (lines[-1] if lines else stdout.strip().splitlines()[-1:] or [""])[0]
        if not errors and code == 1:  # a failed gate: say which output failed, from the table
            message = _gate_message(stdout, stderr) or message
        return Observed(command, "refused", code, str(message).strip(), stderr=tail)
    if command in ("inspect", "validate"):
        observed = Observed(command, "ok", code, stderr=tail)
        if command == "inspect":
            observed.message = json.dumps(json.loads(stdout).get("bytes_by_dtype", {}))
        else:
            metrics = {m["name"]: m["value"] for m in json.loads(Path(report).read_text())["metrics"]}
            observed.cosine = metrics.get("min_cosine")
        return observed
    verification = json.loads(Path(report).read_text()).get("verification") or {}
    cosines = [o["cosine"] for o in verification.get("outputs", []) if o.get("cosine") is not None]
    return Observed(
        command,
        "variant",
        code,
        cosine=min(cosines) if cosines else None,
        size_ratio=model_bytes(output) / model_bytes(source),
        output=str(output),
        stderr=tail,
    )


def _gate_message(stdout: str, stderr: str) -> str:
    for line in (stderr + "\n" + stdout).splitlines():
        low = line.lower()
        if "not written" in low or "gate" in low or "refus" in low or "failed" in low:
            return line.strip()
    return ""


def clean(work: Path) -> None:
    """Remove the variants (the 2 GB model's are large)."""
    for path in sorted(work.glob("*")):
        if path.is_file():
            os.remove(path)
