"""Outputs judged for what they are (verify/structure.py, verify/gate.py): a ranked detection list by
matching rows, integer labels by agreement; a refusal never names a bound that would accept anything."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.number_formats import FP16, FP32, INT8
from onnxsmith.int8_engine.measure import relative_output_error
from onnxsmith.release.variant import produce_variant
from onnxsmith.transforms.fp16 import Options as Fp16Options
from onnxsmith.verify import structure
from onnxsmith.verify.compare import compare_models
from onnxsmith.verify.gate import (
    Bounds,
    GateOptions,
    judge_all,
    judge_output,
    judge_tensor,
    severity,
    structured_outputs,
    structured_severity,
    verdict,
)
from onnxsmith.verify.structure import detection_layout

ROWS = 200  # anchors; all of them ranked, as an end-to-end head writes its top-k


def ranked_detector(
    mix: float = 0.0, height: float = 60.0, class_bias: float = 0.0, separate: bool = False
) -> onnx.ModelProto:
    """feat[ROWS, 8] -> dets[ROWS, 6] (x1, y1, x2, y2, score, class) sorted by score, as an end-to-end
    detector writes it on a random image: every score near 3e-4 and within 3 % of the others.

    ``mix``: how much feature 0 moves each score's logit (a tiny, row-dependent change that reorders
    near ties); ``height``: the boxes' largest height; ``class_bias``: added to class 2's logit;
    ``separate``: boxes[ROWS, 4], scores[ROWS], labels[ROWS] as three outputs instead."""
    inits = [
        numpy_helper.from_array(np.array([600, 600, 60, height], np.float32), "box_scale"),
        numpy_helper.from_array(np.array(8.0, np.float32), "min_size"),
        numpy_helper.from_array(np.array([0.0, 0.0, class_bias], np.float32), "class_bias"),
        numpy_helper.from_array(np.array(0.01, np.float32), "spread"),
        numpy_helper.from_array(np.array(mix, np.float32), "mix"),
        numpy_helper.from_array(np.array(-8.0, np.float32), "score_bias"),
        numpy_helper.from_array(np.array([ROWS], np.int64), "k"),
        numpy_helper.from_array(np.array([ROWS], np.int64), "flat"),
    ]

    def cols(name, out, lo, hi):
        const = [
            numpy_helper.from_array(np.array([v], np.int64), f"{out}_{what}") for what, v in (("s", lo), ("e", hi))
        ]
        inits.extend(const)
        axes = numpy_helper.from_array(np.array([1], np.int64), f"{out}_axes")
        inits.append(axes)
        return helper.make_node("Slice", [name, f"{out}_s", f"{out}_e", f"{out}_axes"], [out])

    nodes = [
        cols("feat", "box_raw", 0, 4),
        helper.make_node("Sigmoid", ["box_raw"], ["box_unit"]),
        helper.make_node("Mul", ["box_unit", "box_scale"], ["box_px"]),
        cols("box_px", "xy", 0, 2),
        cols("box_px", "wh_raw", 2, 4),
        helper.make_node("Add", ["wh_raw", "min_size"], ["wh"]),
        helper.make_node("Add", ["xy", "wh"], ["xy2"]),
        helper.make_node("Concat", ["xy", "xy2"], ["boxes_all"], axis=1),
        cols("feat", "logits_raw", 4, 7),
        helper.make_node("Add", ["logits_raw", "class_bias"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["cls_i"], axis=1, keepdims=1),
        helper.make_node("Cast", ["cls_i"], ["cls"], to=TensorProto.FLOAT),
        cols("feat", "s_raw", 7, 8),
        cols("feat", "f0", 0, 1),
        helper.make_node("Mul", ["s_raw", "spread"], ["s_a"]),
        helper.make_node("Mul", ["f0", "mix"], ["s_b"]),
        helper.make_node("Add", ["s_a", "s_b"], ["s_c"]),
        helper.make_node("Add", ["s_c", "score_bias"], ["s_d"]),
        helper.make_node("Sigmoid", ["s_d"], ["score"]),
        helper.make_node("Reshape", ["score", "flat"], ["score_flat"]),
        helper.make_node("TopK", ["score_flat", "k"], ["top_scores", "order"], axis=0, largest=1, sorted=1),
    ]
    if separate:
        nodes += [
            helper.make_node("Gather", ["boxes_all", "order"], ["boxes"], axis=0),
            helper.make_node("Identity", ["top_scores"], ["scores"]),
            helper.make_node("Reshape", ["cls_i", "flat"], ["cls_flat"]),
            helper.make_node("Gather", ["cls_flat", "order"], ["labels"], axis=0),
        ]
        outputs = [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [ROWS, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [ROWS]),
            helper.make_tensor_value_info("labels", TensorProto.INT64, [ROWS]),
        ]
    else:
        nodes += [
            helper.make_node("Concat", ["boxes_all", "score", "cls"], ["rows"], axis=1),
            helper.make_node("Gather", ["rows", "order"], ["dets"], axis=0),
        ]
        outputs = [helper.make_tensor_value_info("dets", TensorProto.FLOAT, [ROWS, 6])]
    graph = helper.make_graph(
        nodes, "ranked_detector", [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [ROWS, 8])], outputs, inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _feeds(samples: int = 2) -> list[dict[str, np.ndarray]]:
    return [{"feat": np.random.default_rng(s).standard_normal((ROWS, 8)).astype(np.float32)} for s in range(samples)]


def _save(tmp_path, name: str, model: onnx.ModelProto):
    path = tmp_path / name
    onnx.save(model, path)
    return path


# ---------------------------------------------------------------- a ranked detection list, end to end


def test_a_reordered_detection_list_that_matches_is_accepted(tmp_path):
    source = _save(tmp_path, "source.onnx", ranked_detector())
    reordered = _save(tmp_path, "reordered.onnx", ranked_detector(mix=2e-4))
    comparison = compare_models(source, reordered, _feeds())
    (dets,) = comparison.outputs
    assert comparison.passed, comparison.verdict()
    assert dets.kind == "detections" and dets.agreement == 1.0
    assert dets.detections["matched"] == dets.detections["required"] >= 100
    assert dets.detections["lowest_iou"] == 1.0  # the same boxes, in another order
    # The rows did move: by position, the same outputs are far apart (what the gate judged before).
    from onnxsmith.runtime.runner import prepare_session, run_all

    outs = []
    for path in (source, reordered):
        session, model, _ = prepare_session(path)
        outs.append(run_all(session, model, _feeds(), path)["dets"])
    positional = judge_tensor("dets", outs[0], outs[1], comparison.bounds)
    assert not positional.passed and positional.cosine < 0.99
    assert "detections: " not in comparison.verdict()


@pytest.mark.parametrize(
    ("defect", "what"),
    [({"height": 75.0}, "a box moved"), ({"class_bias": 0.6}, "a class changed")],
)
def test_a_detection_list_with_a_moved_box_or_changed_class_is_refused(tmp_path, defect, what):
    source = _save(tmp_path, "source.onnx", ranked_detector())
    broken = _save(tmp_path, "broken.onnx", ranked_detector(mix=2e-4, **defect))
    comparison = compare_models(source, broken, _feeds())
    (dets,) = comparison.outputs
    assert not comparison.passed, what
    assert dets.kind == "detections" and "detections" in dets.failed
    assert dets.detections["missing"] > 0 and dets.detections["extra"] > 0
    line = comparison.verdict()
    assert "detections: " in line and "matched (same class, IoU >= " in line and "\n" not in line


def test_separate_boxes_scores_and_labels_are_one_detection_list(tmp_path):
    source = _save(tmp_path, "source.onnx", ranked_detector(separate=True))
    reordered = _save(tmp_path, "reordered.onnx", ranked_detector(mix=2e-4, separate=True))
    comparison = compare_models(source, reordered, _feeds())
    assert comparison.passed, comparison.verdict()
    assert [o.kind for o in comparison.outputs] == ["detections"] * 3
    assert [o.name for o in comparison.outputs] == ["boxes", "scores", "labels"]
    broken = _save(tmp_path, "broken.onnx", ranked_detector(mix=2e-4, class_bias=0.6, separate=True))
    refused = compare_models(source, broken, _feeds())
    assert not any(o.passed for o in refused.outputs)


def test_the_fp16_variant_of_a_ranked_detector_is_written(tmp_path):
    """The issue's case: fp16 rounds the near-tied scores (3e-4, within 3 %) and reorders the rows."""
    source = _save(tmp_path, "source.onnx", ranked_detector())
    result = produce_variant(source, tmp_path / "fp16.onnx", [("fp16", Fp16Options())], feeds=_feeds())
    assert (tmp_path / "fp16.onnx").exists()
    (dets,) = result.comparison.outputs
    assert result.comparison.bounds.format == "fp16" and dets.kind == "detections" and dets.passed


