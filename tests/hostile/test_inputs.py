"""Every kind of broken or malicious model (tests/hostile/broken.py) against every command that takes one.

Each must end in exit 2 with exactly one line on stderr naming the file and the problem, no
traceback, every input file as it was (sha256), nothing written anywhere — and never read a
file outside the model's folder. Commands run in this process (imports take seconds).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import run_cli_in_process
from tests.hostile.broken import KINDS, make_all
from tests.support.lm_models import gpt2_folder
from tests.support.models import mlp


def _commands(model: Path, good: Path, aux: Path, out: Path) -> dict[str, list]:
    """command -> its arguments with ``model`` in the place of a model; outputs under ``out``."""
    return {
        "inspect": ["inspect", model],
        "compare (reference)": ["compare", model, good],
        "compare (candidate)": ["compare", good, model],
        "fp16": ["fp16", model, out / "v.onnx", "--report", out / "r.json"],
        "fuse": ["fuse", model, out / "v.onnx", "--external-data"],
        "shrink": ["shrink", model, out / "v.onnx"],
        "quantize": ["quantize", model, out / "q", "--report", out / "q.json"],
        "extract": ["extract", model, out / "p.onnx", "--outputs", "y", "--report", out / "r.json"],
        "validate (source)": ["validate", model, good, "--task", "generic", "--json", out / "v.json"],
        "validate (variant)": ["validate", good, model, "--task", "generic"],
        "bench": ["bench", good, model, "--json", out / "b.json", "--plot", out / "b.svg"],
        "predict": ["predict", "--task", "faceage", model, aux / "face.png"],
        "eval-lm": ["eval-lm", model, "--text", aux / "text.txt", "--tokenizer", aux, "--report", out / "e.json"],
        "build": ["build", model.parent / "recipe.toml", "--out", out, "--no-bench"],
    }


COMMAND_NAMES = list(_commands(Path("m"), Path("g"), Path("a"), Path("o")))

#: Where a command says it in its own words: quantize takes a model folder, build reads a recipe first.
OTHER_PHRASES = {
    ("quantize", "model is a folder"): "no onnx/model.onnx in the folder",
    ("build", "model is a folder"): "is not a file",
    ("build", "model is a fifo"): "is not a file",
    ("build", "model is a device"): "is not a file",
    ("build", "model is missing"): "no such file",
    # eval-lm only runs its models: onnxruntime opens this one (it ignores the declared shape), so it decides, and
    # what is wrong with it for eval-lm is that it is no language model (tests/test_quantize.py: issue 28)
    ("eval-lm", "output shape disagrees with inference"): "not a causal language model",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    made = make_all(root / "kinds")
    aux = root / "aux"
    aux.mkdir()
    good = aux / "good.onnx"
    good.write_bytes(mlp().SerializeToString())
    Image.fromarray(np.full((32, 32, 3), 128, np.uint8)).save(aux / "face.png")
    (aux / "text.txt").write_text("a few words of held-out text\n" * 4, encoding="utf-8")
    shutil.copy(gpt2_folder() / "tokenizer.json", aux)  # eval-lm's: what it refuses is the model
    for path, _ in made.values():
        _write_recipe(path)
    return root, made, good, aux


def _write_recipe(model: Path) -> None:
    """A recipe whose source is ``model``, pinned as a user would (a fifo is never opened)."""
    sha256 = hashlib.sha256(model.read_bytes()).hexdigest() if model.is_file() else "0" * 64
    (model.parent / "recipe.toml").write_text(
        f'[source]\npath = "{model.name}"\nsha256 = "{sha256}"\n\n'
        '[[variants]]\nname = "fp16"\nsteps = [{ pass = "fp16" }]\n',
        encoding="utf-8",
    )


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: regular files by sha256, others by kind (a fifo is never opened)."""
    entries = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                entries[os.fspath(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                entries[os.fspath(path)] = stat.filemode(mode)
    return entries


def test_the_generator_makes_at_least_40_kinds():
    assert len(KINDS) >= 40


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_every_kind_is_refused_in_one_line_and_nothing_changes(corpus, tmp_path, command):
    root, made, good, aux = corpus
    before = _snapshot(root)
    problems = []
    for kind, (model, phrase) in made.items():
        out = tmp_path / kind.replace(" ", "_").replace("/", "_")
        args = _commands(model, good, aux, out)[command]
        result = run_cli_in_process(*args, cwd=tmp_path)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        if result.returncode != 2 or len(lines) != 1 or "Traceback" in result.stderr:
            problems.append(f"{kind}: exit {result.returncode}, stderr {result.stderr[-600:]!r}")
            continue
        line = lines[0]
        expected_phrase = OTHER_PHRASES.get((command, kind), phrase)
        if not line.startswith("onnxsmith: error: ") or expected_phrase not in line:
            problems.append(f"{kind}: {line!r} does not say {expected_phrase!r}")
        if model.name not in line and "recipe.toml" not in line:
            problems.append(f"{kind}: {line!r} does not name the file")
        if out.exists():
            problems.append(f"{kind}: wrote {sorted(p.name for p in out.rglob('*'))}")
    assert not problems, "\n".join(problems)
    assert _snapshot(root) == before  # every input as it was, nothing written beside them
    assert sorted(p.name for p in tmp_path.iterdir()) == []
