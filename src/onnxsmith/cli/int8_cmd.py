"""``onnxsmith int8 SRC OUT``: Linear layers int8 for onnxruntime on CPU where measurement allows; verified."""

import argparse

from onnxsmith.cli.transform_cmd import register_transform
from onnxsmith.settings.int8 import INT8


def register(parser: argparse.ArgumentParser) -> None:
    register_transform(parser, INT8, samples=2)
