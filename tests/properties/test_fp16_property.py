"""Property: on any small float graph, ``fp16`` writes a variant within its tolerance, or refuses cleanly.

The whole transform runs as a user runs it (``produce_variant``: calibrate on the inputs,
float_precision, cast_hygiene, stage, gate storage-faithfully), with options drawn too.
Calibration and gate see the same inputs, so every tensor fp16 cannot hold is measured
and kept fp32: what is left is fp16 rounding. Refusals allowed, each one line:

* ``--rescale-residual`` on a graph without a residual stream (exit 2);
* the gate (exit 1), when fp16 itself cannot do better: rounding every tensor of the
  source that fits fp16 (inputs, weights, activations) already moves an output by half the tolerance (a LayerNorm over two nearly equal values
  amplifies any rounding), or the user asked for fp16 outputs and one does not fit fp16.
  A variant refused where that rounding stays well inside the tolerance is a bug: the
  transform rounds at fewer places than that reference does.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.core.errors import GateFailed, OnnxsmithError, UsageError
from onnxsmith.release.variant import produce_variant
from onnxsmith.transforms.fp16 import Options
from tests.support.check import run_in_memory
from tests.support.random_graphs import PROPERTY, float_graphs

FP16_MAX = 65504.0

options = st.builds(
    Options,
    keep_io_types=st.sampled_from([True, True, False]),
    headroom=st.sampled_from([4.0, 1.0, 16.0]),
    rescale_residual=st.sampled_from([None, None, None, True, False]),
    residual_fp32=st.booleans(),
    small_fp32=st.booleans(),
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fp16-property")


@PROPERTY
@given(case=float_graphs(massive=True), options=options)
def test_fp16_keeps_outputs_within_its_tolerance_or_refuses(folder, case, options):
    source, variant = folder / "source.onnx", folder / "variant.onnx"
    onnx.save(case.model, source)
    variant.unlink(missing_ok=True)
    try:
        result = produce_variant(source, variant, [("fp16", options)], feeds=case.feeds)
    except OnnxsmithError as err:
        event(f"refused: {type(err).__name__}")
        assert "\n" not in err.one_line() and not variant.exists()
        if isinstance(err, UsageError):
            assert options.rescale_residual and "--rescale-residual" in err.problem, err.one_line()
        elif "do not exercise" in err.problem:  # no evidence (verify/evidence.py): the source's outputs say nothing
            reference = run_in_memory(case.model, case.feeds)
            for name in reference[0]:
                values = np.stack([out[name] for out in reference]).astype(np.float64)
                finite = values[np.isfinite(values)]
                same = all(np.array_equal(reference[0][name], out[name], equal_nan=True) for out in reference)
                assert finite.size == 0 or np.all(finite == finite[0]) or same, (name, err.one_line())
        else:
            assert isinstance(err, GateFailed), err.one_line()
            reference = run_in_memory(case.model, case.feeds)
            peak = max(float(np.abs(v).max()) for out in reference for v in out.values() if v.size)
            badness = _fp16_rounding_error(case, reference, options)
            assert badness > 0.5 or (not options.keep_io_types and peak > FP16_MAX), (
                f"{err.one_line()}; rounding every tensor that fits fp16 stays within {badness:.2f} of the tolerance"
            )
        return
    assert result.comparison.passed  # the gate's own verdict, storage-faithful
    written = onnx.load(variant)
    onnx.checker.check_model(written, full_check=True)
    io = [(v.name, v.type.tensor_type.elem_type) for v in [*written.graph.input, *written.graph.output]]
    expected = [(v.name, v.type.tensor_type.elem_type) for v in [*case.model.graph.input, *case.model.graph.output]]
    if options.keep_io_types:
        assert io == expected
    else:
        assert [name for name, _ in io] == [name for name, _ in expected]
    stats = result.reports[0].stats
    event(f"fp16 nodes: {min(sum(stats['low_nodes'].values()), 5)}; unsafe tensors {min(stats['unsafe_tensors'], 2)}")


def _fp16_rounding_error(case, reference, options: Options) -> float:
    """How far from the source (in units of the fp16 gate's tolerance) the source lands when every
    main-graph tensor that fits fp16 with the transform's headroom is rounded to fp16."""
    limit = FP16_MAX / options.headroom
    typed = onnx.shape_inference.infer_shapes(case.model)
    floats = {v.name for v in typed.graph.value_info if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    floats |= {v.name for v in typed.graph.output if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    exposed = onnx.ModelProto()
    exposed.CopyFrom(case.model)
    own = {o.name for o in case.model.graph.output}
    exposed.graph.output.extend(
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in sorted(floats - own)
    )
    peaks: dict[str, float] = {}
    for outputs in run_in_memory(exposed, case.feeds):
        for name, array in outputs.items():
            if name in floats and array.size:
                peaks[name] = max(peaks.get(name, 0.0), float(np.nanmax(np.abs(array))))
    rounded = {name for name, peak in peaks.items() if peak <= limit}
    # Inputs too: an fp16 node reads a rounded copy even where the interface stays fp32.
    rounded |= {v.name for v in case.model.graph.input if v.type.tensor_type.elem_type == TensorProto.FLOAT}

    def round_trip(name: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("Cast", [f"{name}/exact"], [f"{name}/half"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", [f"{name}/half"], [name], to=TensorProto.FLOAT),
        ]

    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    graph = model.graph
    nodes = [cast for v in graph.input if v.name in rounded for cast in round_trip(v.name)]
    for node in graph.node:  # each rounded value: its producer writes it exact, its readers read it rounded
        node.output[:] = [f"{o}/exact" if o in rounded else o for o in node.output]
        nodes += [node] + [cast for o in node.output if o.endswith("/exact") for cast in round_trip(o[:-6])]
    del graph.node[:]
    graph.node.extend(nodes)
    for v in graph.input:
        if v.name in rounded:
            v.name = f"{v.name}/exact"
    for init in graph.initializer:  # weights, as the transform stores them
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32 and (not array.size or np.abs(array).max() <= limit):
            init.CopyFrom(numpy_helper.from_array(array.astype(np.float16).astype(np.float32), init.name))
    feeds = [{(f"{k}/exact" if k in rounded else k): v for k, v in f.items()} for f in case.feeds]
    worst = 0.0
    for want, got in zip(reference, run_in_memory(model, feeds)):
        for name, expected in want.items():
            if expected.dtype.kind != "f" or not expected.size:
                continue
            a, b = expected.astype(np.float64), got[name].astype(np.float64)
            if not np.array_equal(np.isfinite(a), np.isfinite(b)):
                return np.inf
            both = np.isfinite(a)
            worst = max(worst, float(np.max(np.abs(a[both] - b[both]) / (2e-2 + 2e-2 * np.abs(a[both])), initial=0)))
    return worst
