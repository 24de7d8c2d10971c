"""The build pipeline on a toy model, in-process with a test-only transform: gates, determinism, safety.

(tests/test_example.py builds the bundled example with the real transforms through the CLI.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
import pytest

from onnxsmith.cli.main import main
from onnxsmith.core.errors import UsageError
from onnxsmith.core.transform import StepReport, Transform, register
from onnxsmith.release.build import build, rewrite_card
from onnxsmith.release.recipe import load_recipe
from tests.conftest import assert_one_line_error
from tests.support.release import face_images, recipe_text, save_toy_faceage, wider_annotations


@dataclass
class ShiftOptions:
    amount: float = field(default=0.0, metadata={"help": "added to the age bias"})


@register
class TestOnlyAgeShift(Transform):
    """Adds ``amount`` to the age head's bias: within the loose bounds it asks of the one gate, outside a
    tight age gate."""

    name = "test-only-age-shift"
    Options = ShiftOptions

    def apply(self, model, options, context):
        value = model.graph.initializers["b_age"]
        value.const_value = ir.tensor(value.const_value.numpy() + np.float32(options.amount), name="b_age")
        return StepReport(
            self.name,
            {"amount": options.amount},
            notes=[f"shifted the age bias by {options.amount}"],
            runtime={"session.test_entry": "1"} if options.amount == 0 else {},
        )

    def gate_settings(self, options):
        return {"min_cosine": 0.0, "atol": 1.0, "rtol": 1.0}


VARIANTS = """
[[variants]]
name = "same"
steps = [{ pass = "test-only-age-shift" }]

[[variants]]
name = "drifted"
file = "drifted-model.onnx"
steps = [{ pass = "test-only-age-shift", amount = 0.3 }]
"""
VALIDATION = """
[validation]
task = "faceage"
data = "images"
boxes = "images/boxes.txt"
gates = { max_abs_age_error = 0.01 }
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy-release")
    source = save_toy_faceage(root / "toy.onnx")
    images = face_images(root / "images", count=3)
    (root / "images" / "boxes.txt").write_text(wider_annotations([(n, [b]) for n, b in images]))
    (root / "LICENSE.txt").write_text("Toy licence: do what you like.\n")
    (root / "recipe.toml").write_text(
        recipe_text(
            source,
            VARIANTS,
            validation=VALIDATION,
            bench="[bench]\nbatch = [1, 2]\nruns = 2\nwarmup = 1",
            card='[card]\ntitle = "Toy face age"\nlicense_file = "LICENSE.txt"',
        )
    )
    return root


@pytest.fixture(scope="module")
def built(project):
    messages = []
    result = build(load_recipe(project / "recipe.toml"), project / "release", log=messages.append)
    return result, messages


def test_a_variant_failing_its_gate_is_not_published(built, project):
    result, messages = built
    release = project / "release"
    assert [o.variant.name for o in result.failed] == ["drifted"]
    assert result.failed[0].reason.startswith("max |Δage| ") and result.failed[0].reason.endswith("> gate 0.01")
    assert not (release / "drifted-model.onnx").exists()
    assert sorted(p.name for p in release.iterdir()) == [
        "README.md",
        "SHA256SUMS",
        "measurements.json",
        "recipe.toml",
        "report.html",
        "same.onnx",
    ]
    assert any(m.startswith("not published drifted: max |Δage|") for m in messages)
    card = (release / "README.md").read_text()
    assert "### drifted (not published)" in card and "Not published: max \\|Δage\\|" in card  # '|' escaped: Markdown
    assert "Toy licence: do what you like." in card
    assert "`session.test_entry` = `1`" in card  # the runtime options a variant needs
    assert (release / "SHA256SUMS").read_text().endswith("  same.onnx\n")
    measured = json.loads((release / "measurements.json").read_text())
    assert [v["published"] for v in measured["variants"]] == [True, False]
    assert [o.to_json(result.out) for o in result.outcomes] == measured["variants"]
    assert [f.path for f in result.outcomes[0].files] == [release / "same.onnx"]  # where the release now is
    assert result.failed[0].files == [] and result.failed[0].validation is not None
    assert [r["name"] for r in measured["bench"]["results"]] == ["source", "same"]  # not the failed one
    timings = measured["bench"]["validation"]  # timed, beside the latencies: both variants were validated
    assert [t["variant"] for t in timings] == ["same", "drifted"] and all(t["seconds"] > 0 for t in timings)
    assert timings[0]["samples"] == measured["validation"]["samples"] and timings[0]["ran_on"].endswith("this process")
    report = (release / "report.html").read_text()
    assert report.index("Validation time") < report.index("<!-- /timed -->")
    massive = measured["ranges"]["massive"]
    assert massive["channel"] == 5 and massive["absmax"] == pytest.approx(1e5, rel=1e-3)


