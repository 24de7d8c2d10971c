"""One declaration per group of settings (settings/), three renderings: the command's flags, the recipe's keys
(and docs/recipe.md), the API's keywords. A field declared once is in all three, with the same range."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest

from onnxsmith import api
from onnxsmith.cli.main import COMMANDS, build_parser, command_name
from onnxsmith.core import options as opts
from onnxsmith.core.errors import UsageError
from onnxsmith.release.recipe_schema import RECIPE, reference
from onnxsmith.settings.bench import BenchOptions
from onnxsmith.settings.gate import GateOptions
from onnxsmith.settings.inputs import InputOptions
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


def _extended(module: str, cls: str, field: str) -> str:
    """The start of a script in which ``onnxsmith.settings.<module>.<cls>`` has one more field, declared there
    alone before anything reads it (the real declaration is untouched)."""
    return textwrap.dedent(
        f"""
        import dataclasses, sys
        import onnxsmith.settings.{module} as declared
        from onnxsmith.core.options import COUNT, TOLERANCE, option

        @dataclasses.dataclass(frozen=True)
        class Extended(declared.{cls}):
            {field}

        declared.{cls} = Extended
        """
    )


def test_an_option_declared_once_is_a_flag_a_recipe_key_and_a_keyword(tmp_path):
    """A new bound added to settings/gate.py alone (here: before anything reads it) is offered by the commands,
    documented and checked in recipes and taken by the API, with its range enforced in each."""
    model = tmp_path / "m.onnx"
    onnx.save(mlp(), model)
    script = _extended(
        "gate",
        "GateOptions",
        'max_rms: float | None = option(None, "RMS of each output\'s error at most this", number=TOLERANCE)',
    ) + textwrap.dedent(
        f"""
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


#: Each verifying command's default ``--samples``, as it was before settings/inputs.py declared the flags.
_SAMPLES = {"fp16": 4, "fuse": 2, "shrink": 2, "int8": 4, "extract": 2, "compare": 1}


def _inputs_of(argv: list[str]) -> dict[str, object]:
    from onnxsmith.cli.common import input_keywords

    return input_keywords(build_parser(argv[:1]).parse_args(argv))


def _cli_args(command: str) -> list[str]:
    return [command, "a.onnx", "b.onnx", *(["--outputs", "y"] if command == "extract" else [])]


@pytest.mark.parametrize("command", sorted(_SAMPLES))
def test_the_input_settings_are_flags_and_keywords_with_each_commands_samples(command):
    flags = _flags(command)
    assert set(_names(InputOptions)) <= set(flags), command
    assert set(_names(InputOptions)) <= set(api._VERIFY_PARAMETERS)
    given = _inputs_of(_cli_args(command))
    assert given == {**opts.to_json(InputOptions()), "samples": _SAMPLES[command]}  # read back through the spec
    assert f"(default: {_SAMPLES[command]})" in flags["samples"].help
    # the command's default is its API call's (the CLI calls api.transform, whose own default is 4)
    call = getattr(api, command)
    assert inspect.signature(call).parameters["samples"].default == _SAMPLES[command]


@pytest.mark.parametrize("command", ["fp16", "compare"])
def test_calib_and_inputs_are_one_setting(command):
    feeds = _flags(command)["feeds"]
    assert feeds.option_strings == ["--inputs", "--calib"]
    assert "--calib is the same flag" in feeds.help
    assert "calib" not in _flags(command)  # no second setting to disagree with the first
    args = _cli_args(command)
    assert _inputs_of([*args, "--calib", "d"]) == _inputs_of([*args, "--inputs", "d"])
    assert _inputs_of([*args, "--calib", "d"])["feeds"] == "d"


def test_extract_names_its_input_arrays_input_data():
    """Its --inputs names the piece's input tensors: the arrays are --input-data, and there is no --calib."""
    flags = _flags("extract")
    assert flags["feeds"].option_strings == ["--input-data"]
    assert flags["inputs"].option_strings == ["--inputs"]
    assert not any("--calib" in action.option_strings for action in flags.values())
    given = _inputs_of([*_cli_args("extract"), "--inputs", "t", "--input-data", "x.npz"])
    assert given["feeds"] == "x.npz"


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"samples": 0}, "onnxsmith.fp16(): samples must be a positive integer, not 0"),
        ({"seed": -1}, "onnxsmith.fp16(): seed must be a non-negative integer, not -1"),
        ({"seed": 1.5}, "onnxsmith.fp16(): option 'seed' expects int, got 1.5"),
    ],
)
def test_an_input_setting_out_of_range_is_refused_in_one_line(keywords, message):
    samples = keywords.pop("samples", 4)
    with pytest.raises(UsageError) as err:
        api._arguments("fp16", keywords, samples, api._TRANSFORM_PARAMETERS)
    assert err.value.one_line() == message


def test_the_api_widens_the_declared_inputs():
    """``VerifySettings`` is the declared inputs, ``feeds``/``shape``/``input_role`` taking what a call passes."""
    assert issubclass(api.VerifySettings, InputOptions)
    arrays = {"x": np.zeros((1, 4), np.float32)}
    verify, _ = api._arguments(
        "fp16", {"feeds": [arrays], "shape": {"batch": 2}, "input_role": "x=generic", "seed": np.int64(3)}, 4, ()
    )
    assert verify.feeds == [arrays] and verify.shape == {"batch": 2} and verify.input_role == "x=generic"
    assert verify.seed == 3 and type(verify.seed) is int


def test_an_input_setting_declared_once_is_a_flag_and_a_keyword(tmp_path):
    """A new setting added to settings/inputs.py alone (before anything reads it) is a flag of every transform
    command, read back from it and handed to the API, which takes it as a keyword, its range enforced."""
    model = tmp_path / "m.onnx"
    onnx.save(mlp(), model)
    script = _extended(
        "inputs", "InputOptions", 'warmup: int = option(0, "untimed runs of each model first", number=COUNT)'
    ) + textwrap.dedent(
        f"""
        import contextlib, io
        from onnxsmith import api
        from onnxsmith.cli.main import main
        from onnxsmith.core.errors import UsageError

        shown = io.StringIO()
        with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
            main(["fp16", "--help"])
        print("help:", " ".join(shown.getvalue().split()))
        verify, _ = api._arguments("fp16", {{"warmup": 3}}, 4, api._TRANSFORM_PARAMETERS)
        assert verify.warmup == 3
        try:
            api.fp16({str(model)!r}, out={str(tmp_path / "o.onnx")!r}, warmup=-1)
        except UsageError as err:
            print("api:", err)
        sys.exit(main(["fp16", {str(model)!r}, {str(tmp_path / "o.onnx")!r}, "--warmup", "2"]))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "--warmup WARMUP untimed runs of each model first (default: 0)" in result.stdout, result.stderr
    assert "api: onnxsmith.fp16(): warmup must be a non-negative integer, not -1" in result.stdout, result.stderr
    assert result.returncode == 0, result.stderr  # the command read it back and the API took it
    assert (tmp_path / "o.onnx").exists()
    assert "warmup" not in _names(InputOptions)  # the real declaration is untouched
