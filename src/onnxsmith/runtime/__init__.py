"""Running models: the only layer that imports onnxruntime.

Sessions on files and in-memory models (runner), storage-faithful fp16, inputs from
the input spec, activation ranges and residual-channel peaks, inner tensors exposed,
evaluations for passes, the latency worker. Layers above run models only through it.
"""
