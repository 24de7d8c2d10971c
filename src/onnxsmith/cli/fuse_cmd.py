"""``onnxsmith fuse SRC OUT``: a transformer fused into ONNX Runtime contrib ops; verified."""

from onnxsmith.cli.transform_cmd import register_transform
from onnxsmith.transforms.fuse import Fuse


def register(subparsers) -> None:
    register_transform(subparsers, Fuse, samples=2)
