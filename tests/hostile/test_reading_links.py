"""Reading through links: what a command copies into its output comes from inside the folder it was given.

``quantize MODEL_DIR OUT`` copies the config and tokenizer files beside the model; a symbolic link among
them that leads out of the folder (``special_tokens_map.json -> ~/secret``) is refused before any work,
as ``build`` refuses an ``include`` outside the recipe's folder, unless the user allows it
(``--allow-outside``, a Hugging Face cache links every file to its blobs): then the output and the
report name it. A link that stays inside the folder is an ordinary file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tests.support.lm_models import gpt2_folder

SECRET = "not for publishing\n"


@pytest.fixture
def planted(tmp_path) -> tuple[Path, Path]:
    """(a copy of the GPT-2 folder whose special_tokens_map.json links to a file elsewhere, that file)."""
    folder = tmp_path / "model"
    shutil.copytree(gpt2_folder(), folder)
    secret = tmp_path / "home" / "secret"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    (folder / "special_tokens_map.json").symlink_to(secret)
    return folder, secret


def test_a_link_out_of_the_model_folder_is_refused_before_any_work(cli, tmp_path, planted):
    folder, secret = planted
    result = cli("quantize", folder, tmp_path / "out")
    assert_one_line_error(result, "special_tokens_map.json", str(secret.parent), "--allow-outside")
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "model"]  # no staging folder left either


def test_allowed_the_file_from_outside_is_named_in_the_output_and_the_report(cli, tmp_path, planted):
    folder, _ = planted
    # A link that stays inside the folder is not "outside": copied without a word.
    (folder / "shared").mkdir()
    (folder / "tokenizer_config.json").rename(folder / "shared" / "tokenizer_config.json")
    (folder / "tokenizer_config.json").symlink_to(Path("shared") / "tokenizer_config.json")
    out = tmp_path / "out"

    result = cli("quantize", folder, out, "--allow-outside", "--gate-samples", "1", "--gate-length", "8")
    assert result.returncode == 0, result.stderr
    assert (out / "special_tokens_map.json").read_text() == SECRET
    assert not (out / "special_tokens_map.json").is_symlink()
    named = [line for line in result.stdout.splitlines() if "special_tokens_map.json" in line]
    assert named and "outside the model folder" in named[0]
    assert not any("outside" in line for line in result.stdout.splitlines() if "tokenizer_config.json" in line)
    report = json.loads((out / "quantize_report.json").read_text())
    assert report["copied_from_outside"] == ["special_tokens_map.json"]
    assert {"special_tokens_map.json", "tokenizer_config.json"} <= set(report["copied"])


def test_the_api_refuses_it_too_unless_allowed(tmp_path, planted):
    import onnxsmith
    from onnxsmith.core.errors import InputError

    folder, _ = planted
    with pytest.raises(InputError, match=r"special_tokens_map\.json.*symbolic link out of the model folder"):
        onnxsmith.quantize(folder, out=tmp_path / "out")
    with onnxsmith.quantize(folder, allow_outside=True, gate_samples=1, gate_length=8, last_token=False) as made:
        assert made.copied_outside == ["special_tokens_map.json"]
        assert made.summary["copied_from_outside"] == ["special_tokens_map.json"]
