"""Where the samples are run: this process (the default) or a Ray cluster, in shards.

Each field is a flag of ``validate`` (``--ray``, ``--workers``, ...) and a keyword of ``onnxsmith.validate``;
core/options.py renders both.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxsmith.core.options import POSITIVE, check_numbers, option

EXECUTION_TITLE = "execution (samples run in shards, here or on a Ray cluster; the same numbers either way)"
#: fp16's and int8's: their calibration statistics in shards of 16 input sets (probes/ranges.py,
#: int8_engine/statistics.py).
ENGINE_TITLE = "execution (calibration statistics measured in shards, here or on a Ray cluster; the same variant)"

ENGINES = ["local", "ray"]


@dataclass(frozen=True)
class EngineOptions:
    """``engine``: this process (``local``) or a Ray cluster (``ray``: the one at ``address``, else one started
    here). fp16's and int8's flags and keywords (their calibration statistics, measured in shards)."""

    engine: str = option("local", "where the shards run: this process, or a Ray cluster", choices=ENGINES)
    address: str | None = option(
        None,
        "the Ray cluster's address, which also picks the ray engine (default with --engine ray: start one on "
        "this machine); needs pip install 'onnxsmith[ray]'",
        metavar="ADDRESS",
        flag="ray",
    )
    workers: int | None = option(
        None,
        "Ray workers, each holding warm sessions and one CPU (default and most: one per CPU of the cluster)",
        number=POSITIVE,
    )

    def __post_init__(self) -> None:
        check_numbers(self)

    @property
    def on_ray(self) -> bool:
        return self.engine == "ray" or self.address is not None


@dataclass(frozen=True)
class ExecutionOptions(EngineOptions):
    """Where a validation's samples run, in shards: a recipe's ``[execution]`` table, ``validate``'s and
    ``build``'s flags (``--ray ADDRESS`` gives the address and the engine at once) and their keywords."""

    shard_size: int = option(64, "samples per shard (a multiple of the batch size is used)", number=POSITIVE)
    shard_dir: str | None = option(
        None,
        "keep each shard's outputs in this folder: a rerun with the same models, data and options resumes there",
        metavar="DIR",
    )
