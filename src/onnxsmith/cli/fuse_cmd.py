"""``onnxsmith fuse SRC OUT``: a transformer fused into ONNX Runtime contrib ops; verified."""

import argparse

from onnxsmith.cli.transform_cmd import register_transform
from onnxsmith.settings.fuse import FUSE


def register(parser: argparse.ArgumentParser) -> None:
    register_transform(parser, FUSE, samples=2)
