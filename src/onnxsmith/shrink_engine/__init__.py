"""The shrink engine: a model made smaller without changing what it computes (what transforms/shrink.py runs)."""
