"""``onnxsmith int8 SRC OUT``: Linear layers int8 for onnxruntime on CPU where measurement allows; verified."""

from onnxsmith.cli.transform_cmd import register_transform
from onnxsmith.transforms.int8 import Int8


def register(subparsers) -> None:
    register_transform(subparsers, Int8, samples=2)
