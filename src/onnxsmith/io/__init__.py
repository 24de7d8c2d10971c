"""The I/O edge: models and files in and out. The only place that touches protobuf bytes."""

from onnxsmith.io.files import FileRecord, sha256_file
from onnxsmith.io.load import load_model
from onnxsmith.io.save import Provenance, save_model

__all__ = ["FileRecord", "Provenance", "load_model", "save_model", "sha256_file"]
