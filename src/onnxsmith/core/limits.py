"""The limits of fp16 the code measures against, defined once."""

from __future__ import annotations

#: fp16's largest finite value: a tensor past it is inf in fp16.
FP16_MAX = 65504.0
#: fp16's smallest normal value: below it values lose precision (subnormals), then flush to 0.
FP16_MIN_NORMAL = 2.0**-14
