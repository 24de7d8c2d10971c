"""The ``faceage`` task's settings (the engine: :mod:`onnxsmith.tasks.faceage`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxsmith.core.options import option
from onnxsmith.settings import TaskSettings


@dataclass
class FaceAgeOptions:
    data: str | None = field(
        default=None,
        metadata={
            "help": "folder of images (faces given by --boxes) or of face crops (default: the folder of --boxes)",
            "path": True,
        },
    )
    boxes: str | None = field(
        default=None,
        metadata={
            "help": "WIDER FACE annotation file of the faces in --data (default: none, --data is a folder of crops)",
            "path": True,
        },
    )
    min_face: int = option(32, "skip faces whose box is narrower or shorter (px)")
    limit: int | None = option(None, "use at most this many faces, in file order (default: all)")
    padding: float = option(0.1, "crop margin on each side, as a fraction of the box")
    batch_size: int = option(8, "faces per inference run")
    age_output: str = option("age_logits", "output holding the CORAL age logits")
    gender_output: str = option("gender_logits", "output holding the gender logits")

    def validate(self) -> None:
        if self.min_face < 0:
            raise ValueError("min_face must be >= 0")
        if self.limit is not None and self.limit < 1:
            raise ValueError("limit must be >= 1")
        if not 0 <= self.padding <= 1:
            raise ValueError("padding must be between 0 and 1")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")


FACEAGE = TaskSettings(
    "faceage", "face crops -> age (CORAL, years) and gender; |Δage|, gender agreement, NaN/inf", FaceAgeOptions
)
