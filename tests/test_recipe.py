"""Recipes: every key's line is known, and every mistake is reported at its line (exit 2)."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field

import pytest
import tomllib

from onnxsmith.core.errors import InputError
from onnxsmith.core.transform import StepReport, Transform, register
from onnxsmith.release.bench import BenchSettings
from onnxsmith.release.key_lines import key_lines
from onnxsmith.release.recipe import RecipeError, load_recipe
from onnxsmith.tasks import get_task
from tests.conftest import assert_one_line_error
from tests.support.release import face_images, recipe_text, save_toy_faceage, wider_annotations


@dataclass
class OffsetOptions:
    amount: float = field(default=0.0, metadata={"help": "added to the age bias"})
    mode: str = field(default="add", metadata={"choices": ["add", "sub"]})

    def validate(self) -> None:
        if self.amount < 0:
            raise ValueError("amount must be >= 0")


@register
class TestOnlyOffset(Transform):
    """A transform that exists only in this test process (recipes are read in-process here)."""

    name = "test-only-offset"
    Options = OffsetOptions

    def apply(self, model, options, context):  # pragma: no cover - recipes are only read here
        return StepReport(self.name, {})


def test_key_lines_cover_tables_arrays_inline_tables_and_dotted_keys():
    text = (
        '# a comment\n[source]\npath = "a.onnx"  # trailing\n\n'
        '[[variants]]\nname = "x"\nsteps = [\n  { pass = "fp16", keep = true },\n'
        '  {pass=\'fuse\', "precision" = "fp32"},\n]\n'
        '[[variants]]\nname = "y"\n[[variants.steps]]\npass = "a"\n[[variants.steps]]\npass = "b"\n'
        'opt.sub = 3\n[validation]\ngates = { max = 0.1, min = 1 }\ntext = """two\nlines"""\nafter = 1\n'
    )
    tomllib.loads(text)  # valid TOML
    lines = key_lines(text)
    assert lines[("source", "path")] == 3
    assert lines[("variants", 0, "steps", 0, "keep")] == 8
    assert lines[("variants", 0, "steps", 1, "precision")] == 9
    assert lines[("variants", 1)] == 11
    assert lines[("variants", 1, "steps", 1, "pass")] == 16
    assert lines[("variants", 1, "steps", 1, "opt", "sub")] == 17
    assert lines[("validation", "gates", "min")] == 19
    assert lines[("validation", "after")] == 22  # after a multi-line string


@pytest.fixture
def setup(tmp_path):
    source = save_toy_faceage(tmp_path / "toy.onnx")
    images = face_images(tmp_path / "images", count=2)
    (tmp_path / "images" / "boxes.txt").write_text(wider_annotations([(n, [b]) for n, b in images]))
    return tmp_path, source


VARIANT = '[[variants]]\nname = "v"\nsteps = [{ pass = "test-only-offset", amount = 0.5 }]\n'
VALIDATION = '[validation]\ntask = "faceage"\ndata = "images"\nboxes = "images/boxes.txt"\n'


def _load(tmp_path, text):
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return load_recipe(path)


def test_a_good_recipe(setup):
    tmp_path, source = setup
    recipe = _load(
        tmp_path,
        recipe_text(
            source,
            VARIANT + "min_cosine = 0.99\n",
            validation=VALIDATION + "gates = { max_abs_age_error = 0.2 }",
            bench="[bench]\nbatch = [1, 4]\nruns = 3",
        ),
    )
    assert recipe.source == source
    assert [(s.name, s.options.amount) for s in recipe.variants[0].steps] == [("test-only-offset", 0.5)]
    assert recipe.variants[0].file == "v.onnx"
    assert (recipe.variants[0].gate.min_cosine, recipe.variants[0].gate.rtol) == (0.99, None)  # the one gate's bounds
    assert recipe.validation.gates == {"max_abs_age_error": 0.2, "gender_agreement": 1.0, "nonfinite": 0}
    assert recipe.validation.options.boxes == str(tmp_path / "images" / "boxes.txt")
    assert recipe.bench.batches == [1, 4] and recipe.bench.runs == 3


@pytest.mark.parametrize(
    "variants, validation, line, needle",
    [
        ('[[variants]]\nname = "v"\nsteps = [{ pass = "nope" }]\n', "", 7, "unknown pass 'nope'"),
        (
            '[[variants]]\nname = "v"\nsteps = [\n  { pass = "test-only-offset" },\n  { pass = "test-only-offset", '
            "amout = 1 },\n]\n",
            "",
            9,
            "step 2 (test-only-offset): unknown option 'amout'",
        ),
        (
            '[[variants]]\nname = "v"\nsteps = [{ pass = "test-only-offset", mode = "mul" }]\n',
            "",
            7,
            "option 'mode' must be one of add, sub",
        ),
        (
            '[[variants]]\nname = "v"\nsteps = [{ pass = "test-only-offset", amount = "big" }]\n',
            "",
            7,
            "option 'amount' expects float",
        ),
        (
            '[[variants]]\nname = "v"\nsteps = [{ pass = "test-only-offset", amount = -1 }]\n',
            "",
            7,
            "amount must be >= 0",
        ),
        ('[[variants]]\nname = "v"\nstep = []\n', "", 7, "unknown key 'step'"),
        (VARIANT + VARIANT, "", 9, "two variants are named 'v'"),
        (VARIANT, '[validation]\ntask = "faceage"\ndata = "imagez"\n', 11, "data: no such file or folder 'imagez'"),
        (VARIANT, VALIDATION + "gates = { max_age = 1 }\n", 13, "task 'faceage' has no metric 'max_age'"),
        (VARIANT, VALIDATION + "min_face = -3\n", 13, "min_face must be >= 0"),
        (VARIANT, '[validation]\ntask = "ageface"\n', 10, "unknown task 'ageface'"),
        (VARIANT, "[bench]\nbatch = [1, 0]\n", 10, "batch must be a list of positive integers"),
        (VARIANT, "[benchmark]\nruns = 1\n", 9, "unknown section or key 'benchmark'"),
    ],
)
def test_recipe_errors_name_their_line(setup, variants, validation, line, needle):
    tmp_path, source = setup
    text = recipe_text(source, variants, validation=validation)
    with pytest.raises(RecipeError) as err:
        _load(tmp_path, text)
    message = err.value.one_line()
    assert message.startswith(f"{tmp_path / 'recipe.toml'}:{line}: "), message
    assert needle in message, message
    assert err.value.exit_code == 2


def test_source_pinning(setup):
    tmp_path, source = setup
    text = recipe_text(source, VARIANT)
    wrong = re.sub(r'sha256 = "[0-9a-f]+"', 'sha256 = "' + "0" * 64 + '"', text)
    with pytest.raises(RecipeError, match=r"recipe.toml:3: \[source\] sha256 mismatch"):
        _load(tmp_path, wrong)
    unpinned = re.sub(r'sha256 = "[0-9a-f]+"\n', "", text)
    with pytest.raises(RecipeError, match=r"recipe.toml:1: \[source\] needs sha256 .* this file's is \"[0-9a-f]{64}\""):
        _load(tmp_path, unpinned)
    missing = text.replace('path = "toy.onnx"', 'path = "gone.onnx"')
    with pytest.raises(RecipeError, match=r"recipe.toml:2: \[source\] path: no such file or folder 'gone.onnx'"):
        _load(tmp_path, missing)


def test_invalid_toml_and_missing_recipe(setup):
    tmp_path, source = setup
    with pytest.raises(RecipeError, match=r"recipe.toml:6: not valid TOML: .* \(column 12\)"):
        _load(tmp_path, recipe_text(source, '[[variants]]\nname = "v" "w"\nsteps = []\n'))
    with pytest.raises(RecipeError, match=r"recipe.toml:7: not valid TOML: Unclosed array"):
        _load(tmp_path, recipe_text(source, '[[variants]]\nname = "v"\nsteps = [{ pass = "x" }\n'))
    with pytest.raises(InputError, match="no such recipe file"):
        load_recipe(tmp_path / "absent.toml")


def test_build_reports_a_bad_recipe_in_one_line_and_writes_nothing(setup, cli):
    tmp_path, source = setup
    (tmp_path / "recipe.toml").write_text(
        recipe_text(source, '[[variants]]\nname = "v"\nsteps = [{ pass = "no-such-pass" }]\n')
    )
    result = cli("build", tmp_path / "recipe.toml", "--out", tmp_path / "out")
    assert_one_line_error(result, "recipe.toml:7:", "unknown pass 'no-such-pass'", code=2)
    assert not (tmp_path / "out").exists()


def test_a_bad_option_of_a_real_transform_in_the_example_recipe(tmp_path):
    from tests.support.release import EXAMPLE

    text = (EXAMPLE / "recipe.toml").read_text().replace('precision = "fp32"', 'precision = "fp8"')
    for relative in ('"../../tests/', '"images', '"LICENSE.txt"'):  # the copy lives elsewhere
        text = text.replace(relative, '"' + str(EXAMPLE) + "/" + relative[1:])
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "fp8" in t)
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert (
        f"recipe.toml:{line}: variant 'fused-fp32' step 1 (fuse): option 'precision' must be one of"
        in err.value.one_line()
    )


# ---- what a release publishes ------------------------------------------------------------


@pytest.fixture
def project(tmp_path):
    """A recipe's folder with a source model, beside a folder of files the recipe must not publish."""
    root = tmp_path / "project"
    root.mkdir()
    source = save_toy_faceage(root / "toy.onnx")
    secret = tmp_path / "elsewhere" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:$6$not-for-a-release\n")
    (root / "tokenizer.json").write_text("{}\n")
    return root, source, secret


