"""``onnxsmith fp16 SRC OUT``: fp16 weights and compute with measured fp32 islands, verified storage-faithfully."""

from onnxsmith.cli.transform_cmd import register_transform
from onnxsmith.transforms.fp16 import Fp16


def register(subparsers) -> None:
    register_transform(subparsers, Fp16, samples=4)