# ---------------------------------------------------------------- the judging function, on arrays


def _ranked_rows(rng, sets: int = 2, rows: int = 300, top: float = 0.9):
    """[sets, rows, 6] lists ranked by score: a few confident detections, then near-tied tiny scores."""
    data = np.zeros((sets, rows, 6))
    xy = rng.uniform(0, 600, (sets, rows, 2))
    data[..., 0:2] = xy
    data[..., 2:4] = xy + rng.uniform(10, 80, (sets, rows, 2))
    scores = np.concatenate([np.linspace(top, 0.5, 5), rng.uniform(1e-3, 1.1e-3, rows - 5)])
    data[..., 4] = np.sort(scores)[::-1]
    data[..., 5] = rng.integers(0, 80, (sets, rows))
    return data


def test_judging_matches_rows_not_positions():
    rng = np.random.default_rng(0)
    ref = _ranked_rows(rng)
    test = ref.copy()
    test[..., 4] *= 1 + rng.uniform(-2e-4, 2e-4, test.shape[:-1])  # rounding-sized score changes ...
    test[..., :4] += rng.uniform(-0.05, 0.05, test[..., :4].shape)  # ... and box changes
    order = np.argsort(-test[..., 4], axis=1, kind="stable")  # ... that reorder the near ties
    test = np.take_along_axis(test, order[..., None], axis=1)
    assert not np.array_equal(order, np.broadcast_to(np.arange(300), order.shape))
    assert detection_layout("output0", ref) is not None
    bounds = Bounds.for_format(FP16)
    diff = judge_output("output0", ref, test, bounds)
    assert diff.passed and diff.kind == "detections", diff.problem(bounds)
    assert not judge_tensor("output0", ref, test, bounds).passed  # by position: refused

    moved = test.copy()
    moved[0, 0, [0, 2]] += 40  # the best detection of the first list shifted by 40 px
    diff = judge_output("output0", ref, moved, bounds)
    assert not diff.passed and diff.detections["missing"] == 1 and diff.detections["extra"] == 1
    relabelled = test.copy()
    relabelled[1, 2, 5] = (relabelled[1, 2, 5] + 1) % 80  # a confident detection's class
    assert not judge_output("output0", ref, relabelled, bounds).passed
    lower = test.copy()
    lower[0, 0, 4] = 0.45  # the best score 0.9 -> 0.45: matched, but its value is out of bounds
    diff = judge_output("output0", ref, lower, bounds)
    assert not diff.passed and "values" in diff.failed and diff.detections["missing"] == 0