def _line(text: str, start: str) -> int:
    return next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith(start))


def _release(include: list[str], extra: str = "") -> str:
    return "[release]\n" + extra + "include = [" + ", ".join(f'"{p}"' for p in include) + "]\n"


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink", "symlinked folder"])
def test_include_outside_the_recipes_folder_is_refused_at_its_line(project, how):
    root, source, secret = project
    if how == "absolute":
        item = str(secret)
    elif how == "dotdot":
        item = "../elsewhere/shadow"
    elif how == "symlink":
        (root / "shadow").symlink_to(secret)
        item = "shadow"
    else:
        (root / "linked").symlink_to(secret.parent, target_is_directory=True)
        item = "linked/shadow"
    text = recipe_text(source, VARIANT) + _release(["tokenizer.json", item])
    with pytest.raises(RecipeError) as err:
        _load(root, text)
    message = err.value.one_line()
    line = _line(text, "include")
    assert message.startswith(f"{root / 'recipe.toml'}:{line}: [release] include: '{item}' resolves to "), message
    assert f"{secret}, outside the recipe's folder" in message and "allow_outside = true" in message
    assert err.value.exit_code == 2


def test_license_file_outside_the_recipes_folder_is_refused(project):
    root, source, _ = project
    text = recipe_text(source, VARIANT, card='[card]\nlicense_file = "../elsewhere/shadow"')
    with pytest.raises(RecipeError) as err:
        _load(root, text)
    assert f"recipe.toml:{_line(text, 'license_file')}: [card] license_file: '../elsewhere/shadow' resolves to" in str(
        err.value
    )


