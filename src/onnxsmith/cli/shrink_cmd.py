"""``onnxsmith shrink SRC OUT``: fold small constants, narrow int64/fp64 constants, dedup; verified."""

from onnxsmith.cli.transform_cmd import register_transform
from onnxsmith.transforms.shrink import Shrink


def register(subparsers) -> None:
    register_transform(subparsers, Shrink, samples=2)
