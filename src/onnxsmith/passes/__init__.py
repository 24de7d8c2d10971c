"""IR passes: small, single-purpose rewrites of an onnx-ir model, composed by the transforms.

Each pass is an ``onnx_ir.passes.InPlacePass`` in its own module, with a test
that runs the model in onnxruntime before and after it on the same inputs.
"""