def test_allow_outside_lets_them_in_and_says_which(project):
    root, source, secret = project
    (root / "link.json").symlink_to(secret)
    text = recipe_text(source, VARIANT, card='[card]\nlicense_file = "../elsewhere/shadow"') + _release(
        ["tokenizer.json", "link.json", str(secret)], extra="allow_outside = true\n"
    )
    recipe = _load(root, text.replace(f'"{secret}"', '"../elsewhere/shadow"'))
    assert [p.name for p in recipe.include] == ["tokenizer.json", "link.json", "shadow"]
    assert recipe.outside == ["link.json", "shadow", "license_file"]  # not tokenizer.json: it is inside
    assert recipe.license_text() == secret.read_text()


@pytest.mark.parametrize("name", ["README.md", "SHA256SUMS", "measurements.json", "report.html", "recipe.toml"])
def test_an_include_named_like_a_file_the_build_writes_is_refused(project, name):
    root, source, _ = project
    (root / "docs").mkdir()
    (root / "docs" / name).write_text("mine\n")
    text = recipe_text(source, VARIANT) + _release([f"docs/{name}"])
    with pytest.raises(
        RecipeError,
        match=rf"recipe.toml:\d+: \[release\] include: {name} would take the name of the release's own {name}",
    ):
        _load(root, text)


