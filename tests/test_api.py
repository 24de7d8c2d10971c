"""onnxsmith as a library (docs/api.md): every documented call, verified like its command.

Each call is checked against what its command does on the same input and options (same
gate, same bytes), and for what a library adds: in-memory models, unknown keywords, a
variant staged until it is saved and removed when it is dropped.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnxsmith
from onnxsmith.cli.main import main
from onnxsmith.core.errors import GateFailed, UsageError
from onnxsmith.core.text import for_markdown
from onnxsmith.io.files import STAGING_PREFIX, sha256_file
from onnxsmith.io.save import PROVENANCE_KEY
from onnxsmith.verify.compare import Comparison
from onnxsmith.verify.gate import format_cosine
from tests.conftest import FIXTURES
from tests.support.lm_models import TEXT, gpt2_folder
from tests.support.models import mlp
from tests.support.release import EXAMPLE, recipe_text, save_toy_faceage
from tests.support.surgery_models import chain, hitnet_bloat

FACEAGE = FIXTURES / "faceage_dynamo.onnx"


def _staging(folder: Path) -> list[Path]:
    return sorted(folder.glob(STAGING_PREFIX + "*"))


@pytest.fixture
def run_main_json(capsys):
    """``onnxsmith ARGS --json`` in-process: what it printed, parsed."""

    def call(*args):
        assert main([str(a) for a in args]) == 0
        return json.loads(capsys.readouterr().out)

    return call


@pytest.fixture(scope="module")
def faceage_fp16(tmp_path_factory):
    """The acceptance one-liner's variant, made once for the tests that only read it."""
    with onnxsmith.fp16(str(FACEAGE)) as variant:
        yield variant, tmp_path_factory.mktemp("fp16")


def test_fp16_is_the_commands_variant_byte_for_byte(faceage_fp16, cli):
    variant, tmp = faceage_fp16
    assert variant.ok and variant.path.is_file() and variant.files is None  # verified, nothing written yet
    [saved] = variant.save(tmp / "api.onnx")
    result = cli("fp16", FACEAGE, tmp / "cli.onnx")  # the command's defaults: 4 samples, the same seed
    assert result.returncode == 0, result.stderr
    assert saved.sha256 == sha256_file(tmp / "cli.onnx") == sha256_file(tmp / "api.onnx")
    assert variant.path == tmp / "api.onnx"  # moved, not copied
    # The command prints the same headline first.
    assert result.stdout.splitlines()[0] == variant.report.headline[0]


def test_the_report_starts_with_what_was_achieved(faceage_fp16):
    variant, _ = faceage_fp16
    report = variant.report
    first, verdict = report.headline[:2]
    ratio = report.bytes / report.source.bytes
    assert first.startswith(f"fp16: {ratio:.2f}x the source's size") and f"{report.nodes_before} ->" in first
    assert 0.4 < ratio < 0.75
    worst = min(o.cosine for o in variant.comparison.outputs)
    assert verdict.startswith("verified: ") and f"cosine {format_cosine(worst)}" in verdict and "fp16 gate" in verdict
    assert [s.step for s in report.steps] == ["fp16"] and report.steps[0].notes
    assert report.source.name == FACEAGE.name and report.source.sha256 == sha256_file(FACEAGE)
    assert str(report).splitlines()[:2] == report.headline[:2]


def test_the_comparison_is_the_metrics_as_data(faceage_fp16):
    variant, _ = faceage_fp16
    comparison = variant.comparison
    assert isinstance(comparison, Comparison) and comparison.passed == variant.ok
    assert [o.name for o in comparison.outputs] == [o.name for o in onnx.load(FACEAGE).graph.output]
    assert comparison.modes["candidate"] != "native"  # fp16 is judged storage-faithfully
    assert comparison.bounds.format == "fp16" and all(o.worst <= 1 for o in comparison.outputs)
    assert comparison.samples == 4


def test_a_call_reads_its_source_once(tmp_path, save_proto, monkeypatch):
    """The source is parsed once for the input sets and the transform (api._prepared hands the make the model it
    read, release/variant.Source); a remake after a refusal reads the file again, never the changed copy."""
    import onnxsmith.api as api_module
    import onnxsmith.release.variant as variant_module

    source = save_proto(mlp(), "mlp.onnx")
    reads: list[Path] = []
    for module in (api_module, variant_module):
        real = module.load_model
        monkeypatch.setattr(
            module, "load_model", lambda path, *a, _real=real, **k: reads.append(Path(path)) or _real(path, *a, **k)
        )
    variant = onnxsmith.fp16(source, samples=1)
    assert variant.ok and reads.count(source) == 1, reads
    variant.close()


