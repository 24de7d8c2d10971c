"""Recipes: every key's line is known, and every mistake is reported at its line (exit 2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import tomllib

from onnxsmith.errors import InputError
from onnxsmith.pipeline.recipe import RecipeError, key_lines, load_recipe
from onnxsmith.pipeline.transform import StepReport, Transform, register
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