@pytest.mark.parametrize(
    "variants, needle",
    [
        # "$" matches before a trailing newline: the file's name must match whole
        ('[[variants]]\nname = "v"\nfile = "v.onnx\\n"\nsteps = []\n', "file must be a name ending in .onnx"),
        ('[[variants]]\nname = "v"\nfile = "v\\u0007.onnx"\nsteps = []\n', "file must be a name ending in .onnx"),
        ('[[variants]]\nname = "v\\n"\nfile = "v.onnx"\nsteps = []\n', 'needs name = "..."'),
        (
            '[[variants]]\nname = "a"\nfile = "a.onnx"\nsteps = []\n[[variants]]\nname = "b"\nfile = "a.onnx/b.onnx"\nsteps = []\n',
            "variant 'b': file a.onnx/b.onnx needs a folder 'a.onnx', which is the name of variant 'a''s file",
        ),
        (
            '[[variants]]\nname = "b"\nfile = "README.md/b.onnx"\nsteps = []\n',
            "needs a folder 'README.md', which is the name of the release's own README.md",
        ),
    ],
)
def test_variant_files_that_cannot_be_written_are_refused(project, variants, needle):
    root, source, _ = project
    with pytest.raises(RecipeError) as err:
        _load(root, recipe_text(source, variants))
    assert needle in err.value.one_line()
    assert re.match(rf"{re.escape(str(root / 'recipe.toml'))}:\d+: ", err.value.one_line())


def test_an_include_named_like_a_variant_folder_or_data_file_is_refused(project):
    root, source, _ = project
    (root / "onnx").write_text("a file, not a folder\n")
    (root / "v.onnx.data").write_bytes(b"\0")
    folder = '[[variants]]\nname = "v"\nfile = "onnx/v.onnx"\nsteps = []\n'
    with pytest.raises(
        RecipeError,
        match=r"variant 'v': file onnx/v\.onnx needs a folder 'onnx', which is the name of the included onnx",
    ):
        _load(root, recipe_text(source, folder) + _release(["onnx"]))
    with pytest.raises(RecipeError, match=r"include: v\.onnx\.data would take the name of variant 'v''s data file"):
        _load(root, recipe_text(source, VARIANT) + _release(["v.onnx.data"]))


def test_a_binary_license_file_is_one_line_exit_2(project, cli):
    root, source, _ = project
    (root / "LICENSE.bin").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    text = recipe_text(source, VARIANT, card='[card]\nlicense_file = "LICENSE.bin"')
    (root / "recipe.toml").write_text(text)
    line = _line(text, "license_file")
    result = cli("build", root / "recipe.toml", "--out", root / "out")
    assert_one_line_error(result, f"recipe.toml:{line}: [card] license_file: LICENSE.bin is not UTF-8 text (byte 0x89")
    (root / "LICENSE.bin").write_bytes(b"text\0more")
    result = cli("build", root / "recipe.toml", "--out", root / "out")
    assert_one_line_error(
        result, f"recipe.toml:{line}: [card] license_file: LICENSE.bin is binary (a NUL byte at offset 4)"
    )
    assert not (root / "out").exists()


def test_build_reading_etc_shadow_style_paths_is_one_line_exit_2(project, cli):
    """Through the CLI, as a user would meet it: nothing is written, nothing is read into a release."""
    root, source, secret = project
    text = recipe_text(source, VARIANT) + _release([str(secret)])
    (root / "recipe.toml").write_text(text)
    result = cli("build", root / "recipe.toml", "--out", root / "out")
    assert_one_line_error(result, f"recipe.toml:{_line(text, 'include')}: [release] include:", "outside the recipe's")
    assert not (root / "out").exists()


def test_an_include_whose_name_has_a_control_character_is_refused(project):
    root, source, _ = project
    (root / "vocab\n.txt").write_text("a b c\n")  # its line in SHA256SUMS would be two lines
    with pytest.raises(RecipeError, match=r"include: the name 'vocab\\n.txt' has a control character"):
        _load(root, recipe_text(source, VARIANT) + '[release]\ninclude = ["vocab\\n.txt"]\n')


# ---- lines in every TOML layout; the schema and its reference ------------------------------


