"""Verification: inputs, running models in onnxruntime, storage-faithful fp16, comparing outputs."""
