"""Task adapters: WIDER FACE boxes, face-age preprocessing and decoding, metrics, the generic task."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from PIL import Image

from onnxsmith.core import options as opts
from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.io.load import load_model
from onnxsmith.release.validate import TaskRun, check_gates
from onnxsmith.tasks import get_task
from onnxsmith.tasks.base import Sample
from onnxsmith.tasks.faceage import coral_age, face_crop, face_tensor
from onnxsmith.tasks.widerface import padded_box, read_boxes
from tests.support.release import face_images, save_toy_faceage, toy_faceage, wider_annotations


def test_wider_face_format_with_flags_zero_faces_and_invalid(tmp_path):
    path = tmp_path / "gt.txt"
    path.write_text(
        "0--Parade/a.jpg\n2\n345 211 40 44 2 0 0 0 2 0 \n10 20 30 31 0 0 0 1 0 0\n"
        "1--Handshaking/b.jpg\n0\n0 0 0 0 0 0 0 0 0 0\n"
        "c.png\n1\n5 6 70 80\n"
    )
    boxes = read_boxes(path)
    assert [(b.image, b.index, b.x, b.y, b.w, b.h, b.invalid) for b in boxes] == [
        ("0--Parade/a.jpg", 0, 345, 211, 40, 44, False),
        ("0--Parade/a.jpg", 1, 10, 20, 30, 31, True),
        ("c.png", 0, 5, 6, 70, 80, False),
    ]
    assert boxes[2].line == 10 and boxes[2].id == "c.png#0"


@pytest.mark.parametrize(
    "text, line, needle",
    [
        ("a.jpg\ntwo\n", 2, "number of faces"),
        ("a.jpg\n2\n1 2 3 4\n", 3, "announces 2 faces"),
        ("a.jpg\n1\n1 2 x 4\n", 3, "must be numbers"),
        ("a.jpg\n1\n1 2 3\n", 3, "at least 'x y w h'"),
    ],
)
def test_wider_face_errors_name_the_line(tmp_path, text, line, needle):
    path = tmp_path / "gt.txt"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_boxes(path)
    assert f"gt.txt:{line}:" in err.value.one_line() and needle in err.value.one_line()


def test_padding_is_ten_percent_each_side_and_clamped():
    assert padded_box((100, 50, 40, 60), 0.1, 640, 480) == (96, 44, 144, 116)
    assert padded_box((2, 3, 100, 100), 0.1, 105, 110) == (0, 0, 105, 110)


def test_face_tensor_is_imagenet_normalised_nchw():
    crop = Image.new("RGB", (50, 70), (255, 0, 128))
    x = face_tensor(crop, 224)
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    expected = (np.array([1.0, 0.0, 128 / 255]) - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    np.testing.assert_allclose(x[0, :, 100, 100], expected, rtol=1e-5)


def test_face_crop_takes_the_padded_box_with_bicubic_resize():
    image = Image.new("RGB", (200, 200), (0, 0, 0))
    image.paste((200, 100, 50), (66, 66, 134, 134))  # the padded crop of box (70, 70, 60, 60) is 64..136
    crop = face_crop(image, (70, 70, 60, 60))
    assert crop.size == (72, 72)  # 60 + 2 * 6
    x = face_tensor(crop)
    centre = x[0, :, 112, 112]
    edge = x[0, :, 0, 0]
    np.testing.assert_allclose(
        centre, (np.array([200, 100, 50]) / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225], rtol=1e-5
    )
    assert np.all(edge < centre)  # the 2 px black margin inside the padded crop


def test_coral_age_is_the_sum_of_sigmoids():
    logits = np.array([[0.0] * 100, [50.0] * 30 + [-50.0] * 70])
    np.testing.assert_allclose(coral_age(logits), [50.0, 30.0])


def _images(tmp_path, boxes_extra=()):
    images = face_images(tmp_path / "images", count=4)
    items = [(name, [box, *boxes_extra]) for name, box in images]
    (tmp_path / "images" / "boxes.txt").write_text(wider_annotations(items))
    return tmp_path / "images"


def test_faceage_samples_filter_small_faces_and_evaluate(tmp_path):
    folder = _images(tmp_path, boxes_extra=[(0, 0, 31, 40)])
    source = save_toy_faceage(tmp_path / "toy.onnx")
    task = get_task("faceage")
    options = opts.build(task.Options, {"data": str(folder), "boxes": str(folder / "boxes.txt"), "batch_size": 3})
    run = TaskRun(task, options, source)
    assert [s.id for s in run.samples] == ["face0.png#0", "face1.png#0", "face2.png#0", "face3.png#0"]
    assert run.data == "4 faces of at least 32 px from boxes.txt (4 under 32 px skipped)"
    same = run.validate(source, check_gates(task, {}))
    assert same.passed and same.metric("max_abs_age_error").value == 0.0
    ages = [r["age (source)"] for r in same.rows]
    assert len(set(np.round(ages, 3))) == 4  # the faces differ, so do their ages

    shifted = toy_faceage()
    bias = next(t for t in shifted.graph.initializer if t.name == "b_age")
    bias.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(bias) + 0.2, "b_age"))
    onnx.save(shifted, tmp_path / "shifted.onnx")
    result = run.validate(tmp_path / "shifted.onnx", check_gates(task, {"max_abs_age_error": 0.05}))
    assert not result.passed
    assert result.metric("max_abs_age_error").value > 0.05
    assert result.failures() == [f"max |Δage| {result.metric('max_abs_age_error').display} > gate 0.05"]
    assert result.metric("gender_agreement").display == "4/4"
    assert run.real_inputs  # face crops: what int8 may fix Convs' activation scales from


def test_faceage_counts_nonfinite_outputs_and_fails_the_gate():
    task = get_task("faceage")
    options = task.Options()
    reference = [
        {"age_logits": np.zeros((1, 100), np.float32), "gender_logits": np.array([[0.0, 1.0]], np.float32)}
        for _ in range(2)
    ]
    candidate = [
        dict(reference[0]),
        {"age_logits": np.full((1, 100), np.nan, np.float32), "gender_logits": np.array([[np.inf, 1.0]], np.float32)},
    ]
    samples = [Sample(str(i), {}) for i in range(2)]
    evaluation = task.evaluate(reference, candidate, samples, options)
    assert evaluation.values["nonfinite"] == 101
    assert evaluation.values["gender_agreement"] == 0.5
    assert evaluation.values["max_abs_age_error"] == 0.0  # over the finite samples; NaN is counted apart


def test_faceage_crops_folder_and_missing_data(tmp_path):
    folder = tmp_path / "crops"
    folder.mkdir()
    for i, colour in enumerate([(200, 10, 10), (10, 200, 10)]):
        Image.new("RGB", (40, 50), colour).save(folder / f"crop{i}.jpg")
    (folder / "notes.txt").write_text("not an image")
    source = save_toy_faceage(tmp_path / "toy.onnx")
    task = get_task("faceage")
    run = TaskRun(task, opts.build(task.Options, {"data": str(folder)}), source)
    assert [s.id for s in run.samples] == ["crop0.jpg", "crop1.jpg"]
    assert run.data == "2 face crops from crops/"
    with pytest.raises(UsageError, match="needs data"):
        task.samples(load_model(source), task.Options())
    with pytest.raises(InputError, match="no such folder"):
        task.samples(load_model(source), opts.build(task.Options, {"data": str(tmp_path / "nope")}))


def test_generic_task_compares_raw_outputs(tmp_path):
    source = save_toy_faceage(tmp_path / "toy.onnx")
    task = get_task("generic")
    run = TaskRun(task, opts.build(task.Options, {"samples": 2}), source)
    assert not run.real_inputs  # random from the input spec
    result = run.validate(source, check_gates(task, {"max_abs": 0.0}))
    assert result.passed and result.metric("within_gate").display == "2/2"
    with pytest.raises(UsageError, match="has no metric 'max_abs_age_error'"):
        check_gates(task, {"max_abs_age_error": 1})


def test_a_metric_severity_is_graded_in_units_of_its_gate():
    """What a repairing step measures against a task's gates: <= 1 passes, exactly where ``passes`` does, and
    grows with the distance from the gate (errors scale with it; agreements count from 1 down to the gate)."""
    from onnxsmith.tasks.base import HIGHER, LOWER, MetricSpec

    error, agreement = MetricSpec("e", "e", LOWER), MetricSpec("a", "a", HIGHER)
    for spec, gate, values in (
        (error, 0.1, [0.0, 0.05, 0.1, 0.2, 1.0]),
        (error, 0.0, [0.0, 1.0, 3.0]),
        (agreement, 0.9, [1.0, 0.95, 0.9, 0.8, 0.0]),
        (agreement, 1.0, [1.0, 0.99, 0.5]),
    ):
        severities = [spec.severity(v, gate) for v in values]
        assert [s <= 1 for s in severities] == [spec.passes(v, gate) for v in values]
        assert severities == sorted(severities) and len(set(severities)) == len(severities)
    assert error.severity(0.05, 0.1) == pytest.approx(0.5) and agreement.severity(0.95, 0.9) == pytest.approx(0.5)
    assert error.severity(float("nan"), 0.1) == float("inf")