def test_the_match_bound_follows_the_format():
    assert Bounds.for_format(FP32).min_iou > Bounds.for_format(FP16).min_iou > Bounds.for_format(INT8).min_iou
    assert Bounds.for_format(FP16).min_iou == pytest.approx(1 - 3 / 32)


def test_only_what_clearly_is_a_detection_list_is_judged_as_one():
    rng = np.random.default_rng(3)
    assert detection_layout("y", rng.standard_normal((2, 50, 6))) is None  # no score, no class column
    probs = rng.uniform(0, 1, (2, 50, 6))
    assert detection_layout("y", probs) is None  # scores, but unranked and no class
    ranked = _ranked_rows(rng)
    assert detection_layout("y", ranked) is not None  # a ranked score and a class column: by its values
    unranked = ranked[:, rng.permutation(300)]
    assert detection_layout("y", unranked) is None
    for hint in ("dets", "output0", "boxes", "nms_out"):  # a name never makes a raw grid a list
        assert detection_layout(hint, unranked) is None, hint
    assert judge_output("y", probs, probs.copy(), Bounds.for_format(FP16)).kind == "tensor"


def _raw_grid(rng, sets: int = 1, anchors: int = 3549) -> np.ndarray:
    """[sets, anchors, 6] a YOLO head's raw rows, one per anchor in grid order: boxes (centre, size in
    pixels), a score in [0, 1] and a class, neither sorted nor filtered."""
    grid = np.zeros((sets, anchors, 6))
    grid[..., 0:2] = rng.uniform(0, 416, (sets, anchors, 2))
    grid[..., 2:4] = rng.uniform(8, 120, (sets, anchors, 2))
    grid[..., 4] = rng.uniform(0, 1, (sets, anchors)) ** 8
    grid[..., 5] = rng.integers(0, 2, (sets, anchors))
    return grid


def test_a_raw_detector_grid_is_judged_as_a_tensor_not_a_detection_list():
    """A raw grid's row i is anchor i: a variant whose rows moved to other anchors is another output, though
    as a set of rows it is the same (matched by IoU, named ``output0``, it was accepted)."""
    rng = np.random.default_rng(12)
    grid = _raw_grid(rng)
    assert detection_layout("output0", grid) is None and detection_layout("det_boxes", grid) is None
    swapped = grid.copy()
    swapped[0, 0:-1:2] = grid[0, 1::2]  # neighbouring anchors' rows exchanged: as a list, the same rows
    swapped[0, 1::2] = grid[0, 0:-1:2]
    for fmt in (FP16, INT8):
        bounds = Bounds.for_format(fmt)
        diff = judge_output("output0", grid, swapped, bounds)
        assert diff.kind == "tensor" and diff.detections is None and not diff.passed, fmt.name
        assert judge_output("output0", grid, grid.copy(), bounds).passed
    # Separate boxes and scores outputs of a raw grid, unranked, stay tensors as well.
    separate = {"boxes": grid[..., :4], "scores": grid[..., 4], "labels": grid[..., 5].astype(np.int64)}
    assert structure.separate_detections(separate) == []
    order = np.argsort(-grid[..., 4], axis=1)  # the same rows ranked by score: a detection list
    ranked = {k: v[:, order[0]] for k, v in separate.items()}
    (layout,) = structure.separate_detections(ranked)
    assert layout.outputs == ("boxes", "scores", "labels")
    assert detection_layout("y", grid[:, order[0]]) is not None


# ---------------------------------------------------------------- labels


