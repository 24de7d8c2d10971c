"""The 95 % intervals of a validation's metrics and its worst samples (release/confidence.py), through
``onnxsmith validate``, its JSON, its table and the release report."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from rich.console import Console

from onnxsmith.cli.release_tables import validation_table, worst_table
from onnxsmith.release.confidence import (
    agreement_interval,
    interval_text,
    max_interval,
    mean_interval,
    metric_intervals,
    worst_samples,
)
from onnxsmith.release.report import _validation_section
from onnxsmith.release.validate import MetricResult, Validation
from onnxsmith.tasks.base import AGREEMENT, HIGHER, LOWER, MAX, MEAN, Evaluation, MetricSpec
from tests.conftest import FIXTURES
from tests.support.release import REPO, face_images


@pytest.mark.parametrize(
    "successes, n, expected",
    [(0, 10, (0.0, 0.3085)), (10, 10, (0.6915, 1.0)), (5, 10, (0.1871, 0.8129)), (1, 1, (0.025, 1.0))],
)
def test_clopper_pearson_known_values(successes, n, expected):
    lo, hi = agreement_interval(successes, n)
    assert (round(lo, 4), round(hi, 4)) == expected


def _binomial_tail(n: int, p: float, ks: range) -> float:
    """P(X in ks) for X ~ Binomial(n, p), term by term in plain Python (math.fsum of each probability)."""
    log_n = math.lgamma(n + 1)
    return math.fsum(
        math.exp(log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p))
        for k in ks
    )


@pytest.mark.parametrize("successes, n", [(1, 100_000), (99_990, 100_000), (37, 200)])
def test_clopper_pearson_ends_leave_two_and_a_half_percent_on_each_side(successes, n):
    lo, hi = agreement_interval(successes, n)
    assert _binomial_tail(n, lo, range(successes, n + 1)) == pytest.approx(0.025, rel=1e-6)
    assert _binomial_tail(n, hi, range(successes + 1)) == pytest.approx(0.025, rel=1e-6)
    assert lo < successes / n < hi


def test_clopper_pearson_is_monotone_and_narrows_with_more_samples():
    bounds = [agreement_interval(k, 20) for k in range(21)]
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(bounds))  # both ends rise with k
    assert bounds[0][0] == 0.0 and bounds[-1][1] == 1.0
    widths = [hi - lo for lo, hi in (agreement_interval(n // 2, n) for n in (10, 100, 1000, 100_000))]
    assert widths == sorted(widths, reverse=True) and widths[-1] < 0.01
    assert agreement_interval(90, 100, level=0.99)[0] < agreement_interval(90, 100)[0]  # a wider level
    with pytest.raises(ValueError):
        agreement_interval(11, 10)
    with pytest.raises(ValueError):
        agreement_interval(0, 0)


def test_the_bootstrap_is_deterministic_contains_the_mean_and_narrows_with_more_samples():
    rng = np.random.default_rng(3)
    few, many = rng.exponential(size=40), rng.exponential(size=4000)
    first = mean_interval(few)
    assert mean_interval(list(few)) == first == mean_interval(few.copy())  # same values, same interval
    assert first[0] < few.mean() < first[1]
    lo, hi = mean_interval(many)
    assert lo < many.mean() < hi
    assert hi - lo < (first[1] - first[0]) / 5  # ~ 1/sqrt(n): 10 times narrower for 100 times the samples
    assert mean_interval(few, level=0.5)[1] - mean_interval(few, level=0.5)[0] < first[1] - first[0]
    assert mean_interval([2.5, 2.5, 2.5]) == (2.5, 2.5)
    with pytest.raises(ValueError):
        mean_interval([1.0, float("nan")])
    with pytest.raises(ValueError):
        mean_interval([])


def test_the_bootstrap_of_many_samples_is_right_and_quick_enough():
    """100,000 values: the interval is the normal one (sd/sqrt(n)) to a few percent; chunked and threaded, it
    takes about half a second on two cores (a generous bound here: shared test machines)."""
    import time

    values = np.random.default_rng(5).normal(10.0, 2.0, size=100_000)
    start = time.perf_counter()
    lo, hi = mean_interval(values)
    took = time.perf_counter() - start
    half = 1.959964 * values.std(ddof=1) / math.sqrt(values.size)
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.1)
    assert (lo + hi) / 2 == pytest.approx(values.mean(), abs=half * 0.1)
    assert took < 10, took


METRICS = (
    MetricSpec("mean_err", "mean err", LOWER, summary=MEAN),
    MetricSpec("max_err", "max err", LOWER, summary=MAX),
    MetricSpec("agree", "agreement", HIGHER, summary=AGREEMENT),
    MetricSpec("count", "count", LOWER),
)


def test_each_metric_gets_the_interval_its_summary_allows():
    errors = [0.1, 0.4, float("nan"), 0.2]
    evaluation = Evaluation(
        values={"mean_err": 0.7 / 3, "max_err": 0.4, "agree": 0.75, "count": 1.0},
        per_sample={"mean_err": errors, "max_err": errors, "agree": [1.0, 1.0, 0.0, 1.0], "count": [1.0, 0.0]},
    )
    intervals = metric_intervals(METRICS, evaluation)
    assert intervals["agree"] == agreement_interval(3, 4)
    assert intervals["mean_err"] == mean_interval([0.1, 0.4, 0.2])  # the non-finite value left out, as the mean does
    assert intervals["max_err"] is None and max_interval(errors) is None
    assert intervals["count"] is None  # no summary of samples: no interval, whatever values it has
    one = Evaluation(values={}, per_sample={"mean_err": [0.3], "agree": [1.0]})
    intervals = metric_intervals(METRICS, one)  # one sample: an agreement's interval, no mean's
    assert intervals == {"mean_err": None, "max_err": None, "agree": pytest.approx((0.025, 1.0)), "count": None}


def test_worst_samples_largest_first_ties_in_sample_order_nonfinite_first():
    ids = ["a", "b", "c", "d", "e", "f", "g"]
    per_sample = {
        "agree": [0.0] * 7,  # higher is better: never what is ranked
        "mean_err": [0.2, 0.5, 0.1, 0.5, float("nan"), 0.3, 0.5],
    }
    worst = worst_samples(METRICS, per_sample, ids)
    assert [i for i, _ in worst] == ["e", "b", "d", "g", "f"]  # NaN first; the three 0.5s in their order
    assert worst[1:] == [("b", 0.5), ("d", 0.5), ("g", 0.5), ("f", 0.3)] and math.isnan(worst[0][1])
    assert worst_samples(METRICS, per_sample, ids, count=2) == worst[:2]
    # the first lower-is-better metric *with* values: max_err when mean_err has none
    assert worst_samples(METRICS, {"max_err": [1.0, 3.0]}, ["x", "y"]) == [("y", 3.0), ("x", 1.0)]
    assert worst_samples(METRICS, {"agree": [1.0]}, ["x"]) == []
    with pytest.raises(ValueError, match="3 per-sample values of mean_err for 2 samples"):
        worst_samples(METRICS, {"mean_err": [1.0, 2.0, 3.0]}, ["x", "y"])


def _validation(worst_id: str = "face<1>.png") -> Validation:
    metrics = [
        MetricResult("mean_err", "mean err", "", LOWER, 0.0123, "0.0123", 0.05, True, (0.0101, 0.0139)),
        MetricResult("max_err", "max err", "", LOWER, 0.04, "0.04", None, None, None),
        MetricResult("agree", "agreement", "", HIGHER, 1.0, "8/8", 1.0, True, agreement_interval(8, 8)),
    ]
    worst = [
        {"sample": worst_id, "value": float("nan"), "metric": "mean_err"},
        {"sample": "face2.png", "value": 0.02, "metric": "mean_err"},
    ]
    return Validation("faceage", "8 crops", 8, "src.onnx", "v.onnx", {"candidate": "native"}, metrics, worst=worst)


def test_the_table_json_and_report_carry_intervals_and_worst_samples():
    validation = _validation()
    console = Console(width=200, record=True)
    console.print(validation_table([validation]))
    console.print(worst_table(validation))
    text = console.export_text()
    assert "0.0123 (95 % CI 0.0101–0.0139) ✓" in text
    assert "8/8 (95 % CI 0.631–1) ✓" in text
    assert "CI" not in next(line for line in text.splitlines() if "max err" in line)  # a maximum has none
    assert "worst samples (mean err of each alone)" in " ".join(text.split())  # the title may wrap
    assert "│ face<1>.png │ NaN/inf │" in text and "│ face2.png   │    0.02 │" in text

    data = json.loads(json.dumps(validation.to_json(), allow_nan=False))  # no NaN anywhere
    metrics = {m["name"]: m for m in data["metrics"]}
    assert metrics["mean_err"]["interval"] == [0.0101, 0.0139] and metrics["max_err"]["interval"] is None
    assert data["worst"][0] == {"sample": "face<1>.png", "value": None, "metric": "mean_err"}

    html = "\n".join(_validation_section({"data": "8 crops", "task": "faceage"}, [{"name": "v", "validation": data}]))
    assert '<span class="ok">0.0123</span> <span class="ci">(95 % CI 0.0101–0.0139)</span>' in html
    assert "<code>face&lt;1&gt;.png</code> NaN/inf; <code>face2.png</code> 0.02" in html
    assert "face<1>" not in html  # the sample id is escaped


def test_interval_text_shows_enough_digits_to_tell_the_ends_apart():
    assert interval_text((0.0101, 0.0139)) == "95 % CI 0.0101–0.0139"
    assert interval_text(agreement_interval(99_999, 100_000)) == "95 % CI 0.9999–1"  # 0.99994: 3 digits say 1
    assert interval_text((0.123412, 0.123449)) == "95 % CI 0.12341–0.12345"  # 4 digits: both 0.1234
    assert interval_text(None) == "" and interval_text([float("nan"), 1.0]) == ""


def test_validate_on_the_face_age_fixture_writes_intervals_and_worst_samples(tmp_path, cli):
    crops = tmp_path / "crops"
    names = [name for name, _ in face_images(crops, count=8)]  # whole images, taken as face crops
    result = cli(
        "validate",
        FIXTURES / "faceage_dynamo.onnx",
        FIXTURES / "faceage_torchscript.onnx",  # the same weights, exported the other way
        *("--task", "faceage", "--data", crops, "--json", tmp_path / "v.json"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "v.json").read_text())
    metrics = {m["name"]: m for m in report["metrics"]}
    for name in ("gender_agreement", "mean_abs_age_error"):
        lo, hi = metrics[name]["interval"]
        assert lo <= metrics[name]["value"] <= hi and lo < hi, (name, metrics[name])
    assert metrics["gender_agreement"]["interval"] == pytest.approx(agreement_interval(8, 8))  # 8/8 agree
    assert metrics["max_abs_age_error"]["interval"] is None and metrics["nonfinite"]["interval"] is None
    worst = report["worst"]
    assert 1 <= len(worst) <= 5 and {w["sample"] for w in worst} <= set(names)
    assert [w["value"] for w in worst] == sorted((w["value"] for w in worst), reverse=True)
    assert worst[0]["value"] == pytest.approx(metrics["max_abs_age_error"]["value"])  # the worst is the max
    assert "95 % CI" in result.stdout and "worst samples" in result.stdout and worst[0]["sample"] in result.stdout


def test_validate_a_language_model_gives_intervals_over_windows(tmp_path, cli):
    source = FIXTURES / "gpt2" / "onnx" / "model.onnx"
    text = REPO / "examples" / "gpt2-web" / "heldout.txt"
    args = ["--task", "lm", "--text", text, "--window", "16", "--max-windows", "6", "--json", tmp_path / "lm.json"]
    result = cli("validate", source, source, *args)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "lm.json").read_text())
    metrics = {m["name"]: m for m in report["metrics"]}
    lo, hi = metrics["loss"]["interval"]
    assert lo < metrics["loss"]["value"] < hi  # the windows' losses differ
    assert metrics["kl"]["interval"] == pytest.approx([0, 0], abs=1e-9) and metrics["top1"]["interval"] == [1, 1]
    assert metrics["loss_increase"]["interval"] is None and metrics["perplexity"]["interval"] is None
    assert {w["sample"] for w in report["worst"]} <= {f"window {i}" for i in range(6)}
    assert {w["metric"] for w in report["worst"]} == {"kl"} and len(report["worst"]) == 5