def test_card_command_rewrites_the_same_card_and_refuses_changed_files(built, project, tmp_path, capsys):
    release = project / "release"
    before = (release / "README.md").read_bytes()
    record = rewrite_card(release)
    assert record.path.read_bytes() == before
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in release.iterdir():
        copy.joinpath(f.name).write_bytes(f.read_bytes())
    with open(copy / "same.onnx", "ab") as f:
        f.write(b"\0")
    assert main(["card", str(copy)]) == 2
    assert "same.onnx changed since the build" in capsys.readouterr().err


def test_build_refuses_to_replace_a_folder_that_is_not_a_release(project, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match=r"holds files that no earlier build made \(notes\.txt\)"):
        build(load_recipe(project / "recipe.toml"), precious)
    with pytest.raises(UsageError, match="holds the recipe or the source model"):
        build(load_recipe(project / "recipe.toml"), project)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_build_exits_1_naming_the_variant_that_failed_its_gate(project, tmp_path, cli):
    """Through the CLI: a step that cannot keep more exact (no repair) is not made again."""
    recipe = project / "strict.toml"
    recipe.write_text(
        recipe_text(
            project / "toy.onnx",
            '[[variants]]\nname = "half"\nsteps = [{ pass = "test-only-age-shift", amount = 0.3 }]\n',
            validation=VALIDATION,
        )
    )
    result = cli("build", recipe, "--out", tmp_path / "out")
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("onnxsmith: error: ") and "1 variant(s) failed their gates" in last
    assert "'half' (max |Δage| " in last and "> gate 0.01" in last
    assert "making it again" not in result.stderr
    assert not (tmp_path / "out" / "half.onnx").exists()
    assert "### half (not published)" in (tmp_path / "out" / "README.md").read_text()


