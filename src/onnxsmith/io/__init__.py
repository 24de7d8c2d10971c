"""The I/O edge: models and files in and out. The only place that touches protobuf bytes.

Its modules are imported by name (``onnxsmith.io.load``, ``onnxsmith.io.files``): the file helpers load no onnx.
"""
