"""``onnxsmith fp16 SRC OUT``: fp16 weights and compute with measured fp32 islands, verified storage-faithfully."""

import argparse

from onnxsmith.cli.transform_cmd import register_transform
from onnxsmith.settings.fp16 import FP16


def register(parser: argparse.ArgumentParser) -> None:
    register_transform(parser, FP16, samples=4)