def test_a_refused_variant_is_saved_only_when_forced(tmp_path):
    variant = onnxsmith.fp16(FACEAGE, atol=1e-9, rtol=0.0, samples=1)
    assert not variant.ok and "would accept it" in variant.failure
    assert variant.report.headline[1].startswith("REFUSED by its gate: ")
    with pytest.raises(GateFailed, match="force=True"):
        variant.save(tmp_path / "refused.onnx")
    assert not (tmp_path / "refused.onnx").exists()
    [saved] = variant.save(tmp_path / "refused.onnx", force=True)
    assert saved.path.is_file() and saved.sha256 == sha256_file(tmp_path / "refused.onnx")
    variant.close()


def test_a_variant_never_saved_leaves_nothing(tmp_path, save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    out = tmp_path / "out" / "mlp_fp16.onnx"
    variant = onnxsmith.fp16(source, out=out)  # staged beside out: the save would be a rename
    assert variant.path.parent.parent == out.parent and len(_staging(out.parent)) == 1
    del variant
    gc.collect()
    assert not out.parent.exists()  # the staging folder and the folder made for it are gone
    with onnxsmith.fp16(source, out=out) as variant:
        staged = variant.path
        assert staged.is_file()
    assert not staged.exists() and not out.parent.exists()


def test_save_writes_where_out_said_and_twice_copies(tmp_path, save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    with onnxsmith.shrink(source, out=tmp_path / "a.onnx") as variant:
        [first] = variant.save()
        [second] = variant.save(tmp_path / "b.onnx")
    assert first.path == tmp_path / "a.onnx" and second.path == tmp_path / "b.onnx"
    assert first.sha256 == second.sha256 == sha256_file(tmp_path / "b.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "b.onnx", "mlp.onnx"]


def test_save_has_the_commands_protections(tmp_path, save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    before = sha256_file(source)
    with onnxsmith.shrink(source) as variant:
        with pytest.raises(UsageError, match="refusing to overwrite the input model"):
            variant.save(source)
        (tmp_path / "folder.onnx").mkdir()
        with pytest.raises(UsageError, match="is a folder, not a regular file"):
            variant.save(tmp_path / "folder.onnx")
    assert sha256_file(source) == before
    with pytest.raises(UsageError, match="refusing to overwrite the input model"):
        onnxsmith.shrink(source, out=source)  # checked before any work


def test_external_data_is_named_after_where_it_is_saved(tmp_path, cli):
    with onnxsmith.fp16(FACEAGE, external_data=True) as variant:
        records = variant.save(tmp_path / "api.onnx")
    assert [r.path.name for r in records] == ["api.onnx", "api.onnx.data"]
    # Staged under another name, relocated on save: the bytes the command writes for that name.
    assert cli("fp16", FACEAGE, tmp_path / "by_cli" / "api.onnx", "--external-data").returncode == 0
    for name in ("api.onnx", "api.onnx.data"):
        assert sha256_file(tmp_path / name) == sha256_file(tmp_path / "by_cli" / name), name
    session = ort.InferenceSession(str(tmp_path / "api.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_outputs()  # reads its own data file


def test_an_in_memory_model_works_and_says_where_it_came_from(tmp_path):
    proto = mlp()
    model = ir.serde.deserialize_model(proto)
    nodes = [n.op_type for n in model.graph]
    for given, kind in ((model, "onnx_ir.Model"), (proto, "onnx.ModelProto")):
        with onnxsmith.fp16(given) as variant:
            assert variant.ok
            [saved] = variant.save(tmp_path / f"{kind}.onnx")
        provenance = json.loads({p.key: p.value for p in onnx.load(saved.path).metadata_props}[PROVENANCE_KEY])
        assert provenance["source"]["origin"] == f"an {kind} in memory (graph 'mlp')"
        assert provenance["source"]["name"] == "mlp.onnx" == variant.report.source.name
    assert [n.op_type for n in model.graph] == nodes and PROVENANCE_KEY not in model.metadata_props  # untouched


def test_options_are_keywords_and_an_unknown_one_is_named(save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    with pytest.raises(TypeError, match=r"unknown keyword 'headrom'.*options: keep_io_types, headroom"):
        onnxsmith.fp16(source, headrom=2)
    with pytest.raises(UsageError, match="headroom must be at least 1"):
        onnxsmith.fp16(source, headroom=0.5)
    with pytest.raises(UsageError, match="option 'precision' must be one of fp32, fp16"):
        onnxsmith.fuse(source, precision="int4")
    with pytest.raises(UsageError, match=r"expected a path, an onnx_ir\.Model or an onnx\.ModelProto"):
        onnxsmith.shrink(42)
    with onnxsmith.fp16(source, keep_io_types=False) as variant:
        assert variant.report.steps[0].options["keep_io_types"] is False
        assert ort.InferenceSession(str(variant.path)).get_inputs()[0].type == "tensor(float16)"


def test_fuse_at_fp16_halves_the_transformer():
    with onnxsmith.fuse(FIXTURES / "faceage_torchscript.onnx", precision="fp16") as variant:
        assert variant.ok, variant.failure
        assert variant.report.steps[0].options["precision"] == "fp16"
        assert variant.report.size_ratio < 0.6
        ops = {n.op_type for n in onnx.load(variant.path).graph.node}
        assert "MultiHeadAttention" in ops


def test_fuse_fp32_says_why_the_file_is_not_smaller():
    with onnxsmith.fuse(FIXTURES / "faceage_torchscript.onnx") as variant:
        assert variant.ok
        assert any("weights stay fp32" in line for line in variant.report.headline[2:])


def test_shrink_says_what_it_kept(save_proto):
    source = save_proto(hitnet_bloat(height=128, width=256, tile1=3, tile2=2), "grid.onnx")
    with onnxsmith.shrink(source) as variant:
        assert variant.ok
        assert any("stay computed at run time" in line for line in variant.report.headline[2:])


def test_int8_is_judged_by_cosine_and_says_what_stays_fp32(cli, tmp_path):
    with onnxsmith.int8(FACEAGE) as variant:
        assert variant.ok and variant.report.size_ratio < 0.6
        assert all(o.cosine >= 0.995 for o in variant.comparison.outputs)
        assert "atol" not in variant.report.headline[1]  # its gate is the cosine, not a tolerance
        kept = [r for r in variant.report.steps[0].tables["Linears"] if r["int8"] == "no"]
        lines = variant.report.headline[2:]
        assert sum(int(line.split()[0]) for line in lines if "Linear(s) stay fp32" in line) == len(kept)
        # made up for what the input is (a face image): its Convs may go int8, and the headline says what it fed
        assert any(line.startswith("inputs taken to be: 'face': image NCHW") for line in lines)
        [saved] = variant.save(tmp_path / "api.onnx")
    assert cli("int8", FACEAGE, tmp_path / "cli.onnx").returncode == 0
    assert saved.sha256 == sha256_file(tmp_path / "cli.onnx")


def test_extract_is_the_commands_piece(tmp_path, save_proto, cli):
    source = save_proto(chain(), "chain.onnx")
    with onnxsmith.extract(source, inputs=["b", "d"], outputs=["y"]) as piece:
        assert piece.ok and [i["name"] for i in piece.inputs] == ["b", "d"]
        [saved] = piece.save(tmp_path / "api.onnx")
        report = piece.to_json()
    assert report["nodes"] == {"source": 7, "piece": 2} and report["headline"][0].startswith("extract: ")
    assert cli("extract", source, tmp_path / "cli.onnx", "--inputs", "b,d", "--outputs", "y").returncode == 0
    assert saved.sha256 == sha256_file(tmp_path / "cli.onnx")


def test_compare_takes_files_models_variants_and_feeds(save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    same = onnxsmith.compare(source, mlp(), feeds={"x": x})
    assert same.passed and same.samples == 1 and same.outputs[0].max_abs == 0.0
    other = onnxsmith.compare(source, mlp(seed=1), feeds=[{"x": x}, {"x": -x}])
    assert not other.passed and other.samples == 2 and other.candidate == "mlp.onnx"
    with onnxsmith.fp16(source) as variant:
        judged = onnxsmith.compare(source, variant, samples=2)  # judged at fp16 (docs/gate.md)
        assert judged.passed and judged.modes["candidate"] != "native"
    with pytest.raises(UsageError, match="feeds: no array for input 'x'"):
        onnxsmith.compare(source, source, feeds={"y": x})


def test_quantize_stages_the_folder_and_saves_it(tmp_path):
    out = tmp_path / "q4"
    with onnxsmith.quantize(gpt2_folder(), last_token=False, gate_samples=2, gate_length=16) as folder:
        assert folder.ok and [name for name, _, _ in folder.variants] == ["model_q4.onnx"]
        assert folder.report.headline[0].startswith("quantize: ") and folder.report.size_ratio < 0.5
        assert not out.exists()
        records = folder.save(out)
    assert [r.path for r in records] == [out / "onnx" / "model_q4.onnx"]
    assert records[0].sha256 == sha256_file(out / "onnx" / "model_q4.onnx")
    assert json.loads((out / "quantize_report.json").read_text()) == json.loads(json.dumps(folder.summary))
    assert (out / "tokenizer.json").read_bytes() == (gpt2_folder() / "tokenizer.json").read_bytes()
    assert _staging(tmp_path) == []


def test_build_makes_the_release_with_headlines_on_the_card_and_card_rewrites_it(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    source = save_toy_faceage(project / "toy.onnx")
    recipe = project / "recipe.toml"
    variants = '[[variants]]\nname = "half"\nsteps = [{ pass = "fp16" }]\n'
    recipe.write_text(recipe_text(source, variants, card='[card]\ntitle = "First title"\n'))
    result = onnxsmith.build(recipe, tmp_path / "release", bench=False)
    assert result.ok and result.out == tmp_path / "release"
    [variant] = json.loads((result.out / "measurements.json").read_text())["variants"]
    card = (result.out / "README.md").read_text()
    first = variant["headline"][0]
    assert first.startswith("fp16: ") and f"**{first}**" in card and "First title" in card
    note = for_markdown(variant["steps"][0]["notes"][0])  # as the card holds it: Markdown-escaped
    assert card.index(first) < card.index(note)  # the headline comes first

    recipe.write_text(recipe_text(source, variants, card='[card]\ntitle = "Second title"\n'))
    record = onnxsmith.card(result.out, recipe=recipe)
    card = (result.out / "README.md").read_text()
    assert record.path == result.out / "README.md" and record.sha256 == sha256_file(record.path)
    assert "Second title" in card and "First title" not in card and f"**{first}**" in card
    (result.out / "half.onnx").write_bytes(b"changed")
    with pytest.raises(UsageError, match="changed since the build"):
        onnxsmith.card(result.out)


def test_inspect_is_the_commands_summary(save_proto, run_main_json):
    source = save_proto(mlp(), "mlp.onnx")
    summary = onnxsmith.inspect(ir.serde.deserialize_model(mlp()), top=2)
    assert summary.node_count == 5 and [i["name"] for i in summary.inputs] == ["x"] and len(summary.largest) == 2
    assert summary.largest[0].name == "w1"  # 8x16 floats, the largest
    assert run_main_json("inspect", source, "--top", "2", "--json") == json.loads(
        json.dumps(onnxsmith.inspect(source, top=2).to_json())
    )


def test_validate_judges_a_variant_on_a_tasks_data(tmp_path, save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    with onnxsmith.fp16(source) as variant:
        validation = onnxsmith.validate(source, variant, task="generic", samples=3)
        assert validation.passed and validation.samples == 3 and validation.task == "generic"
        assert validation.reference == "mlp.onnx" and validation.modes["candidate"] != "native"
        cosine = next(m for m in validation.metrics if m.name == "min_cosine")
        within = next(m for m in validation.metrics if m.name == "within_gate")  # the one gate, at fp16
        assert within.gate == 1.0 and within.value == 1.0 and 0.999 < cosine.value <= 1.0
        strict = onnxsmith.validate(source, variant, task="generic", gates={"max_abs": 1e-9})
        assert not strict.passed and any("max |Δ|" in line for line in strict.failures())
    with pytest.raises(UsageError, match="task 'generic' has no metric 'max_age'"):
        onnxsmith.validate(source, source, task="generic", gates={"max_age": 1})
    with pytest.raises(TypeError, match="unknown keyword 'boxes'"):
        onnxsmith.validate(source, source, task="generic", boxes="boxes.txt")


def test_predict_answers_for_one_face(tmp_path, run_main_json):
    source = save_toy_faceage(tmp_path / "toy.onnx")
    image = EXAMPLE / "images" / "astronaut.png"
    prediction = onnxsmith.predict(source, image, task="faceage", box=(180, 70, 95, 94))
    assert 0 < prediction["age"] < 100 and prediction["gender"] in ("female", "male") and prediction["run"]
    assert prediction == run_main_json("predict", "--task", "faceage", source, image, "--box", "180,70,95,94", "--json")
    assert onnxsmith.predict(source, image, box=(0, 0, 95, 94))["age"] != prediction["age"]
    with pytest.raises(UsageError, match="positive width and height"):
        onnxsmith.predict(source, image, box=(1, 2, 0, 4))
    with pytest.raises(UsageError, match="task 'generic' cannot predict"):
        onnxsmith.predict(source, image, task="generic")


def test_eval_lm_scores_models_on_text():
    source = gpt2_folder() / "onnx" / "model.onnx"
    scored = onnxsmith.eval_lm([source, source], TEXT, window=32, max_windows=2)
    assert (scored.windows, scored.window, scored.reference) == (2, 32, "model.onnx")
    reference, same = scored.scores
    assert reference.kl is None and reference.tokens == same.tokens == 2 * 31
    assert same.kl == pytest.approx(0.0, abs=1e-6) and same.top1 == 1.0 and same.loss == reference.loss
    assert scored.to_json()["scores"][1]["top1"] == 1.0


def test_bench_measures_each_model_and_says_what_it_could_not(tmp_path, save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    other = tmp_path / "other"
    other.mkdir()
    twin = save_proto(mlp(seed=1), "other/mlp.onnx")
    config = {"session.disable_quant_qdq": "1"}
    run = onnxsmith.bench([source, twin], batch=[1, 3], runs=2, warmup=0, session_config=config)
    assert [r.name for r in run.results] == [str(source), str(twin)]  # two files of one name: their paths
    assert all([b.batch for b in r.batches] == [1, 3] and r.session_config == config for r in run.results)
    assert all(b.runs == 2 and b.median_ms > 0 for r in run.results for b in r.batches)
    assert not run.failures and run.shortfall() == ""
    with pytest.raises(UsageError, match="runs must be a positive integer"):
        onnxsmith.bench([source], runs=0)
    with pytest.raises(UsageError, match=r"a list of \.onnx files"):
        onnxsmith.bench(source)


def test_transform_runs_any_registered_transform_by_name(save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    with onnxsmith.transform(source, "shrink", dedup=False, samples=1) as variant:
        assert variant.ok and variant.report.steps[0].step == "shrink"
        assert variant.report.steps[0].options["dedup"] is False
        assert variant.comparison.samples == 1
    with pytest.raises(UsageError, match="nosuch"):
        onnxsmith.transform(source, "nosuch")


def test_check_outputs_refuses_before_any_work(tmp_path, save_proto):
    source = save_proto(mlp(), "mlp.onnx")
    onnxsmith.check_outputs([tmp_path / "ok.onnx", None], sources=[source])
    with pytest.raises(UsageError, match="refusing to overwrite the input model"):
        onnxsmith.check_outputs([source], sources=[source])
    (tmp_path / "folder.onnx").mkdir()
    with pytest.raises(UsageError, match="is a folder, not a regular file"):
        onnxsmith.check_outputs([tmp_path / "folder.onnx"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.onnx", "mlp.onnx"]  # nothing written


def test_shape_sizes_random_inputs_by_input_or_by_dim():
    from onnxsmith.api import _input_sets

    model = ir.serde.deserialize_model(mlp())
    by_input = _input_sets(model, None, samples=2, seed=0, shape={"x": (5, 8)})
    by_dim = _input_sets(model, None, samples=2, seed=0, shape={"batch": 5})
    by_strings = _input_sets(model, None, samples=2, seed=0, shape=["batch=5"])
    assert [s["x"].shape for s in by_input] == [(5, 8), (5, 8)]
    for sets in (by_dim, by_strings):
        assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(by_input, sets, strict=True))
    assert not np.array_equal(by_input[0]["x"], by_input[1]["x"])  # set i is seeded seed + i
    with pytest.raises(UsageError, match="shape: 'x' must be a size"):
        _input_sets(model, None, samples=1, seed=0, shape={"x": "5,8"})


def test_fp16_says_first_why_the_file_is_not_half(tmp_path, save_proto):
    """Most weights int8 (dequantized at run time): fp16 cannot halve them, and the headline says so."""
    rng = np.random.default_rng(0)
    weights = [
        onnx.numpy_helper.from_array(rng.integers(-127, 127, (8, 256), dtype=np.int8), "w_q"),
        onnx.numpy_helper.from_array(np.array(0.01, np.float32), "scale"),
        onnx.numpy_helper.from_array(rng.standard_normal((256, 4)).astype(np.float32), "w2"),
    ]
    nodes = [
        onnx.helper.make_node("DequantizeLinear", ["w_q", "scale"], ["w1"]),
        onnx.helper.make_node("MatMul", ["x", "w1"], ["h"]),
        onnx.helper.make_node("MatMul", ["h", "w2"], ["y"]),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "int8_weights",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])],
        weights,
    )
    source = save_proto(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]))
    with onnxsmith.fp16(source) as variant:
        assert variant.ok and variant.report.size_ratio > 0.6
        assert variant.report.headline[2].endswith("are int8: fp16 converts fp32 weights only")
        # the last line says what the made-up inputs were taken to be (docs/inputs.md)
        assert variant.report.steps[0].why_not_more == variant.report.headline[2:-1]
        assert variant.report.headline[-1] == "inputs taken to be: 'x': random values"
