"""The fuse engine: a transformer graph rewritten into onnxruntime's fused contrib ops (what transforms/fuse.py runs)."""
