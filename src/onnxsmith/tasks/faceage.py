"""Face age and gender: face crops in, years and female/male out.

Preprocessing (what the model was trained on, and what an app must do too):
the face box is widened by 10 % of its width left and right and 10 % of its
height above and below, rounded to whole pixels and clamped to the image;
the crop is converted to RGB and resized bicubically to the model's input size
(224x224) without padding to keep the aspect; values are scaled to 0..1,
normalised with ImageNet's mean and std, and laid out NCHW.

Decoding: the age is the sum of the sigmoids of the 100 CORAL threshold logits
(``age_logits``); the gender is the argmax of ``gender_logits`` (0 female, 1 male).
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from PIL import Image, UnidentifiedImageError

from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.io.paths import open_readable
from onnxsmith.runtime.inputs import input_specs
from onnxsmith.settings.faceage import FACEAGE, FaceAgeOptions
from onnxsmith.tasks.base import (
    AGREEMENT,
    HIGHER,
    LOWER,
    MAX,
    MEAN,
    Evaluation,
    MetricSpec,
    Sample,
    Task,
    register_task,
)
from onnxsmith.tasks.widerface import padded_box, read_boxes

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
GENDERS = ("female", "male")
DEFAULT_SIZE = 224
#: The most pixels an image may declare (PIL's own warning threshold, 89 megapixels: 268 MB as RGB).
MAX_IMAGE_PIXELS = 89_478_485


def load_image(path: str | os.PathLike) -> Image.Image:
    path = Path(path)
    try:
        # A few hundred bytes of PNG can declare 50000x50000 pixels (7.5 GB decoded): the size is checked
        # from the header, before anything is decoded; PIL's own bomb warning becomes this error too.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with open_readable(path, "image") as f, Image.open(f) as image:
                if image.width * image.height > MAX_IMAGE_PIXELS:
                    raise Image.DecompressionBombError(
                        f"{image.width}x{image.height}: {image.width * image.height} pixels"
                    )
                return image.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        declared = re.search(r"(\d+) pixels", str(err))  # PIL's and ours both say "N pixels"
        size = f"{int(declared.group(1)):,} pixels" if declared else str(err)
        raise InputError(
            f"the image declares {size}, more than the {MAX_IMAGE_PIXELS:,} onnxsmith decodes", path
        ) from None
    except (UnidentifiedImageError, OSError) as err:
        raise InputError(f"not a readable image ({err})", path) from None


def face_crop(
    image: Image.Image,
    box: tuple[float, float, float, float] | None,
    padding: float = 0.1,
    where: str | os.PathLike | None = None,
    image_name: str = "",
) -> Image.Image:
    """The padded face crop of ``box`` (x, y, w, h); the whole image when ``box`` is None.
    ``where``: the file the error names (the image, or the boxes file and line the box is on);
    ``image_name``: the image's name where that file is not the image."""
    if box is None:
        return image
    left, top, right, bottom = padded_box(box, padding, image.width, image.height)
    if right <= left or bottom <= top:
        shown = "(" + ", ".join(f"{v:g}" for v in box) + ")"
        image_text = f"'{image_name}' ({image.width}x{image.height})" if image_name else f"{image.width}x{image.height}"
        raise InputError(f"the face box {shown} lies outside the {image_text} image", where)
    return image.crop((left, top, right, bottom))


