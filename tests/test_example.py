"""The bundled example, built exactly as the README's main command builds it (real fp16 and fuse).

One full build (module fixture) is inspected by every test here: the release's files and
their pinned hashes, the card, the report in headless Chromium; a second build (without the
timed benchmark) must give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from PIL import Image

from onnxsmith.core.text import for_markdown
from onnxsmith.release.build import strip_timed
from tests.conftest import run_cli
from tests.support.browser import screenshot
from tests.support.release import EXAMPLE, REPO

RECIPE = EXAMPLE / "recipe.toml"
VARIANT_FILES = ["faceage-fp16.onnx", "faceage-fused-fp16.onnx", "faceage-fused-fp32.onnx"]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("example") / "faceage"
    result = run_cli("build", RECIPE, "--out", out, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return out, result


def test_the_example_release_has_every_variant_and_pins_it(release):
    out, result = release
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["README.md", "SHA256SUMS", "measurements.json", "recipe.toml", "report.html", *VARIANT_FILES]
    )
    sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
    card = (out / "README.md").read_text()
    for name in VARIANT_FILES:
        data = (out / name).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        assert sums[name] == digest
        assert f"| `{name}` |" in card and f"| {len(data):,} | `{digest}` |" in card
    assert "published" in result.stderr  # progress and per-variant lines go to stderr
    assert "faceage-fused-fp16.onnx" in result.stdout


def test_the_card_reports_what_was_done_and_measured(release):
    out, _ = release
    card = (out / "README.md").read_text()
    measured = json.loads((out / "measurements.json").read_text())
    variants = {v["name"]: v for v in measured["variants"]}
    assert all(v["published"] for v in variants.values())
    for name, variant in variants.items():
        for note in (n for step in variant["steps"] for n in step["notes"]):
            assert for_markdown(note) in card, (name, note)  # per-variant notes come from the passes' reports
        metrics = {m["name"]: m for m in variant["validation"]["metrics"]}
        assert metrics["nonfinite"]["value"] == 0 and metrics["gender_agreement"]["display"] == "8/8"
        assert metrics["max_abs_age_error"]["value"] <= 0.25
    assert "## Validation" in card and "8 faces of at least 32 px from boxes.txt" in card
    assert "| mean \\|Δage\\| | ≤ 0.1 |" in card
    assert "uses com.microsoft operators" in card  # the fused variants need onnxruntime
    assert "channel 57 peaks at" in card  # the planted massive activation, found by measurement
    assert "public domain" in card and "Apache License 2.0" in card  # license passed through
    bench = measured["bench"]["results"]
    assert [r["name"] for r in bench] == ["source", "fp16", "fused-fp16", "fused-fp32"]
    assert all([b["batch"] for b in r["batches"]] == [1, 5, 10] for r in bench)
    timed = card[card.index("<!-- timed -->") : card.index("<!-- /timed -->")]
    assert "| fused-fp32 | 1 |" in timed and "| 10 |" in timed
    assert re.search(r"\| onnxruntime \| \d+\.\d+", card)


def test_the_report_renders_in_headless_chromium(release, tmp_path):
    out, _ = release
    html = (out / "report.html").read_text()
    # self-contained: no script, and every image is inline
    assert "<script" not in html and not re.search(r"(src|href)=\"(?!data:)", html)
    assert html.count('src="data:image/svg+xml;base64,') == 3  # errors, activation ranges, latency
    run = screenshot(out / "report.html", tmp_path / "report.png", height=4400)
    assert run.returncode == 0, run.log[-2000:]
    assert run.console == [], run.console
    image = np.asarray(Image.open(run.screenshot).convert("L"), dtype=np.float64)
    assert image.shape == (4400, 1100)
    assert image.std() > 20  # not a blank page: text, tables and plots
    (REPO / ".cache").mkdir(exist_ok=True)
    (REPO / ".cache" / "example-report.png").write_bytes(run.screenshot.read_bytes())  # for a person to look at

    control = tmp_path / "broken.html"  # the console capture does see errors
    control.write_text("<!DOCTYPE html><p>x</p><script>undefinedFunction()</script>")
    assert any("Uncaught ReferenceError" in m for m in screenshot(control, tmp_path / "b.png", height=200).console)


def test_rebuilding_gives_byte_identical_files(release, tmp_path, cli):
    out, _ = release
    again = tmp_path / "again"
    result = cli("build", RECIPE, "--out", again, "--no-bench", cwd=REPO)
    assert result.returncode == 0, result.stderr
    for name in [*VARIANT_FILES, "SHA256SUMS", "recipe.toml"]:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name
    for name in ("README.md", "report.html"):  # all but the timed benchmark sections
        assert strip_timed((out / name).read_text()) == (again / name).read_text(), name
    first, second = (json.loads((d / "measurements.json").read_text()) for d in (out, again))
    assert first.pop("bench") is not None and second.pop("bench") is None
    assert first == second
