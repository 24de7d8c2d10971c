"""The shrink engine: a model made smaller without changing what it computes (what transforms/shrink.py runs).

engine.py runs the passes in their order (``make_shrink``, what :mod:`onnxsmith.transforms.shrink` declares);
report.py holds what they did (``ShrinkRecord``) and the report's words. The passes themselves live in passes/.
"""
