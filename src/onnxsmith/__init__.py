"""onnxsmith: turn a source ONNX model into deployment variants proven against their source."""

__version__ = "0.1.0"
