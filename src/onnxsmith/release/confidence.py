"""How sure a validation's numbers are: a 95 % interval for each metric that summarises its samples, and the
samples that fare worst.

A metric says how it summarises the per-sample values its task gives (``MetricSpec.summary``,
``Evaluation.per_sample``), and that says which interval it gets:

* an agreement (the fraction of samples on which the two models agree: per-sample values 1 and 0): the exact
  Clopper–Pearson interval (:func:`agreement_interval`), computed from the binomial distribution in log space;
* a mean: the percentile bootstrap of the mean (:func:`mean_interval`), with a fixed seed so that a rebuild
  gives the same interval;
* a maximum: none (:func:`max_interval`).

The intervals say how far the metric could move on other samples like these; they say nothing of samples
unlike them. :func:`worst_samples` names the samples to look at first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from onnxsmith.tasks.base import AGREEMENT, LOWER, MAX, MEAN, Evaluation, MetricSpec

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
#: How many samples :func:`worst_samples` names.
WORST = 5
#: Resampled values per chunk of the bootstrap (index and value arrays of a few MB each).
_CHUNK = 1 << 20

Interval = tuple[float, float]

#: What the intervals are, for a reader of the report.
INTERVALS_NOTE = (
    f"Intervals are {LEVEL:.0%} confidence intervals over the samples: exact (Clopper–Pearson) for agreements, "
    f"the percentile bootstrap ({RESAMPLES} resamples, a fixed seed) for means; a maximum has none."
)


def agreement_interval(successes: int, n: int, level: float = LEVEL) -> Interval:
    """The exact (Clopper–Pearson) ``level`` interval of a proportion, ``successes`` out of ``n``: the ``p``
    at which ``successes`` or more (below: or fewer) would be seen with probability (1 - level) / 2; 0 and 1
    at the ends (0/10 gives (0, 0.3085), 10/10 (0.6915, 1)). Exact to ~1e-13 for any ``n``."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n >= 1, not {successes} of {n}")
    if not 0 < level < 1:
        raise ValueError(f"the level must lie between 0 and 1, not {level}")
    log_tail = math.log((1 - level) / 2)
    log_choose = _log_binomials(n)
    i = np.arange(n + 1, dtype=np.float64)

    def log_pmf(p: float) -> np.ndarray:
        return log_choose + i * math.log(p) + (n - i) * math.log1p(-p)

    lower, upper = 0.0, 1.0
    if successes > 0:  # P(X >= successes; p) rises with p
        lower = _bisect(lambda p: _logsumexp(log_pmf(p)[successes:]) - log_tail, rising=True)
    if successes < n:  # P(X <= successes; p) falls with p
        upper = _bisect(lambda p: _logsumexp(log_pmf(p)[: successes + 1]) - log_tail, rising=False)
    return lower, upper


def _log_binomials(n: int) -> np.ndarray:
    """log C(n, i) for i = 0..n."""
    log_factorial = np.array([math.lgamma(k + 1) for k in range(n + 1)])
    return log_factorial[n] - log_factorial - log_factorial[::-1]


def _logsumexp(terms: np.ndarray) -> float:
    top = float(terms.max())
    return top + math.log(float(np.exp(terms - top).sum()))


