"""Measuring a model by running a probe made from it: the layer above runtime/.

Each probe builds a graph from the model (tensors exposed as outputs, reductions appended, rounding switches
inserted) and runs it through runtime/: activation ranges, residual-channel peaks, outputs with chosen tensors
rounded to fp16, inner tensors at a cut, constants evaluated for passes. The engines above take the results as
data.
"""
