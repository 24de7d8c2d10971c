"""Running models: the only layer that imports onnxruntime.

Sessions on files and in-memory models (runner), storage-faithful fp16, inputs (from the input spec, plausible
for what each input is, from a user's data), the sizes a model runs at, timing and the latency worker. What is
measured by building a probe graph and running it lives a layer up, in probes/.
"""
