"""How fast models run here, side by side: onnxruntime CPU sessions on their files, timed round-robin.

What a transform promises about speed is measured with this (int8: its variant against the
model it was given, on the calibration inputs). Sessions open on the *files* (their weights
are initializers: onnxruntime folds what it computes from them, fuses a QDQ Conv into
QLinearConv), threads = cores. Every session stays open; each round runs every model in turn,
a block of runs each (one untimed run first when a run is short: onnxruntime's idle threads of
the other sessions spin for a while after their run, which a single short run would be charged
for), the block's mean per run; a model's time is the median over rounds. The machine may be
shared and noisy: compare models timed in one call, never across calls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from onnxsmith.runtime import runner

#: A round times each model for at least this long (a block of runs) when one run is shorter.
BLOCK_SECONDS = 0.05
#: Rounds: as many as ``seconds`` allow, within these.
MIN_ROUNDS, MAX_ROUNDS = 3, 15


def seconds_per_run(
    paths: dict[str, Path],
    feeds: dict[str, np.ndarray],
    *,
    seconds: float = 2.0,
    block_seconds: float = BLOCK_SECONDS,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
) -> dict[str, float]:
    """Median seconds per run of each model (by key) on ``feeds``, timed together (see the module doc).

    The rounds stop when ``seconds`` are spent, after at least ``min_rounds`` and at most ``max_rounds``;
    a round runs each model for at least ``block_seconds``."""
    threads = os.cpu_count() or 1
    sessions = {
        key: runner.open_session(path, options=runner.session_options(threads=threads), label=path)
        for key, path in paths.items()
    }
    block = {}
    for key, session in sessions.items():
        seconds_one = runner.timed_runs(session, feeds, 1, label=paths[key])  # the first run allocates
        if seconds_one < block_seconds:  # a short run: how many make a block, from a second one
            seconds_one = runner.timed_runs(session, feeds, 1, label=paths[key])
        block[key] = max(1, int(block_seconds / max(seconds_one, 1e-6)))
    times: dict[str, list[float]] = {key: [] for key in sessions}
    began = time.perf_counter()
    while True:
        for key, session in sessions.items():
            if block[key] > 1:
                runner.run(session, feeds, label=paths[key])  # wakes this session's threads
            times[key].append(runner.timed_runs(session, feeds, block[key], label=paths[key]))
        rounds = len(times[next(iter(times))])
        if rounds >= max_rounds or (rounds >= min_rounds and time.perf_counter() - began >= seconds):
            break
    return {key: float(np.median(t)) for key, t in times.items()}
