"""The transforms a user asks for by name (``onnxsmith NAME`` and a recipe's ``pass = "NAME"``).

Importing this package registers every transform module it imports here.
"""

from onnxsmith.core.transform import TRANSFORMS, Transform
from onnxsmith.transforms import fp16, fuse, int8, quantize, shrink  # noqa: F401  (importing registers them)


def transforms() -> dict[str, type[Transform]]:
    return TRANSFORMS.classes()


def get_transform(name: str) -> Transform:
    return TRANSFORMS.create(name)
