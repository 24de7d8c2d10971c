"""The quantize engine: a language model's weights in 4 or 8 bits for its target (what transforms/quantize.py runs).

engine.py runs the steps (``make_quantized``: opset, Gemm -> MatMul, the head, the body's weights, the GEMV head,
the last-token logits) and ``prepare``, the first of them, which ``onnxsmith quantize`` runs alone to fail before
any work; report.py holds the report's words (notes, the runtime settings each target needs, why not more, the
weights table and numbers, the refusals). The rewrites themselves are the passes' (passes/gemm_to_matmul.py,
tied_head.py, nbits_head.py, quantize_weights.py, gemv_head.py, last_token_logits.py).
"""
