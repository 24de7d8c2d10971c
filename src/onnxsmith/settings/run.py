"""How models are run, as every command offers it: the made-up inputs' seed, fp16 run modes, the run timeout."""

from __future__ import annotations

#: The seed of made-up inputs when none is given (same seed, same inputs, same variant bytes).
DEFAULT_SEED = 0

#: How a model is run (``--fp16-mode``): "auto" runs one with fp16 tensors storage-faithfully (every fp16 tensor
#: really rounded, as a GPU holds it), "native" as onnxruntime likes.
FP16_MODES = ("auto", "native")

#: The environment variable that bounds one run of a model, in seconds (0: no limit).
RUN_TIMEOUT_ENV = "ONNXSMITH_RUN_TIMEOUT"
#: The default: a real model's run takes seconds; one still running after this never ends (a Loop of 2^62).
DEFAULT_RUN_TIMEOUT = 600.0