@register
class TestOnlyRepairableShift(TestOnlyAgeShift):
    """The age shift, but told how the task's gates measure (``TransformContext.judge``) it shifts by the largest
    of amount x (1, 0.1, 0.01, 0) they accept. The toy's age logits are its age bias plus what the image gives,
    so the shifted outputs are the source's plus the amount: judged without running the variant."""

    name = "test-only-repairable-shift"

    def repairs(self, options):
        return True

    def apply(self, model, options, context):
        if context.judge is None:
            return super().apply(model, options, context)
        import onnxruntime as ort

        session = ort.InferenceSession(str(context.source_path), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        runs = [dict(zip(names, session.run(None, feeds))) for feeds in context.feeds]
        reference = {k: np.stack([r[k] for r in runs]) for k in names}
        amounts = [options.amount * f for f in (1, 0.1, 0.01, 0)]
        severity = {
            a: context.judge(reference, {**reference, "age_logits": reference["age_logits"] + np.float32(a)})
            for a in amounts
        }
        chosen = next(a for a in amounts if severity[a] <= 1)
        report = super().apply(model, ShiftOptions(chosen), context)
        report.stats["severity"] = {str(a): v for a, v in severity.items()}
        return report


def test_a_variant_the_task_gates_refuse_is_made_again_by_steps_told_how_they_measure(project, tmp_path):
    """The task's gates refuse the first variant; a step that repairs is handed them as a function of raw outputs
    on the calibration samples (graded: 0 for the source's outputs, growing with the error, > 1 where they fail)
    and the variant it makes then is validated and published; the card says it was made twice and why."""
    recipe = project / "repaired.toml"
    recipe.write_text(
        recipe_text(
            project / "toy.onnx",
            '[[variants]]\nname = "shifted"\nsteps = [{ pass = "test-only-repairable-shift", amount = 0.3 }]\n',
            validation=VALIDATION,
        )
    )
    messages = []
    result = build(load_recipe(recipe), tmp_path / "out", progress=messages.append, bench=False)
    assert [o.variant.name for o in result.outcomes if o.published] == ["shifted"]
    assert any("the task's gates refused it (max |Δage| " in m and "making it again" in m for m in messages)
    report = result.outcomes[0].report  # the made variant's own record, as measurements.json has it
    assert result.outcomes[0].to_json(result.out) == result.measurements["variants"][0]
    severity = {float(a): v for a, v in report.steps[0].stats["severity"].items()}
    assert severity[0.3] > 1 and severity[0.0] == 0
    assert severity[0.3] > severity[0.03] >= severity[0.003] >= 0
    assert report.steps[0].options["amount"] < 0.3  # the repaired shift
    assert report.remade_after.startswith("max |Δage| ") and report.remade_after.endswith("> gate 0.01")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "made twice: the task's gates refused the first (max \\|Δage\\| " in card  # Markdown-escaped


def test_included_files_keep_their_mode_and_the_card_names_what_came_from_outside(tmp_path):
    root = tmp_path / "project"
    (root / "shared").mkdir(parents=True)
    source = save_toy_faceage(root / "toy.onnx")
    private = root / "private.json"
    private.write_text('{"token": "x"}\n')
    private.chmod(0o600)
    script = root / "shared" / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    outside = tmp_path / "vocab.txt"
    outside.write_text("a b c\n")
    (root / "recipe.toml").write_text(
        recipe_text(source, '[[variants]]\nname = "same"\nsteps = [{ pass = "test-only-age-shift" }]\n')
        + '[release]\nallow_outside = true\ninclude = ["private.json", "shared/run.sh", "../vocab.txt"]\n'
    )
    result = build(load_recipe(root / "recipe.toml"), tmp_path / "out", bench=False)
    out = result.out
    assert (out / "private.json").stat().st_mode & 0o777 == 0o600
    assert (out / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (out / "vocab.txt").read_text() == "a b c\n"
    card = (out / "README.md").read_text()
    assert "Taken from outside the recipe's folder (the recipe sets `allow_outside = true`): `vocab.txt`." in card
    assert json.loads((out / "measurements.json").read_text())["outside_recipe"] == ["vocab.txt"]


# ---- --out: a rebuild deletes nothing it did not make; one build at a time -----------------


def _quick_project(root, names=("same",)):
    """A recipe without validation or benchmark (a build takes a second), variants ``names``."""
    root.mkdir(parents=True, exist_ok=True)
    source = root / "toy.onnx"
    if not source.exists():
        save_toy_faceage(source)
    variants = "".join(f'[[variants]]\nname = "{n}"\nsteps = [{{ pass = "test-only-age-shift" }}]\n' for n in names)
    (root / "recipe.toml").write_text(recipe_text(source, variants))
    return load_recipe(root / "recipe.toml")


def _verified_files(release) -> list[str]:
    """The release's files, after checking each against SHA256SUMS as `sha256sum -c` would."""
    from onnxsmith.io.files import sha256_file

    listed = [line.split("  ", 1) for line in (release / "SHA256SUMS").read_text().splitlines()]
    for digest, name in listed:
        assert sha256_file(release / name) == digest, name
    return sorted(name for _, name in listed)


GENERATED_FILES = ["README.md", "SHA256SUMS", "measurements.json", "recipe.toml", "report.html"]


def test_a_rebuild_refuses_an_out_holding_files_no_build_made(tmp_path, cli):
    recipe = _quick_project(tmp_path / "project")
    out = tmp_path / "release"
    build(recipe, out, bench=False)
    build(recipe, out, bench=False)  # an earlier release alone is replaced whole
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "notes.txt").write_text("keep me")
    (out / "empty").mkdir()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match=r"holds files that no earlier build made \(\.git/, empty/, notes\.txt\);"):
        build(recipe, out, bench=False)
    result = cli("build", tmp_path / "project" / "recipe.toml", "--out", out, "--no-bench")
    assert_one_line_error(result, "no earlier build made (.git/, empty/, notes.txt)", "pass --force to keep them")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "release"]  # no staging or lock left


