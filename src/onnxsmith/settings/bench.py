"""What a latency benchmark runs (``onnxsmith bench``, a recipe's ``[bench]``, ``onnxsmith.bench()``)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxsmith.core.options import COUNT, POSITIVE, option

#: The execution providers a benchmark can ask for (runtime/latency.py maps each to onnxruntime's names).
PROVIDER_NAMES = ("cpu", "cuda")


@dataclass
class BenchOptions:
    batch: list[int] = option(default_factory=lambda: [1], help="batch sizes", number=POSITIVE, metavar="1,5,10")
    provider: str = option("cpu", "execution provider", choices=list(PROVIDER_NAMES))
    runs: int = option(20, "timed runs per batch size", number=POSITIVE)
    warmup: int = option(3, "untimed runs before them", number=COUNT)
    threads: int | None = option(None, "intra-op threads (0 or automatic: onnxruntime's choice)", number=COUNT)
    shape: list[str] = option(
        default_factory=list,
        help="sizes of symbolic dims other than the batch: NAME:D0,D1 (a whole input) or DIM=N",
        repeat=True,
        metavar="NAME:D0,D1|DIM=N",
    )

    def validate(self) -> None:
        if not self.batch:
            raise ValueError("batch needs at least one batch size")
