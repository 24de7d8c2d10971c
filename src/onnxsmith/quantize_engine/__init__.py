"""The quantize engine: a language model's weights in 4 or 8 bits for its target (what transforms/quantize.py runs)."""