def test_key_lines_are_not_fooled_by_strings_comments_and_line_endings():
    text = (
        '[card]\ndescription = """\n[bench]\nbatch = [1, 0]\n"""  # a string that looks like tables\n'
        "title = 'x = [ # ]'\n"
        '[release]\ninclude = [\n  # a comment, [not an element]\n  "a",\n\n  \'b\', "c",\n  "d"]\n'
        '[[variants]]\nsteps = [\n  { pass = "fp16" }, # },\n  [[1, 2],\n   [3]],\n]\n'
        "[a.b]\nc.d = [\n  1,\n  2]\n"
    )
    tomllib.loads(text)
    lines = key_lines(text)
    assert ("bench",) not in lines and ("bench", "batch") not in lines
    assert lines[("card", "title")] == 6
    assert [lines[("release", "include", i)] for i in range(4)] == [10, 12, 12, 13]
    assert lines[("variants", 0, "steps", 0, "pass")] == 16
    assert lines[("variants", 0, "steps", 1)] == 18  # a multi-line element: where it ends
    assert lines[("a", "b", "c", "d", 1)] == 23
    crlf = text.replace("\n", "\r\n")
    assert key_lines(crlf) == lines


def _nth_line(text: str, needle: str) -> int:
    return next(i for i, t in enumerate(text.splitlines(), 1) if needle in t)


STEPS_AS_TABLES = (
    '[[variants]]\nname = "v"\n\n[[variants.steps]]\npass = "test-only-offset"\n\n'
    '[[variants.steps]]\npass = "test-only-offset"\nmode = "add"\namout = 1\n'
)
STEPS_SPREAD = (
    '[[variants]]\nname = "ok"\nsteps = [{ pass = "test-only-offset" }]\n\n[[variants]]\nname = "v"\n'
    'description = """\nsteps = [ { pass = "amout" } ]\n"""\nsteps = [\n  # first\n'
    '  { pass = "test-only-offset" },\n  { pass = "test-only-offset", mode = "add" },  # ok so far\n'
    '  { pass = "test-only-offset", amout = 1 },\n]\n'
)


@pytest.mark.parametrize(
    "variants, more, marker, needle",
    [
        # arrays of tables: the second [[variants.steps]] of the variant
        (STEPS_AS_TABLES, "", "amout = 1", "variant 'v' step 2 (test-only-offset): unknown option 'amout'"),
        # a multi-line array of inline tables, after a string that looks like one
        (STEPS_SPREAD, "", "amout = 1 }", "variant 'v' step 3 (test-only-offset): unknown option 'amout'"),
        # a sub-table of a section, and a dotted key
        (VARIANT, VALIDATION + "[validation.gates]\nnonfinite = 0\nmax_age = 1\n", "max_age", "no metric 'max_age'"),
        (VARIANT, VALIDATION + "gates.max_age = 1\n", "gates.max_age", "no metric 'max_age'"),
        # one element of a multi-line list
        (VARIANT, '[bench]\nshape = [\n  "x:1,3",\n  "x:1,a",\n]\n', '"x:1,a"', "[bench] shape x:1,a: dims must be"),
        (VARIANT, '[validation]\ntask = "generic"\nshape = ["x:1,3", "=3"]\n', "shape =", "shape =3: expected DIM=N"),
        (VARIANT, "[bench]\nruns = 0\n", "runs = 0", "[bench] runs must be a positive integer, not 0"),
        (
            VARIANT,
            '[card]\nlicense = "MIT"\nlicense_file = "toy.onnx"\n',
            "[card]",
            "give license or license_file, not both",
        ),
    ],
)
def test_recipe_errors_name_the_line_in_every_toml_layout(setup, variants, more, marker, needle):
    tmp_path, source = setup
    text = recipe_text(source, variants, validation=more)
    with pytest.raises(RecipeError) as err:
        _load(tmp_path, text)
    message = err.value.one_line()
    assert message.startswith(f"{tmp_path / 'recipe.toml'}:{_nth_line(text, marker)}: "), (message, text)
    assert needle in message, message


def test_a_section_written_as_an_inline_table_is_checked_at_its_line(setup):
    tmp_path, source = setup
    text = "bench = { runs = 2, batch = [1, 0] }\n" + recipe_text(source, VARIANT)
    with pytest.raises(RecipeError, match=r"recipe.toml:1: \[bench\] batch must be a list of positive integers"):
        _load(tmp_path, text)
    assert _load(tmp_path, text.replace("[1, 0]", "[1, 3]")).bench.batches == [1, 3]


