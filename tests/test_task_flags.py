"""``validate`` and ``predict`` take the options of the task ``--task`` names, and only those (issue 25)."""

from __future__ import annotations

import dataclasses

import pytest

from onnxsmith.cli.main import build_parser
from onnxsmith.cli.task_args import task_options_from_args
from onnxsmith.settings.tasks import TASK_SETTINGS
from onnxsmith.tasks import get_task, tasks
from tests.conftest import assert_one_line_error

COMMANDS = {"validate": ["a.onnx", "b.onnx"], "predict": ["a.onnx", "face.png"]}


def _flags(name: str) -> set[str]:
    return {"--" + f.name.replace("_", "-") for f in dataclasses.fields(TASK_SETTINGS[name].options)}


def _parse(command: str, *words: str):
    argv = [command, *COMMANDS[command], *words]
    return build_parser(argv).parse_args(argv)


def test_every_task_takes_its_name_line_and_options_from_its_settings():
    assert sorted(TASK_SETTINGS) == sorted(tasks())
    for name, cls in tasks().items():
        settings = TASK_SETTINGS[name]
        assert (cls.name, cls.summary) == (settings.name, settings.summary)
        # a task may check more (generic parses --shape): a subclass, never other fields
        assert issubclass(cls.Options, settings.options)
        assert dataclasses.fields(cls.Options) == dataclasses.fields(settings.options)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_without_a_task_lists_the_tasks(cli, command):
    result = cli(command, "--help")
    assert result.returncode == 0
    assert f"onnxsmith {command} --task NAME --help shows that task's options" in result.stdout
    for name, settings in TASK_SETTINGS.items():
        assert f"  {name} " in result.stdout and settings.summary.split()[0] in result.stdout
        assert not any(flag in result.stdout for flag in _flags(name) - {"--data"}), name  # no task's flags


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name", sorted(TASK_SETTINGS))
def test_help_of_a_task_shows_its_options_only(cli, command, name):
    result = cli(command, "--task", name, "--help")
    assert result.returncode == 0
    assert f"task '{name}' options:" in result.stdout
    for flag in _flags(name):
        assert f"  {flag} " in result.stdout, flag
    others = set().union(*(_flags(other) for other in TASK_SETTINGS)) - _flags(name)
    assert not [flag for flag in others if flag in result.stdout.replace("--batch-size", "")], others
    assert "tasks (" not in result.stdout  # the list of tasks is for choosing one


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name", sorted(TASK_SETTINGS))
def test_no_task_option_is_a_flag_of_the_command_itself(command, name):
    """A task's field named like the command's own flag or argument would take its value."""
    own = {a.dest for a in build_parser([command])._subparsers._group_actions[0].choices[command]._actions}
    assert not own & {f.name for f in dataclasses.fields(TASK_SETTINGS[name].options)}
    _parse(command, "--task", name)  # its group is added without a conflict


@pytest.mark.parametrize(
    "words, flag, task",
    [
        (["--task", "generic", "--boxes", "b.txt"], "--boxes", "generic"),
        (["--task", "faceage", "--text=t.txt"], "--text", "faceage"),
        # lm's --batch is a prefix of faceage's --batch-size: argparse alone would take it as that
        (["--batch", "4", "--task", "faceage"], "--batch", "faceage"),
        (["--task=lm", "--min-face", "3"], "--min-face", "lm"),
    ],
)
def test_another_tasks_flag_is_refused_in_one_line(cli, words, flag, task):
    result = cli("validate", "a.onnx", "b.onnx", *words)
    assert_one_line_error(result, f"{flag} is not an option of task '{task}'", f"--task {task} --help")


@pytest.mark.parametrize(
    "command, words, message",
    [
        ("validate", ["--task", "faceage", "--min-face", "big"], "--min-face expects int, got 'big'"),
        ("validate", ["--task", "faceage", "--padding", "inf"], "--padding expects a finite number, got 'inf'"),
        ("validate", ["--task", "lm", "--window", "1.5"], "--window expects int, got '1.5'"),
        ("validate", ["--task", "generic", "--samples", "x"], "--samples expects a positive integer, got 'x'"),
        ("validate", ["--task", "generic", "--seed", "-1"], "--seed expects a non-negative integer, got '-1'"),
        ("predict", ["--task", "faceage", "--limit", "many"], "--limit expects int, got 'many'"),
        # converted, then checked by the options' own rules
        ("validate", ["--task", "lm", "--window", "1"], "window must be >= 2"),
        ("validate", ["--task", "generic", "--min-cosine", "2"], "--min-cosine expects a cosine in [-1, 1], got '2'"),
        ("validate", ["--task", "generic", "--shape", "x:1,a"], "shape x:1,a: dims must be integers"),
    ],
)
def test_a_bad_value_is_refused_in_one_line(cli, command, words, message):
    assert_one_line_error(cli(command, *COMMANDS[command], *words), message)


def test_values_are_converted_to_the_options_types():
    args = _parse("validate", "--task", "faceage", "--padding", "0.25", "--limit", "3", "--age-output", "age")
    options = task_options_from_args(args, get_task("faceage"))
    assert (options.padding, options.limit, options.age_output, options.min_face) == (0.25, 3, "age", 32)
    args = _parse("validate", "--task", "generic", "--shape", "x:1,3", "--shape", "n=2", "--input-role", "x=NHWC,0..1")
    options = task_options_from_args(args, get_task("generic"))
    assert options.shape == ["x:1,3", "n=2"] and options.input_role == ["x=NHWC,0..1"]
    args = _parse("predict", "--task", "lm", "--max-windows", "5")
    assert task_options_from_args(args, get_task("lm")).max_windows == 5
