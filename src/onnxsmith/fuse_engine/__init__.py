"""The fuse engine: a transformer graph rewritten into onnxruntime's fused contrib ops (what transforms/fuse.py runs).

engine.py runs the steps (``make_fused``); shapes.py is step 1, the input dims named and shape arithmetic folded;
fusions.py step 2, the rule sets of rules/ in the order they run (``FUSIONS``); report.py the report's words.
Row pruning is passes/prune_rows.py, fp16 the precision engine's (:mod:`onnxsmith.precision`).
"""
