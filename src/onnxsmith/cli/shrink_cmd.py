"""``onnxsmith shrink SRC OUT``: fold small constants, narrow int64/fp64 constants, dedup; verified."""

import argparse

from onnxsmith.cli.transform_cmd import register_transform
from onnxsmith.settings.shrink import SHRINK


def register(parser: argparse.ArgumentParser) -> None:
    register_transform(parser, SHRINK, samples=2)
