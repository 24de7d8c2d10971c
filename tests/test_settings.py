"""One declaration per group of settings (settings/), three renderings: the command's flags, the recipe's keys
(and docs/recipe.md), the API's keywords. A field declared once is in all three, with the same range."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import textwrap

import onnx
import pytest

from onnxsmith import api
from onnxsmith.cli.main import COMMANDS, build_parser, command_name
from onnxsmith.core.errors import UsageError
from onnxsmith.release.recipe_schema import RECIPE, reference
from onnxsmith.settings.bench import BenchOptions
from onnxsmith.settings.gate import GateOptions
from onnxsmith.transforms import TRANSFORMS
from tests.support.models import mlp


def _flags(command: str) -> dict[str, object]:
    """The command's options by dest, as its parser declares them."""
    parser = build_parser([command])
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    return {action.dest: action for action in sub.choices[command]._actions}


def _table(name: str):
    return next(node for node in RECIPE.keys if node.name == name)


def _names(options_cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(options_cls)]


def test_the_gate_bounds_are_flags_recipe_keys_and_keywords():
    variant_keys = {key.name: key for key in _table("variants").keys}
    for command in ("fp16", "fuse", "shrink", "compare", "extract"):
        flags = _flags(command)
        assert set(_names(GateOptions)) <= set(flags), command
    assert set(_names(GateOptions)) <= set(variant_keys)
    assert set(_names(GateOptions)) <= set(api._VERIFY_PARAMETERS)
    # The same range in each: a cosine is in [-1, 1] on the command line, in a recipe and in a call.
    assert (variant_keys["min_cosine"].minimum, variant_keys["min_cosine"].maximum) == (-1, 1)
    with pytest.raises(SystemExit):
        build_parser(["fp16"]).parse_args(["fp16", "m.onnx", "o.onnx", "--min-cosine", "1.5"])
    with pytest.raises(UsageError, match=r"onnxsmith.fp16\(\): min_cosine must be in \[-1, 1\], not 1.5"):
        api._arguments("fp16", {"min_cosine": 1.5}, 1, api._TRANSFORM_PARAMETERS)


def test_the_bench_settings_are_flags_recipe_keys_and_keywords():
    fields = _names(BenchOptions)
    assert set(fields) <= set(_flags("bench"))
    assert [key.name for key in _table("bench").keys] == fields
    assert set(fields) <= set(inspect.signature(api.bench).parameters)
    defaults = {key.name: key.default for key in _table("bench").keys}
    assert defaults == dataclasses.asdict(BenchOptions())  # the documented defaults are the declared ones


@pytest.mark.parametrize("name", sorted({command_name(m) for m in COMMANDS} & set(TRANSFORMS.classes())))
def test_every_transform_option_is_a_flag_of_its_command(name):
    options = TRANSFORMS.create(name).Options
    assert set(_names(options)) <= set(_flags(name)), name


def test_an_option_declared_once_is_a_flag_a_recipe_key_and_a_keyword(tmp_path):
    """A new bound added to settings/gate.py alone (here: before anything reads it) is offered by the commands,
    documented and checked in recipes and taken by the API, with its range enforced in each."""
    model = tmp_path / "m.onnx"
    onnx.save(mlp(), model)
    script = textwrap.dedent(
        f"""
        import dataclasses, sys
        import onnxsmith.settings.gate as gate
        from onnxsmith.core.options import TOLERANCE, option

        @dataclasses.dataclass(frozen=True)
        class Extended(gate.GateOptions):
            max_rms: float | None = option(None, "RMS of each output's error at most this", number=TOLERANCE)

        gate.GateOptions = Extended  # declared in one place, before the renderers read it

        from onnxsmith import api
        from onnxsmith.cli.main import main
        from onnxsmith.core.errors import UsageError
        from onnxsmith.release.recipe_schema import reference

        assert "| `max_rms` | non-negative number |" in reference()
        verify, _ = api._arguments("fp16", {{"max_rms": 0.5}}, 1, api._TRANSFORM_PARAMETERS)
        assert verify.gate.max_rms == 0.5
        try:
            api.fp16({str(model)!r}, out={str(tmp_path / "o.onnx")!r}, max_rms=-1)
        except UsageError as err:
            print("api:", err)
        sys.argv = ["onnxsmith", "fp16", {str(model)!r}, {str(tmp_path / "o.onnx")!r}, "--max-rms", "-1"]
        sys.exit(main(sys.argv[1:]))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "api: onnxsmith.fp16(): max_rms must be a non-negative number, not -1" in result.stdout, result.stderr
    assert result.returncode == 2 and "argument --max-rms: expected a finite number >= 0, not '-1'" in result.stderr
    assert "--max-rms" not in reference()  # the real declaration is untouched
    assert not (tmp_path / "o.onnx").exists()