def _bisect(f: Callable[[float], float], *, rising: bool) -> float:
    """The root in (0, 1) of ``f``, monotone (``rising``: from negative to positive), to 1e-13 of itself."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi or hi - lo <= 1e-13 * hi:
            break
        if (f(mid) < 0) == rising:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def mean_interval(values: Iterable[float], level: float = LEVEL, resamples: int = RESAMPLES) -> Interval:
    """The percentile bootstrap ``level`` interval of the mean of ``values`` (finite, at least one):
    ``resamples`` resamples of as many values, drawn with replacement from a generator seeded with
    :data:`SEED` (the same values give the same interval), their means' quantiles at (1 - level) / 2 and
    (1 + level) / 2. The resamples are drawn in chunks (a few MB each), each chunk from its own generator
    spawned from that seed, so the interval does not depend on how the chunks are shared among the threads that
    draw them: 100,000 values (2 x 10^8 draws) take about half a second on two cores."""
    data = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64).reshape(-1)
    if data.size == 0 or not np.isfinite(data).all():
        raise ValueError("the bootstrap needs at least one value, all finite")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"the level must lie between 0 and 1 (not {level}) and resamples be positive")
    if data.min() == data.max():  # every resample's mean is that value (exactly, not to rounding)
        return float(data[0]), float(data[0])
    n = data.size
    per_chunk = max(1, _CHUNK // n)
    starts = list(range(0, resamples, per_chunk))
    generators = np.random.default_rng(SEED).spawn(len(starts))
    means = np.empty(resamples)

    def chunk(j: int) -> None:
        count = min(per_chunk, resamples - starts[j])
        index = generators[j].integers(0, n, size=(count, n))  # int64: what take reads without a copy
        means[starts[j] : starts[j] + count] = np.take(data, index).mean(axis=1)

    workers = min(len(starts), os.cpu_count() or 1, 8)
    if workers > 1:  # numpy's generators and gathers release the GIL
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(chunk, range(len(starts))))
    else:
        for j in range(len(starts)):
            chunk(j)
    tail = (1 - level) / 2
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return float(lo), float(hi)


def max_interval(values: Iterable[float], level: float = LEVEL) -> None:
    """None: the largest per-sample error has no useful interval. The bootstrap of a maximum never resamples
    anything above the largest value seen, so its interval ends at the value itself, however few the samples
    (and more samples can only raise a maximum); nothing but an assumption about the errors' tail would give
    an upper end, and the gate on it is meant as a bound on the samples at hand."""
    return None


def metric_intervals(
    metrics: Sequence[MetricSpec], evaluation: Evaluation, level: float = LEVEL
) -> dict[str, Interval | None]:
    """Metric name -> its ``level`` interval, or None: for a metric without per-sample values, one that
    summarises none (``summary`` ""), a maximum, or too few finite values (an agreement needs one, a mean two).
    Non-finite per-sample values are left out, as the metrics leave them out."""
    intervals: dict[str, Interval | None] = {}
    for spec in metrics:
        values = [v for v in evaluation.per_sample.get(spec.name, []) if math.isfinite(v)]
        interval = None
        if spec.summary == AGREEMENT and values:
            interval = agreement_interval(sum(1 for v in values if v >= 0.5), len(values), level)
        elif spec.summary == MEAN and len(values) >= 2:
            interval = mean_interval(values, level)
        elif spec.summary == MAX:
            interval = max_interval(values, level)
        intervals[spec.name] = interval
    return intervals


def worst_metric(metrics: Sequence[MetricSpec], per_sample: dict[str, list[float]]) -> MetricSpec | None:
    """The first metric where lower is better that has per-sample values: what :func:`worst_samples` ranks."""
    return next((m for m in metrics if m.better == LOWER and per_sample.get(m.name)), None)


def worst_samples(
    metrics: Sequence[MetricSpec], per_sample: dict[str, list[float]], ids: Sequence[str], count: int = WORST
) -> list[tuple[str, float]]:
    """The ``count`` samples with the largest per-sample value of :func:`worst_metric`, largest first, as
    (sample id, value); ties in the order of the samples. A non-finite value (the variant gave no finite
    output there) ranks above every finite one. ``ids``: the samples' ids, in the order of the values."""
    metric = worst_metric(metrics, per_sample)
    if metric is None:
        return []
    values = per_sample[metric.name]
    if len(values) != len(ids):
        raise ValueError(f"{len(values)} per-sample values of {metric.name} for {len(ids)} samples")

    def rank(i: int) -> tuple[int, float, int]:
        v = values[i]
        return (0, 0.0, i) if not math.isfinite(v) else (1, -v, i)

    return [(ids[i], float(values[i])) for i in sorted(range(len(values)), key=rank)[:count]]


def interval_text(interval: Sequence[float] | None, level: float = LEVEL) -> str:
    """``95 % CI 0.0101–0.0139``: as few significant digits (3 or more) as tell the two ends apart; "" for none."""
    if interval is None or any(v is None or not math.isfinite(v) for v in interval):
        return ""
    lo, hi = interval
    digits = 3
    while digits < 8 and lo != hi and f"{lo:.{digits}g}" == f"{hi:.{digits}g}":
        digits += 1
    return f"{level * 100:g} % CI {lo:.{digits}g}–{hi:.{digits}g}"