def face_tensor(crop: Image.Image, size: int = DEFAULT_SIZE) -> np.ndarray:
    """[1, 3, size, size] float32: bicubic resize, 0..1, ImageNet-normalised, NCHW."""
    resized = crop.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    x = np.asarray(resized, dtype=np.float32) / 255.0
    x = (x - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def coral_age(age_logits: np.ndarray) -> np.ndarray:
    """Years: the sum over thresholds of sigmoid(logit), per row (float64)."""
    z = age_logits.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return (1.0 / (1.0 + np.exp(-z))).sum(axis=-1)


def gender_probabilities(gender_logits: np.ndarray) -> np.ndarray:
    z = gender_logits.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def model_input(model: ir.Model) -> tuple[str, int]:
    """The image input's name and side length (224 unless the model fixes another)."""
    specs = input_specs(model)
    if len(specs) != 1:
        raise InputError(
            f"a face-age model has one image input; this one has {len(specs)}: " + ", ".join(s.name for s in specs)
        )
    dims = specs[0].dims
    size = dims[-1] if len(dims) == 4 and isinstance(dims[-1], int) else DEFAULT_SIZE
    return specs[0].name, size


@register_task
class FaceAge(Task, settings=FACEAGE):
    batchable = True
    metrics = (
        MetricSpec("mean_abs_age_error", "mean |Δage|", LOWER, "years", MEAN),
        MetricSpec("max_abs_age_error", "max |Δage|", LOWER, "years", MAX),
        MetricSpec("gender_agreement", "gender agreement", HIGHER, summary=AGREEMENT),
        MetricSpec("nonfinite", "NaN/inf values", LOWER),
    )
    default_gates: ClassVar[dict[str, float]] = {"max_abs_age_error": 0.5, "gender_agreement": 1.0, "nonfinite": 0}

    def __init__(self) -> None:
        self._skipped: dict[str, int] = {}
        self._source = ""

    # ---- data -------------------------------------------------------------------------------

    def samples(self, model: ir.Model, options: FaceAgeOptions, source: Path | None = None) -> list[Sample]:
        return self.load(model, self.sample_refs(model, options, source), options)

    def sample_refs(self, model: ir.Model, options: FaceAgeOptions, source: Path | None = None) -> list[Sample]:
        """Each face's id and where it is (its image, its box, the file and line an error names)."""
        model_input(model)  # one image input, checked before any image is read
        self._skipped = {}
        if options.boxes:
            found = self._boxed_faces(options)
        elif options.data:
            found = self._crops(options)
        else:
            raise UsageError("task faceage needs data: a folder of face crops, or images with boxes")
        if options.limit is not None:
            found = found[: options.limit]
        if not found:
            raise InputError(
                "no face to validate on" + (f" ({self._skipped_text()})" if self._skipped else ""),
                options.boxes or options.data,
            )
        return [Sample(sample_id, {}, ref=(image_path, box, where)) for sample_id, image_path, box, where in found]

    def load(self, model: ir.Model, samples: list[Sample], options: FaceAgeOptions) -> list[Sample]:
        """The padded crops of ``samples``' faces, as the model's input."""
        name, size = model_input(model)
        cache: dict[Path, Image.Image] = {}
        loaded = []
        for sample in samples:
            if sample.ref is None:  # holds its feeds already
                loaded.append(sample)
                continue
            image_path, box, where = sample.ref
            if image_path not in cache:
                cache = {image_path: load_image(image_path)}  # boxes of one image are consecutive
            crop = face_crop(cache[image_path], box, options.padding, where, image_path.name)
            loaded.append(dataclasses.replace(sample, feeds={name: face_tensor(crop, size)}))
        return loaded

    def _boxed_faces(self, options: FaceAgeOptions):
        boxes_path = Path(options.boxes)
        folder = Path(options.data) if options.data else boxes_path.parent
        if not folder.is_dir():
            raise InputError("no such folder (the images of the boxes)", folder)
        self._source = boxes_path.name
        found = []
        for box in read_boxes(boxes_path):
            if box.invalid:
                self._skipped["invalid"] = self._skipped.get("invalid", 0) + 1
            elif min(box.w, box.h) < options.min_face:
                self._skipped[f"under {options.min_face} px"] = self._skipped.get(f"under {options.min_face} px", 0) + 1
            else:
                where = f"{boxes_path}:{box.line}"  # the line of the box
                found.append((box.id, folder / box.image, (box.x, box.y, box.w, box.h), where))
        return found

    def _crops(self, options: FaceAgeOptions):
        folder = Path(options.data)
        if not folder.is_dir():
            raise InputError("no such folder of face crops", folder)
        self._source = folder.name + "/"
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        return [(p.name, p, None, p) for p in files]

    def _skipped_text(self) -> str:
        return ", ".join(f"{n} {why}" for why, n in self._skipped.items()) + " skipped"

    def describe_data(self, options: FaceAgeOptions, samples: list[Sample]) -> str:
        what = (
            f"faces of at least {options.min_face} px from {self._source}"
            if options.boxes
            else f"face crops from {self._source}"
        )
        skipped = f" ({self._skipped_text()})" if self._skipped else ""
        return f"{len(samples)} {what}{skipped}"

    def predict_feeds(self, model: ir.Model, image: str | os.PathLike, box, options: FaceAgeOptions) -> dict:
        """The feeds for one face: ``box`` (x, y, w, h) in ``image``, or the whole image as a crop."""
        name, size = model_input(model)
        return {name: face_tensor(face_crop(load_image(image), box, options.padding, image), size)}

    # ---- outputs ----------------------------------------------------------------------------

    @staticmethod
    def describe_prediction(prediction: dict) -> str:
        return f"age {prediction['age']:.1f} years, {prediction['gender']} (p {prediction['p']:.2f})"

    def decode(self, outputs: dict[str, np.ndarray], options: FaceAgeOptions) -> list[dict]:
        """One prediction per row: age in years, gender and its probability."""
        for key in (options.age_output, options.gender_output):
            if key not in outputs:
                raise InputError(
                    f"the model has no output '{key}' (outputs: {', '.join(outputs)}); set age_output / gender_output"
                )
        ages = coral_age(outputs[options.age_output])
        probs = gender_probabilities(outputs[options.gender_output])
        rows = []
        for age, p in zip(ages.reshape(-1), probs.reshape(-1, probs.shape[-1])):
            g = int(np.argmax(p)) if np.all(np.isfinite(p)) else -1
            rows.append(
                {
                    "age": float(age),
                    "gender": GENDERS[g] if g in (0, 1) else "?",
                    "p": float(p[g]) if g >= 0 else float("nan"),
                }
            )
        return rows

    def evaluate(self, reference, candidate, samples, options: FaceAgeOptions, *, number_format=None) -> Evaluation:
        ref = [row for out in reference for row in self.decode(out, options)]
        cand = [row for out in candidate for row in self.decode(out, options)]
        nonfinite = sum(
            int(np.count_nonzero(~np.isfinite(out[k].astype(np.float64))))
            for out in candidate
            for k in (options.age_output, options.gender_output)
        )
        ref_age = np.array([r["age"] for r in ref])
        cand_age = np.array([c["age"] for c in cand])
        both = np.isfinite(ref_age) & np.isfinite(cand_age)
        delta = np.abs(ref_age - cand_age)[both]
        agree = sum(1 for r, c in zip(ref, cand) if r["gender"] == c["gender"] != "?")
        n = len(ref)
        values = {
            "mean_abs_age_error": float(delta.mean()) if delta.size else float("nan"),
            "max_abs_age_error": float(delta.max()) if delta.size else float("nan"),
            "gender_agreement": agree / n if n else float("nan"),
            "nonfinite": float(nonfinite),
        }
        display = {
            "mean_abs_age_error": f"{values['mean_abs_age_error']:.4f} years",
            "max_abs_age_error": f"{values['max_abs_age_error']:.4f} years",
            "gender_agreement": f"{agree}/{n}",
            "nonfinite": "none" if nonfinite == 0 else f"{nonfinite}",
        }
        rows = [
            {
                "sample": s.id,
                "age (source)": r["age"],
                "age (variant)": c["age"],
                "|Δage|": abs(r["age"] - c["age"]),
                "gender (source)": r["gender"],
                "gender (variant)": c["gender"],
            }
            for s, r, c in zip(samples, ref, cand)
        ]
        # per sample: |Δage| (NaN where either age is not finite, left out of the mean and max as above), and
        # whether the two genders agree
        abs_delta = [float(d) if ok else float("nan") for d, ok in zip(np.abs(ref_age - cand_age), both)]
        agrees = [1.0 if r["gender"] == c["gender"] != "?" else 0.0 for r, c in zip(ref, cand)]
        per_sample = {"mean_abs_age_error": abs_delta, "max_abs_age_error": abs_delta, "gender_agreement": agrees}
        errors = {"|Δage| (years)": [float(d) for d in delta]}
        return Evaluation(values, display, errors, rows, per_sample=per_sample)
