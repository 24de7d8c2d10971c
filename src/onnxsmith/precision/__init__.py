"""The precision engine: fp16 (or bf16) with fp32 islands, shared by ``fp16`` and ``fuse --precision fp16``.

* :mod:`.engine` measures (through :mod:`onnxsmith.runtime`) and runs the steps below;
* :mod:`.plan` decides, from data (the model and its measured ranges), into a ``Plan``;
* :mod:`.apply` carries a plan out with the passes (rescaling, conversion, Cast clean-up);
* :mod:`.report` shows what was measured, decided and done (notes, the islands table).
"""
