"""Developer tools of this repository (run from its root); not part of the onnxsmith package."""
