"""The bottom layer: errors users see, options, the registry, and what a transform is.

Nothing here reads a model file or runs onnxruntime; every other layer may import it.
"""