def _labels_model(flip: int = 0, rows: int = 1000) -> onnx.ModelProto:
    """x[rows, 4] -> labels[rows] = argmax; the variant (``flip`` > 0) holds an fp16 nudge that moves
    the first ``flip`` rows to class 3."""
    nudge = np.zeros((rows, 4), np.float16)
    nudge[:flip, 3] = 100
    nodes = [helper.make_node("ArgMax", ["z" if flip else "x"], ["labels"], axis=1, keepdims=0)]
    inits = []
    if flip:
        inits = [numpy_helper.from_array(nudge, "nudge")]
        nodes[:0] = [
            helper.make_node("Cast", ["nudge"], ["nudge32"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["x", "nudge32"], ["z"]),
        ]
    graph = helper.make_graph(
        nodes,
        "labels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 4])],
        [helper.make_tensor_value_info("labels", TensorProto.INT64, [rows])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_labels_are_judged_by_agreement_at_a_coarser_format(tmp_path):
    source = _save(tmp_path, "source.onnx", _labels_model())
    variant = _save(tmp_path, "variant.onnx", _labels_model(flip=5))  # 5 of 1000: 0.5 % changed
    x = np.random.default_rng(0).standard_normal((1000, 4)).astype(np.float32)
    x[np.arange(1000), np.arange(1000) % 3] += 10  # class 0, 1 or 2; never 3 but for the nudge
    feeds = [{"x": x}]
    passed = compare_models(source, variant, feeds)
    (labels,) = passed.outputs
    assert passed.bounds.format == "fp16" and passed.bounds.min_agreement == 0.99
    assert passed.passed and labels.kind == "labels" and labels.agreement == pytest.approx(0.995)
    strict = compare_models(source, variant, feeds, min_agreement=1.0)
    assert not strict.passed
    line = strict.verdict()
    assert "labels: 99.50% equal" in line and "--min-agreement 0.995 would accept it" in line
    # At fp32 (the same model, reordered) labels must be equal, as before.
    assert Bounds.for_format(FP32).min_agreement == 1.0


def test_min_agreement_is_an_option_of_every_command(cli, tmp_path):
    source = _save(tmp_path, "source.onnx", _labels_model())
    variant = _save(tmp_path, "variant.onnx", _labels_model(flip=5))
    x = np.random.default_rng(0).standard_normal((1000, 4)).astype(np.float32)
    x[np.arange(1000), np.arange(1000) % 3] += 10
    np.savez(tmp_path / "x.npz", x=x)
    assert cli("compare", source, variant, "--inputs", tmp_path / "x.npz").returncode == 0
    refused = cli("compare", source, variant, "--inputs", tmp_path / "x.npz", "--min-agreement", "1")
    assert refused.returncode == 1 and "--min-agreement 0.995 would accept it" in " ".join(refused.stdout.split())
    bad = cli("compare", source, variant, "--inputs", tmp_path / "x.npz", "--min-agreement", "2")
    assert bad.returncode == 2 and "share in [0, 1]" in bad.stderr
    validated = cli(
        "validate", source, variant, "--task", "generic", "--data", tmp_path / "x.npz", "--min-agreement", "1"
    )
    assert validated.returncode == 1, validated.stdout
    with pytest.raises(ValueError, match="min_agreement"):
        GateOptions(min_agreement=1.5)


# ---------------------------------------------------------------- what a refusal suggests


def test_a_refusal_never_suggests_a_bound_that_accepts_anything():
    rng = np.random.default_rng(4)
    ref = rng.standard_normal((2, 30, 40))
    wild = rng.standard_normal(ref.shape)  # unrelated: cosine ~0
    bounds = Bounds.for_format(FP16)
    diff = judge_output("y", ref, wild, bounds)
    line = verdict([diff], bounds)
    assert not diff.passed and diff.needed == {}
    assert "far from the source: no bound short of accepting anything accepts it" in line and "--" not in line
    labels = rng.integers(0, 10, (2, 500))
    scrambled = rng.integers(0, 10, labels.shape)  # 10 % agree
    diff = judge_output("ids", labels, scrambled, bounds)
    assert not diff.passed and "far from the source" in verdict([diff], bounds)
    # A variant near its source still gets the bound that accepts it.
    near = ref + rng.standard_normal(ref.shape) * 0.05
    diff = judge_output("y", ref, near, bounds)
    assert not diff.passed and "would accept it" in verdict([diff], bounds)
    assert judge_output("y", ref, near, Bounds.for_format(FP16, GateOptions(**diff.needed))).passed


def test_judge_all_keeps_the_reference_order_and_reports_json():
    rng = np.random.default_rng(5)
    ref = {"y": rng.standard_normal((1, 4, 20)), "dets": _ranked_rows(rng, sets=1)}
    diffs = judge_all(ref, {k: v.copy() for k, v in ref.items()}, Bounds.for_format(FP16))
    assert [d.name for d in diffs] == ["y", "dets"] and [d.kind for d in diffs] == ["tensor", "detections"]
    data = diffs[1].to_json()
    assert data["kind"] == "detections" and data["detections"]["matched"] == data["detections"]["required"]


def test_detections_where_the_source_has_none_are_new():
    rng = np.random.default_rng(6)
    ref = _ranked_rows(rng)
    ref[1, :, 4] = 0  # the second list: nothing detected
    invented = ref.copy()
    invented[1, :3, 4] = 0.8
    bounds = Bounds.for_format(FP16)
    assert judge_output("dets", ref, ref.copy(), bounds).passed
    diff = judge_output("dets", ref, invented, bounds)
    assert not diff.passed and diff.detections["extra"] == 3


# ---------------------------------------------------------------- top-k: sorted values and their indices


def _topk(scores: np.ndarray, k: int = 5) -> dict[str, np.ndarray]:
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    return {"values": np.take_along_axis(scores, order, -1), "indices": order}


def test_top_k_indices_are_judged_as_sets_within_near_ties():
    rng = np.random.default_rng(7)
    scores = rng.standard_normal((2, 40, 64))
    source = _topk(scores)
    assert structure.ranked_pairs(source) == [structure.RankedPair("values", "indices", True)]
    variant = _topk(scores + rng.standard_normal(scores.shape) * 2e-3)  # fp16-sized moves reorder near ties
    moved = float(np.mean(variant["indices"] != source["indices"]))
    assert 0.01 < moved < 0.2
    bounds = Bounds.for_format(FP16)
    values, indices = judge_all(source, variant, bounds)
    assert values.passed and indices.passed and indices.kind == "topk" and indices.agreement == 1.0
    assert not judge_output("indices", source["indices"], variant["indices"], bounds).passed  # by position
    # Indices that no near tie explains are refused, although every value is the source's.
    rolled = {"values": source["values"].copy(), "indices": np.roll(source["indices"], 1, axis=-1)}
    _, indices = judge_all(source, rolled, bounds)
    assert not indices.passed and "top-k indices: " in verdict([indices], bounds)


def test_only_a_sorted_output_beside_distinct_named_indices_is_a_top_k():
    rng = np.random.default_rng(8)
    source = _topk(rng.standard_normal((1, 4, 30)))
    assert structure.ranked_pairs({"values": source["values"], "ids": source["indices"]}) == []  # no index name
    unsorted = {"values": rng.standard_normal((1, 4, 5)), "indices": source["indices"]}
    assert structure.ranked_pairs(unsorted) == []
    repeated = {"values": source["values"], "indices": np.zeros_like(source["indices"])}  # not distinct
    assert structure.ranked_pairs(repeated) == []
    two = {**source, "order": source["indices"].copy()}  # ambiguous: two index outputs for one list
    assert structure.ranked_pairs(two) == []


# ---------------------------------------------------------------- CTC label sequences


def _ctc_frames(rng, sequences: int = 4, frames: int = 40) -> np.ndarray:
    """[1, sequences, frames] CTC frame labels: blank (0) between runs of 2-3 frames of a character."""
    out = np.zeros((1, sequences, frames), np.int64)
    for s in range(sequences):
        t = 1
        while t < frames - 4:
            out[0, s, t : t + rng.integers(2, 4)] = rng.integers(1, 30)
            t += 5
    return out


def test_ctc_sequences_are_judged_by_their_collapsed_text():
    rng = np.random.default_rng(9)
    source = _ctc_frames(rng)
    assert structure.ctc_frames("ctc_labels", source) is not None
    assert structure.ctc_frames("labels", source) is None  # an integer output is a sequence only by its name too
    shifted = source.copy()
    shifted[0, 0, 1] = 0  # a run starts one frame later: the same text
    bounds = Bounds.for_format(FP32)  # labels must be equal: the text must be
    diff = judge_output("ctc_labels", source, shifted, bounds)
    assert diff.passed and diff.kind == "sequences" and diff.sequences["equal"] == 4
    assert diff.sequences["error_rate"] == 0
    assert not judge_output("labels", source, shifted, bounds).passed  # frame by frame: 1 of 160 moved
    inserted = source.copy()
    inserted[0, 1, 4] = 31  # a new character between two runs
    diff = judge_output("ctc_labels", source, inserted, bounds)
    assert not diff.passed and diff.sequences["equal"] == 3 and diff.sequences["edits"] == 1
    assert "equal after CTC collapse, character error rate " in verdict([diff], bounds)
    assert structure.ctc_collapse(np.array([0, 3, 3, 0, 3, 5, 5, 0])) == [[3, 3, 5]]


def test_ctc_probabilities_are_judged_as_a_tensor_and_by_their_text():
    rng = np.random.default_rng(10)
    frames = _ctc_frames(rng)
    probs = np.full((*frames.shape, 32), 0.1 / 31)
    np.put_along_axis(probs, frames[..., None], 0.9, axis=-1)
    assert structure.ctc_frames("softmax_0.tmp", probs) is not None  # by its values, whatever its name
    bounds = Bounds.for_format(FP16)
    assert judge_output("softmax_0.tmp", probs, probs * (1 + 1e-3), bounds).passed
    flipped = probs.copy()
    flipped[0, 0, 4] = probs[0, 0, 4] * 0.0  # frame 4 of sequence 0 ...
    flipped[0, 0, 4, 0], flipped[0, 0, 4, 7] = 0.45, 0.55  # ... was blank 0.9, now character 7 by a hair
    diff = judge_output("softmax_0.tmp", probs, flipped, bounds)
    assert not diff.passed and "sequences" in diff.failed and diff.sequences["edits"] == 1


# ---------------------------------------------------------------- probabilities


def test_probabilities_are_judged_by_their_row_magnitude_not_relative_to_tiny_values():
    """A softmax over 1000 classes: the per-value bound's channel (the row's RMS) already makes the bound on a
    tiny probability absolute, so no rule of its own is needed: doubling 1e-7 passes, a moved argmax fails."""
    rng = np.random.default_rng(11)
    logits = rng.standard_normal((2, 4, 1000)) * 3
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert structure.probabilities(probs) and not structure.probabilities(logits)
    bounds = Bounds.for_format(FP16)
    tiny = probs.copy()
    tiny[probs < 1e-6] *= 2  # every tiny probability off by 100 %
    assert judge_output("probs", probs, tiny, bounds).passed
    rounded = probs.astype(np.float16).astype(np.float64)
    assert judge_output("probs", probs, rounded, bounds).passed
    swapped = probs.copy()
    top = np.argmax(probs, axis=-1)
    np.put_along_axis(swapped, top[..., None], 0.0, axis=-1)  # the top class loses its probability
    diff = judge_output("probs", probs, swapped, bounds)
    assert not diff.passed and diff.argmax_agreement == 0.0


def _sigmoid_map(rng, sets: int = 4, size: int = 96, text: bool = False) -> np.ndarray:
    """[sets, 1, 1, size, size] a text detector's Sigmoid map: ~1e-7 everywhere (a photo with no text), or
    with ``text`` a few blocks of probabilities near 1 whose edges cross 0.5."""
    logits = rng.normal(-16, 1.5, (sets, 1, 1, size, size))
    if text:
        for s in range(sets):
            for r in (10, 40, 70):
                logits[s, 0, 0, r : r + 12, 8 : size - 8] = rng.normal(4, 3, (12, size - 16))
    return 1 / (1 + np.exp(-logits))


def test_a_sigmoid_map_near_zero_with_tiny_absolute_noise_passes():
    """ppocr_det's fp16 variant on photo crops: every probability ~1e-7, moved by ~1e-8; cosine (0.996 there)
    measures that noise, not the map. Its probabilities and decisions are what it means: accepted."""
    rng = np.random.default_rng(13)
    ref = _sigmoid_map(rng)
    noisy = ref * (1 + rng.normal(0, 0.1, ref.shape))  # |Δp| ~1e-8: fp16 holds 1e-7 with few bits
    bounds = Bounds.for_format(FP16)
    positional = judge_tensor("sigmoid_0.tmp_0", ref, noisy, bounds)
    assert not positional.passed and "cosine" in positional.failed and "values" not in positional.failed
    diff = judge_output("sigmoid_0.tmp_0", ref, noisy, bounds)
    assert diff.passed, diff.problem(bounds)
    assert diff.probabilities["kind"] == "sigmoid" and diff.probabilities["waived"]
    assert diff.probabilities["rms_delta"] < 1e-7 and diff.probabilities["agreement"] == 1.0
    assert severity({"m": ref}, {"m": noisy}, bounds) <= 1  # what the fp16 repair measures agrees
    # A map with text, rounded to fp16: passes as it did (its cosine holds), decisions the same.
    text = _sigmoid_map(rng, text=True)
    diff = judge_output("m", text, text.astype(np.float16).astype(np.float64), bounds)
    assert diff.passed and not diff.probabilities["waived"]


@pytest.mark.parametrize("fmt", [FP16, INT8])
def test_a_probability_map_far_off_is_refused(fmt):
    rng = np.random.default_rng(14)
    bounds = Bounds.for_format(fmt)
    for ref in (_sigmoid_map(rng), _sigmoid_map(rng, text=True)):
        shifted = np.clip(ref + 0.05, 0, 1)  # every probability moved by 0.05
        diff = judge_output("m", ref, shifted, bounds)
        assert not diff.passed and diff.probabilities["rms_delta"] > bounds.probability_rms
        assert "--" not in verdict([diff], bounds) or ref.max() > 0.5  # a near-zero map: far from the source
    # Decisions flipped on 2 % of the pixels of a map with text, each across 0.5 by 0.09 (beyond a near tie):
    # cosine and every value's bound hold (at fp16), the thresholded text does not.
    ref = _sigmoid_map(rng, text=True)
    chosen = rng.choice(np.flatnonzero(ref > 0.9), int(0.02 * ref.size), replace=False)
    ref.flat[chosen] = 0.5 + rng.choice([-0.045, 0.045], chosen.size)
    flipped = ref.copy()
    flipped.flat[chosen] = 1 - ref.flat[chosen]
    tensor = judge_tensor("m", ref, flipped, bounds)
    diff = judge_output("m", ref, flipped, bounds)
    assert not diff.passed and "decisions" in diff.failed
    assert diff.probabilities["agreement"] < 0.99
    line = verdict([diff], bounds)
    assert "sigmoid probabilities: " in line and "decisions " in line and "\n" not in line
    if fmt is FP16:
        assert tensor.passed  # as a tensor it passed: the decisions are what refuse it
    # Flips by a hair where the source is itself a near tie at 0.5 are excused.
    tie = ref.copy()
    tie.flat[chosen] = 0.5 + np.where(ref.flat[chosen] > 0.5, 1e-5, -1e-5)
    near = tie.copy()
    near.flat[chosen] = 0.5 - (tie.flat[chosen] - 0.5)
    assert judge_output("m", tie, near, bounds).probabilities["agreement"] == 1.0


def test_a_softmax_is_decided_by_argmax_along_its_axis():
    rng = np.random.default_rng(15)
    logits = rng.standard_normal((2, 3, 8, 8)) * 4  # a segmentation softmax over axis 1 (classes)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    kind = structure.probability_kind(probs)
    assert kind is not None and kind.name == "softmax" and kind.axis == 1
    assert structure.probability_kind(logits) is None
    assert structure.probability_kind(_sigmoid_map(rng)).name == "sigmoid"
    bounds = Bounds.for_format(FP16)
    assert judge_output("p", probs, probs.astype(np.float16).astype(np.float64), bounds).passed
    swapped = probs[:, ::-1].copy()  # classes reversed: every argmax moves
    diff = judge_output("p", probs, swapped, bounds)
    assert not diff.passed and diff.probabilities["agreement"] < 0.9
    assert "far from the source" in verdict([diff], bounds)


def test_a_softmax_with_a_few_small_probabilities_moved_passes_where_a_sigmoid_map_does_not():
    """ppocr_rec fused to fp16: a few small probabilities beyond their own bound (0.006 -> 0.009), the argmax
    and RMS |Δp| held: a softmax is decided by its argmax, accepted. The same values as a sigmoid map (its
    threshold the user's) are refused value by value."""
    rng = np.random.default_rng(15)
    logits = rng.standard_normal((3, 40, 300)) * 2
    logits[..., 0] += 8  # a CTC-like row: one class near 1, the rest small
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    bounds = Bounds.for_format(FP16)
    moved = probs.copy()
    rows = rng.choice(40, 4, replace=False)
    for r in rows:  # one small probability per row, off by 55 %: beyond rtol·(p + channel)
        c = 1 + int(np.argmax(probs[0, r, 1:]))
        moved[0, r, c] *= 1.55
    positional = judge_tensor("softmax_0", probs, moved, bounds)
    assert not positional.passed and "values" in positional.failed
    diff = judge_output("softmax_0", probs, moved, bounds)
    assert diff.passed and diff.probabilities["kind"] == "softmax" and diff.probabilities["waived"]
    # The same moved values in a sigmoid map (no axis sums to 1): each value is still judged.
    sig = np.concatenate([probs[..., :150], probs[..., 150:]], axis=1) * 0.5
    sig_moved = np.concatenate([moved[..., :150], moved[..., 150:]], axis=1) * 0.5
    assert structure.probability_kind(sig).name == "sigmoid"
    diff = judge_output("sigmoid_0", sig, sig_moved, bounds)
    assert not diff.passed and "values" in diff.failed
    # A softmax whose probabilities moved far (RMS beyond the bound) is refused however its argmax holds.
    far = probs.copy()
    far[..., 0] -= 0.2
    far[..., 1] += 0.2
    assert not judge_output("softmax_0", probs, far, bounds).passed


def test_the_structured_judge_speaks_only_where_an_output_is_a_decision():
    """int8's search measures its choices with it (TransformContext.structured_judge): on a detection list the gate's
    share of its bounds, where the positional error of a reordered list is large; on labels the share that flip
    of the share allowed, not their distance as numbers; None for a plain tensor."""
    rng = np.random.default_rng(0)
    ref = {"output0": _ranked_rows(rng)}
    reordered = ref["output0"].copy()
    reordered[:, 5:] = reordered[:, 5:][:, ::-1]  # the near-tied tail reversed: the same detections
    bounds = Bounds.for_format(INT8, GateOptions(min_cosine=0.995))
    assert structured_outputs(ref) == ["output0"]
    assert structured_severity(ref, {"output0": reordered}, bounds=bounds) <= 1
    assert np.linalg.norm(reordered - ref["output0"]) / np.linalg.norm(ref["output0"]) > 0.1  # by position
    tensor = {"y": rng.normal(size=(2, 300, 6))}
    assert structured_outputs(tensor) == [] and structured_severity(tensor, tensor, bounds=bounds) is None
    # A token tagger's labels: one flip in 1000 from class 3 to 40 uses a tenth of the 1 % allowed, and as numbers
    # it is far (||Δ|| / ||labels|| 0.37): the search's relative error leaves labels to the gate.
    labels = {"tags": np.full((2, 500), 3, np.int64), "logits": rng.normal(size=(2, 500, 8))}
    flipped = {**labels, "tags": labels["tags"].copy()}
    flipped["tags"][0, 7] = 40
    assert structured_outputs(labels) == ["tags"]
    assert structured_severity(labels, flipped, bounds=bounds) == pytest.approx(0.1)
    assert np.linalg.norm(flipped["tags"] - labels["tags"]) / np.linalg.norm(labels["tags"]) > 0.3
    unstack = [{k: v[i] for k, v in labels.items()} for i in range(2)]
    assert relative_output_error(unstack, [{k: v[i] for k, v in flipped.items()} for i in range(2)]) == 0.0


def test_int8_of_an_end_to_end_yolo_measures_its_choices_by_matched_detections(tmp_path, cli):
    """isbnx's YOLO (the issue's end-to-end head, [1, 300, 6] ranked by score): measured row by row, every Conv
    was 0.42-0.50 off alone and too little went int8 to write a variant; matched by the gate, the variant is
    written with its Convs int8 and every detection matched."""
    from onnxsmith.io.load import load_model
    from tests.support.fusion import op_count
    from tests.support.realmodels import real_model

    out = tmp_path / "int8.onnx"
    result = cli("int8", real_model("isbnx_yolo_e2e"), out, "--no-speed")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "detections 100% matched" in result.stdout
    assert op_count(load_model(out), "QuantizeLinear") > 10


def _speech_like(rng, sets=2, samples=22050) -> np.ndarray:
    """[sets, 1, 1, samples]: voiced tones with a decaying envelope over a little noise, at 22.05 kHz."""
    t = np.arange(samples) / 22050
    rows = []
    for _ in range(sets):
        f0 = rng.uniform(110, 240)
        voiced = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6.3)) / k for k in range(1, 6))
        rows.append(0.3 * voiced * np.exp(-2 * t) + 0.005 * rng.standard_normal(samples))
    return np.stack(rows)[:, None, None, :].astype(np.float32)