def test_force_keeps_what_no_build_made_and_replaces_the_release_files(tmp_path):
    out = tmp_path / "release"
    build(_quick_project(tmp_path / "project", names=("old", "kept")), out, bench=False)
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "notes.txt").write_text("keep me")
    result = build(_quick_project(tmp_path / "project", names=("kept", "new")), out, bench=False, force=True)
    assert result.out == out
    assert (out / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert (out / "notes.txt").read_text() == "keep me"
    assert not (out / "old.onnx").exists()  # the earlier release's, no longer built: removed
    assert _verified_files(out) == ["kept.onnx", "new.onnx"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".git", "notes.txt", "kept.onnx", "new.onnx", *GENERATED_FILES]
    )
    measured = json.loads((out / "measurements.json").read_text())
    assert [v["name"] for v in measured["variants"]] == ["kept", "new"]


def test_force_never_writes_over_a_file_no_build_made(tmp_path):
    recipe = _quick_project(tmp_path / "project")
    out = tmp_path / "hub-repo"
    out.mkdir()
    (out / "README.md").write_text("my own model card")
    with pytest.raises(UsageError, match=r"holds README\.md, which no earlier build made and the release would write"):
        build(recipe, out, bench=False, force=True)
    assert [p.name for p in out.iterdir()] == ["README.md"]
    assert (out / "README.md").read_text() == "my own model card"


def test_an_earlier_release_is_what_its_sha256sums_lists(tmp_path):
    """A path in SHA256SUMS that leaves the release is not the release's: nothing outside is touched."""
    recipe = _quick_project(tmp_path / "project")
    out = tmp_path / "release"
    build(recipe, out, bench=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("not the release's")
    (out / "extra.bin").write_text("was it made by a build?")
    with open(out / "SHA256SUMS", "a") as f:
        f.write(f"{'0' * 64}  ../victim.txt\n{'0' * 64}  extra.bin\n")
    build(recipe, out, bench=False)  # extra.bin is listed: the release's, replaced with the rest
    assert not (out / "extra.bin").exists() and victim.read_text() == "not the release's"


def test_a_build_refuses_while_another_holds_the_release(tmp_path):
    import os

    from onnxsmith.io.lock import hold_lock

    recipe = _quick_project(tmp_path / "project")
    out = tmp_path / "release"
    lock = tmp_path / ".release.onnxsmith-lock"
    with hold_lock(lock):
        assert lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(UsageError, match=rf"another onnxsmith build \(pid {os.getpid()}\) is writing this release"):
            build(recipe, out, bench=False)
    assert not out.exists() and not lock.exists()
    lock.write_text("4194304\n")  # left by a build killed with -9: nobody holds it any more
    build(recipe, out, bench=False)
    assert _verified_files(out) == ["same.onnx"] and not lock.exists()


def test_two_builds_into_one_out_at_once(tmp_path):
    """Two real processes, different recipes, one --out: each either wins cleanly or is refused in
    one line (exit 2); the release is wholly one of them, never a mixture, and nothing is left over."""
    import subprocess
    import sys

    from tests.conftest import assert_one_line_error

    out = tmp_path / "releases" / "toy"
    recipes = []
    for name in ("a", "b"):
        root = tmp_path / name
        root.mkdir()
        source = save_toy_faceage(root / "toy.onnx")
        (root / "recipe.toml").write_text(
            recipe_text(source, f'[[variants]]\nname = "{name}"\nsteps = [{{ pass = "shrink" }}]\n')
        )
        recipes.append(root / "recipe.toml")
    build(load_recipe(recipes[0]), out, bench=False)  # both replace an existing release
    command = [sys.executable, "-m", "onnxsmith", "build", "--no-bench", "--out", str(out)]
    processes = [
        subprocess.Popen([*command, str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in recipes
    ]
    results = [
        subprocess.CompletedProcess(p.args, p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in processes
    ]
    codes = sorted(r.returncode for r in results)
    assert codes in ([0, 0], [0, 2]), [(r.returncode, r.stderr[-2000:]) for r in results]
    for r in results:
        assert "Traceback" not in r.stderr
        if r.returncode == 2:
            assert_one_line_error(r, "another onnxsmith build (pid ", "is writing this release")
    files = _verified_files(out)
    assert files in (["a.onnx"], ["b.onnx"])
    assert sorted(p.name for p in out.iterdir()) == sorted([*files, *GENERATED_FILES])
    measured = json.loads((out / "measurements.json").read_text())
    assert [v["file"] for v in measured["variants"]] == files
    assert [p.name for p in out.parent.iterdir()] == ["toy"]  # no staging folder, no lock file