def test_a_recipe_in_another_layout_reads_the_same(setup):
    """[[variants.steps]] sections and multi-line arrays are the same recipe as inline tables."""
    tmp_path, source = setup
    inline = _load(tmp_path, recipe_text(source, VARIANT, bench="[bench]\nbatch = [1, 4]\nshape = ['x:1,3']"))
    tables = _load(
        tmp_path,
        recipe_text(
            source,
            '[[variants]]\nname = "v"\n[[variants.steps]]\npass = "test-only-offset"\namount = 0.5\n',
            bench='[bench]\nbatch = [\n  1,\n  4,\n]\nshape = ["x:1,3"]',
        ),
    )
    for recipe in (inline, tables):
        assert [(v.name, v.file, [(s.name, s.options) for s in v.steps]) for v in recipe.variants] == [
            ("v", "v.onnx", [("test-only-offset", OffsetOptions(amount=0.5))])
        ]
    assert tables.bench == inline.bench == BenchSettings(batches=[1, 4], shape=["x:1,3"])


def test_docs_recipe_md_is_the_schemas_reference():
    from tools.recipe_reference import DOC, documented

    from onnxsmith.release.recipe_schema import reference

    assert documented(DOC.read_text(encoding="utf-8")).strip() == reference().strip(), (
        "docs/recipe.md's key reference differs from the schema: run python -m tools.recipe_reference"
    )


def _schema_keys(table, prefix=()) -> set[tuple[str, ...]]:
    from onnxsmith.release.recipe_schema import Table

    keys = set()
    for node in table.nodes:
        keys.add(prefix + (node.name,))
        if isinstance(node, Table):
            keys |= _schema_keys(node, prefix + (node.name,))
    return keys


def test_every_key_the_readme_and_the_examples_use_is_in_the_schema():
    """The README's recipe is not built (its files are not here): its keys are checked against the schema."""
    from onnxsmith.release.recipe_schema import RECIPE
    from tests.support.release import EXAMPLE, REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## A recipe\s*```toml\n(.*?)```", readme, re.S).group(1)
    known = _schema_keys(RECIPE)
    task_options = {f.name for f in dataclasses.fields(get_task("faceage").Options)}
    for data in (tomllib.loads(block), tomllib.loads((EXAMPLE / "recipe.toml").read_text())):
        used = set()
        for section, table in data.items():
            for element in table if isinstance(table, list) else [table]:
                used |= {(section, key) for key in element}
        used -= {("validation", key) for key in task_options}
        assert used <= known, used - known


def test_the_schema_is_what_the_reader_accepts(setup):
    """Each documented key with a default is accepted as written in the reference's default column."""
    from onnxsmith.release.recipe_schema import RECIPE

    tmp_path, source = setup
    bench = next(t for t in RECIPE.keys if t.name == "bench")
    text = "[bench]\n" + "".join(f"{k.name} = {json.dumps(k.default)}\n" for k in bench.keys if k.default is not None)
    recipe = _load(tmp_path, recipe_text(source, VARIANT, bench=text))
    assert recipe.bench == BenchSettings(batches=[1])  # the defaults the reference shows are BenchSettings'


def test_a_step_names_its_transform_and_the_older_pass_still_builds_with_a_note(setup):
    """``transform = "..."`` names a step's transform; ``pass = "..."`` (its older name) is still read, and the
    recipe gets a note at that line saying what to write."""
    tmp_path, source = setup
    new = _load(
        tmp_path, recipe_text(source, '[[variants]]\nname = "v"\nsteps = [{ transform = "test-only-offset" }]\n')
    )
    assert [step.name for step in new.variants[0].steps] == ["test-only-offset"] and not new.notes
    old = _load(tmp_path, recipe_text(source, '[[variants]]\nname = "v"\nsteps = [{ pass = "test-only-offset" }]\n'))
    assert [step.name for step in old.variants[0].steps] == ["test-only-offset"]
    assert len(old.notes) == 1 and old.notes[0].endswith(':7: `pass = "..."` is deprecated: write `transform = "..."`')
    with pytest.raises(RecipeError, match="unknown transform 'nope'"):
        _load(tmp_path, recipe_text(source, '[[variants]]\nname = "v"\nsteps = [{ transform = "nope" }]\n'))