def test_audio_is_told_by_its_values():
    rng = np.random.default_rng(21)
    audio = _speech_like(rng)
    for signal in (audio, audio[:, :, 0], audio[:, 0, 0], np.concatenate([audio, audio], axis=2)):
        assert structure.waveform(signal), signal.shape
    assert not structure.waveform(rng.standard_normal((2, 1, 8000)).astype(np.float32))  # no neighbours alike
    assert not structure.waveform(np.sort(rng.standard_normal((2, 1, 8000)), axis=-1))  # sorted logits: one sign
    assert not structure.waveform(np.abs(audio))  # a magnitude, all one sign
    assert not structure.waveform(audio[..., :4000])  # too short to be heard as frames
    assert not structure.waveform(np.concatenate([audio] * 3, axis=2))  # three channels: not a signal's
    assert not structure.waveform(audio.astype(np.int16))


def test_audio_is_judged_frame_by_frame_in_its_spectrum():
    """A sample is no channel of its own: a lone sample off by a third of the signal's RMS (inaudible) passes as
    audio, where the per-sample bound refuses it; a click over a few ms fails by its frame's spectrum, with the
    options that would accept it; a signal turned upside down is far from the source."""
    rng = np.random.default_rng(22)
    ref = _speech_like(rng)
    bounds = Bounds.for_format(FP16)
    rounded = ref.astype(np.float16).astype(np.float32)
    assert judge_output("audio", ref, rounded, bounds).passed
    rms = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
    spike = ref.copy()
    quiet = int(np.argmin(np.abs(ref[0, 0, 0, 5000:6000]))) + 5000  # a zero crossing
    spike[0, 0, 0, quiet] += rms / 3
    assert "values" in judge_tensor("audio", ref, spike, bounds).failed
    diff = judge_output("audio", ref, spike, bounds)
    assert diff.kind == "waveform" and diff.passed, diff.problem(bounds)
    assert diff.waveform["worst_error"] < bounds.rtol and diff.argmax_agreement is None
    assert severity({"audio": ref}, {"audio": spike}, bounds) <= 1  # what the fp16 repair measures agrees
    click = ref.copy()
    click[1, 0, 0, 12000:12040] += 2 * rms  # 2 ms
    diff = judge_output("audio", ref, click, bounds)
    assert not diff.passed and "spectrum" in diff.failed and diff.worst_at[0] == 1
    assert 12000 - 1024 <= diff.waveform["worst_frame"] * 256 <= 12040
    line = verdict([diff], bounds)
    assert line.startswith("output 'audio': audio: frame ") and "SNR " in line and "--rtol" in line
    assert severity({"audio": click}, {"audio": ref}, bounds) > 1
    flipped = judge_output("audio", ref, -ref, bounds)
    assert not flipped.passed and "far from the source" in verdict([flipped], bounds)
    # int8's search measures its choices on audio with the gate too (TransformContext.structured_judge)
    assert structured_outputs({"audio": ref, "pooled": ref[..., :8]}) == ["audio"]
    assert structured_severity({"audio": ref}, {"audio": spike}, bounds=bounds) <= 1
    # An absolute bound on values, given, keeps the samples judged one by one.
    given = Bounds.for_format(FP16, GateOptions(atol=1e-6))
    assert judge_output("audio", ref, spike, given).kind == "tensor"
