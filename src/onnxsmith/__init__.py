"""onnxsmith: turn a source ONNX model into deployment variants proven against their source."""

from onnxsmith.core.version import __version__

__all__ = ["__version__"]
