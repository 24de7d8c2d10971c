"""Recipes: every key's line is known, and every mistake is reported at its line (exit 2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import tomllib

from onnxsmith.core.errors import InputError
from onnxsmith.core.transform import StepReport, Transform, register
from onnxsmith.release.recipe import RecipeError, key_lines, load_recipe
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
            VARIANT,
            validation=VALIDATION + "gates = { max_abs_age_error = 0.2 }",
            bench="[bench]\nbatch = [1, 4]\nruns = 3",
        ),
    )
    assert recipe.source == source
    assert [(s.name, s.options.amount) for s in recipe.variants[0].steps] == [("test-only-offset", 0.5)]
    assert recipe.variants[0].file == "v.onnx"
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
