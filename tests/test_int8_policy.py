"""The int8 search (analysis/int8_policy.py) on measured errors, and the roles it groups Linears by."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from onnxsmith.analysis.int8_policy import SPEED_MARGIN, keep_fast, roles, search
from onnxsmith.io.load import load_model
from onnxsmith.passes.quantize_linears import find_linears
from tests.support.fusion import FACEAGE


def _additive(errors: dict[str, float], calls: list):
    """A model whose output errors add as independent noise does: sqrt of the sum of squares."""

    def error(names: set[str]) -> float:
        calls.append(frozenset(names))
        return float(np.sqrt(sum(errors[n] ** 2 for n in names)))

    return error


def _blocks(n_blocks: int, roles_: dict[str, float]):
    groups = {r: [f"{r}{i}" for i in range(n_blocks)] for r in roles_}
    errors = {f"{r}{i}": e for r, e in roles_.items() for i in range(n_blocks)}
    return list(groups.items()), errors


def test_everything_within_the_budget_is_one_run():
    groups, errors = _blocks(4, {"q": 1e-3, "fc1": 1e-3})
    calls = []
    result = search(groups, dict.fromkeys(errors, 1.0), _additive(errors, calls), 0.05, 24)
    assert result.chosen == set(errors) and len(calls) == 1 and result.measured <= 0.05


def test_a_sensitive_role_stays_fp32_and_the_rest_goes_int8():
    groups, errors = _blocks(24, {"q": 0.03, "k": 0.03, "v": 0.002, "o": 0.002, "fc1": 0.002, "fc2": 0.002})
    value = {n: (4.0 if n.startswith("fc") else 1.0) for n in errors}
    calls = []
    result = search(groups, value, _additive(errors, calls), 0.05, 24)
    assert result.measured <= 0.05 and len(calls) <= 24
    assert {n for n in errors if n[0] in "vof"} <= result.chosen  # every cheap-to-quantize layer
    assert len(result.chosen & {n for n in errors if n[0] in "qk"}) < 48  # not all sensitive ones
    assert result.measured == pytest.approx(np.sqrt(sum(errors[n] ** 2 for n in result.chosen)))


def test_halving_finds_the_one_sensitive_layer_of_a_role():
    errors = {f"fc2_{i}": 0.001 for i in range(16)} | {f"q{i}": 0.001 for i in range(16)}
    errors["fc2_11"] = 0.5  # one block's fc2 carries an outlier
    groups = [("fc2", [f"fc2_{i}" for i in range(16)]), ("q", [f"q{i}" for i in range(16)])]
    calls = []
    result = search(groups, dict.fromkeys(errors, 1.0), _additive(errors, calls), 0.05, 24)
    assert result.chosen == set(errors) - {"fc2_11"}
    assert len(calls) <= 2 + 2 * 4 + 3  # all, two roles, four halvings, confirmation


def test_the_sum_under_estimating_is_trimmed_by_measurement():
    groups, errors = _blocks(4, {"a": 0.02, "b": 0.02, "c": 0.02})
    calls = []

    def correlated(names):  # errors that add in amplitude, not in energy
        calls.append(frozenset(names))
        return sum(errors[n] for n in names)

    result = search(groups, dict.fromkeys(errors, 1.0), correlated, 0.05, 24)
    assert result.measured <= 0.05 and correlated(result.chosen) <= 0.05
    assert any("left out" in step for step in result.steps)


def test_tables_are_taken_first():
    errors = {"table": 0.03, "fc": 0.03, "q": 0.03}
    groups = [("tables", ["table"]), ("fc", ["fc"]), ("q", ["q"])]
    value = {"table": 1.0, "fc": 1e9, "q": 1e9}
    result = search(groups, value, _additive(errors, []), 0.05, 24, first={"table"})
    assert "table" in result.chosen and len(result.chosen) == 2


def test_trimming_keeps_the_tables_while_linears_can_go():
    errors = {"table": 0.02, "fc": 0.02, "q": 0.02}
    groups = [("tables", ["table"]), ("fc", ["fc"]), ("q", ["q"])]
    value = {"table": 1.0, "fc": 1e9, "q": 1e9}  # per error, the table is worth least

    def correlated(names):  # the sum of energies under-estimates: the confirmation trims
        return sum(errors[n] for n in names)

    result = search(groups, value, correlated, 0.045, 24, first={"table"})
    assert "table" in result.chosen and result.measured <= 0.045 and len(result.chosen) == 2


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_roles_group_the_blocks_layers(exporter):
    model = load_model(FACEAGE[exporter])
    found = roles([(lin.name, lin.input, lin.output, lin.kn()) for lin in find_linears(model)])
    sizes = Counter(found.values())
    # 4 blocks: rotary q and k told apart by order, v, o, fc1, fc2; then the neck and two heads alone
    assert sorted(sizes.values()) == [1, 1, 1, 4, 4, 4, 4, 4, 4]
    assert sum("MatMul:1(Softmax)" in r for r in sizes) == 1  # the value projections


def _timer(fp32: float, cost: dict[str, float], calls: list):
    """Run times that add: fp32's, plus each int8 part's cost (negative: it saves time)."""

    def timer(variants: list[set[str]]) -> tuple[float, list[float]]:
        calls.append([frozenset(v) for v in variants])
        return fp32, [fp32 + sum(cost[n] for n in v) for v in variants]

    return timer


def test_a_variant_faster_than_fp32_is_timed_once_and_kept():
    calls = []
    cost = {"q0": -0.2, "q1": -0.2, "conv0": 0.05}
    check = keep_fast(set(cost), [("q", ["q0", "q1"]), ("convs", ["conv0"])], _timer(1.0, cost, calls))
    assert len(calls) == 1 and check.kept == []
    assert check.speedup == check.first == pytest.approx(1 / 0.65)


def test_groups_that_cost_time_are_kept_fp32_and_the_rest_timed_again():
    """The Convs cost more than they save: without them the variant is faster; the Linears stay int8."""
    calls = []
    cost = {"q0": -0.05, "q1": -0.05, "conv0": 0.1, "conv1": 0.1, "fc": -0.01}
    groups = [("q", ["q0", "q1"]), ("convs", ["conv0", "conv1"]), ("fc", ["fc"]), ("absent", ["other"])]
    check = keep_fast(set(cost), groups, _timer(1.0, cost, calls))
    assert check.first == pytest.approx(1 / 1.09) and check.first < 1 + SPEED_MARGIN
    # the second call: the chosen variant beside it without each group (a group none of whose parts is chosen: none)
    assert calls[1][0] == frozenset(cost) and set(calls[1][1:]) == {frozenset(cost) - set(g) for _, g in groups[:3]}
    assert [(label, names) for label, names, _ in check.kept] == [("convs", ["conv0", "conv1"])]
    assert check.kept_names == {"conv0", "conv1"}
    assert calls[2] == [frozenset({"q0", "q1", "fc"})]  # what is left, timed against fp32
    assert check.speedup == pytest.approx(1 / 0.89) and check.with_all == pytest.approx(1 / 1.09)
    assert check.kept[0][2] == pytest.approx(1 / 0.89)  # the variant's speed-up without that group


def test_nothing_faster_keeps_everything_fp32_and_measures_it():
    calls = []
    cost = {"a": 0.1, "b": 0.2}
    check = keep_fast(set(cost), [("a", ["a"]), ("b", ["b"])], _timer(1.0, cost, calls))
    assert check.kept_names == {"a", "b"} and calls[-1] == [frozenset()]
    assert check.speedup == pytest.approx(1.0) and check.first == pytest.approx(1 / 1.3)


def test_groups_within_the_timing_margin_stay_int8_and_the_last_measurement_is_reported():
    """Not faster by the margin, but no group's removal makes it faster by the margin either (one saves a little,
    one costs a little: noise would decide): nothing is kept fp32."""
    calls = []
    cost = {"a": -0.03, "b": 0.02}
    check = keep_fast(set(cost), [("a", ["a"]), ("b", ["b"])], _timer(1.0, cost, calls))
    assert check.kept == [] and len(calls) == 2 and check.speedup == pytest.approx(1 / 0.99)
    assert check.int8 == {"a", "b"}
    assert keep_fast(set(), [("a", ["a"])], _timer(1.0, cost, calls)).runs == 0 and len(calls) == 2  # nothing int8


def test_without_trim_a_slower_variant_is_timed_once_and_nothing_is_kept_fp32():
    """What int8 does by default: the speed measured and reported, the variant left as the error search chose it."""
    calls = []
    cost = {"a": 0.1, "b": 0.2}
    check = keep_fast(set(cost), [("a", ["a"]), ("b", ["b"])], _timer(1.0, cost, calls), trim=False)
    assert len(calls) == 1 and check.kept == [] and not check.trimmed
    assert check.int8 == {"a", "b"} and check.speedup == pytest.approx(1 / 1.3)
    assert keep_fast(set(cost), [("a", ["a"])], _timer(1.0, cost, calls)).trimmed
