"""The fixture generator (tools/fixtures): its onnx-ir graph edits and readers.

The facts it reads from the committed files must be the facts recorded next to them, so the
info files the other tests assert against describe the files they sit beside.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from tools.fixtures.faceage.export import STACK_TRACE_KEY, StripStackTracesPass
from tools.fixtures.faceage.facts import graph_facts, layernorm_inputs
from tools.fixtures.gpt2.export import deduplicate_tied_lm_head
from tools.fixtures.gpt2.facts import gpt2_graph_facts
from tools.fixtures.graph_facts import op_counts

from tests.conftest import FIXTURES

FACEAGE_INFO = json.loads((FIXTURES / "faceage_info.json").read_text())
GPT2_INFO = json.loads((FIXTURES / "gpt2_info.json").read_text())


def tied_head_model(duplicate_is_transposed: bool = True) -> ir.Model:
    """Gather(wte) -> Add(h) -> MatMul(wte^T as its own initializer) -> Add(bias): what
    TorchScript's constant folding leaves of a tied LM head."""
    rng = np.random.default_rng(0)
    wte = rng.standard_normal((5, 4)).astype(np.float32)
    dup = wte.T.copy() if duplicate_is_transposed else rng.standard_normal((4, 5)).astype(np.float32)
    ids = ir.val("ids", ir.DataType.INT64, ["batch", 3])
    h = ir.val("h", ir.DataType.FLOAT, ["batch", 3, 4])
    arrays = {"wte": wte, "dup": dup, "bias": rng.standard_normal(5).astype(np.float32)}
    inits = {name: ir.val(name, const_value=ir.tensor(arr, name=name)) for name, arr in arrays.items()}
    gather = ir.node("Gather", [inits["wte"], ids])
    add = ir.node("Add", [gather.outputs[0], h])
    matmul = ir.node("MatMul", [add.outputs[0], inits["dup"]])
    logits = ir.node("Add", [matmul.outputs[0], inits["bias"]], outputs=[ir.val("logits")])
    graph = ir.Graph(
        [ids, h],
        logits.outputs,
        nodes=[gather, add, matmul, logits],
        initializers=inits.values(),
        opset_imports={"": 18},
    )
    return ir.Model(graph, ir_version=10)


def run(model: ir.Model) -> np.ndarray:
    feeds = {"ids": np.array([[0, 4, 2], [1, 1, 3]]), "h": np.ones((2, 3, 4), np.float32)}
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_deduplicate_tied_lm_head_reads_the_embedding_through_a_transpose():
    model = tied_head_model()
    before = run(model)
    record = deduplicate_tied_lm_head(model, embedding="wte")
    assert record == {
        "removed_initializer": "dup",
        "shape": [4, 5],
        "transpose_node": "Transpose_5",
        "output": "wte_transposed",
    }
    assert list(model.graph.initializers) == ["wte", "bias"]  # the others keep their order
    assert [n.op_type for n in model.graph] == ["Gather", "Add", "Transpose", "MatMul", "Add"]
    transpose, matmul = model.graph.node(2), model.graph.node(3)
    assert transpose.inputs[0] is model.graph.initializers["wte"] and matmul.inputs[1] is transpose.outputs[0]
    np.testing.assert_array_equal(run(model), before)


def test_deduplicate_tied_lm_head_refuses_when_nothing_is_tied():
    model = tied_head_model(duplicate_is_transposed=False)
    with pytest.raises(RuntimeError, match="no transposed duplicate of wte"):
        deduplicate_tied_lm_head(model, embedding="wte")
    assert list(model.graph.initializers) == ["wte", "dup", "bias"]


def test_strip_stack_traces_keeps_the_other_metadata_in_subgraphs_too():
    model = tied_head_model()
    cond = ir.val("cond", ir.DataType.BOOL, [])
    model.graph.inputs.append(cond)
    branches = {}
    for name in ("then_branch", "else_branch"):
        node = ir.node("Identity", [model.graph.initializers["bias"]], metadata_props={STACK_TRACE_KEY: "/home/x.py:1"})
        branches[name] = ir.Graph([], node.outputs, nodes=[node])
    model.graph.append(ir.node("If", [cond], branches))
    model.graph.node(0).metadata_props.update({STACK_TRACE_KEY: "/home/y.py:2", "namespace": "backbone"})

    assert StripStackTracesPass()(model).modified
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    assert not [n for n in nodes if STACK_TRACE_KEY in n.metadata_props]
    assert model.graph.node(0).metadata_props == {"namespace": "backbone"}
    assert not StripStackTracesPass()(model).modified
    assert op_counts(model.graph) == {"Add": 2, "Gather": 1, "Identity": 2, "If": 1, "MatMul": 1}
    assert op_counts(model.graph, subgraphs=False) == {"Add": 2, "Gather": 1, "If": 1, "MatMul": 1}


@pytest.mark.parametrize("name", ["faceage_dynamo.onnx", "faceage_torchscript.onnx"])
def test_faceage_facts_read_from_the_file_are_the_recorded_ones(name):
    recorded = FACEAGE_INFO["files"][name]
    facts = graph_facts(FIXTURES / name)
    assert facts == {key: recorded[key] for key in facts}
    names = [value.name for value in layernorm_inputs(ir.load(FIXTURES / name).graph)]
    assert names == recorded["residual"]["ln_input_tensors"]


@pytest.mark.parametrize("folder", ["gpt2", "gpt2_nopast"])
def test_gpt2_facts_read_from_the_file_are_the_recorded_ones(folder):
    recorded = GPT2_INFO["folders"][folder]
    facts = gpt2_graph_facts(FIXTURES / folder / "onnx" / "model.onnx")
    assert facts == {key: recorded[key] for key in facts}
