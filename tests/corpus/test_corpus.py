"""The real-model conformance corpus (issue 11): every command on every model, as a new user runs it.

Each (model, command) asserts the outcome recorded for it in outcomes.toml: a verified variant
within cosine / size bounds, or a specific refusal. An outcome recorded with a ``defect`` (a failure
class of issue 11, or a new one; see docs/conformance.md and the findings) is a known defect: the
test is ``xfail(strict=True)`` and asserts what issue 11's acceptance asks, so it keeps failing
(xfail) while the recorded defect reproduces, fails outright if the outcome changes to another
failure, and XPASSes -- a strict failure -- once it is fixed, so a fix must update outcomes.toml.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.support.corpus import COMMANDS, Observed, accepted, fp32_share, make_feeds, run_model
from tests.support.realmodels import CORPUS, MODELS, real_model

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

OUTCOMES = tomllib.loads((Path(__file__).with_name("outcomes.toml")).read_text())

pytestmark = pytest.mark.realmodel


class KnownDefect(Exception):
    """The recorded defect reproduced: the only failure the xfail accepts (raises=KnownDefect)."""


def _cases():
    for name in sorted(CORPUS, key=lambda n: MODELS[n].heavy):  # the 2 GB model last
        for command in COMMANDS:
            expected = OUTCOMES[name][command]
            marks = []
            if "defect" in expected:
                what = expected.get("message") or expected.get("note") or expected["outcome"]
                reason = f"issue 11 class {expected['defect']}: {what}"
                marks.append(pytest.mark.xfail(strict=True, raises=KnownDefect, reason=reason))
            yield pytest.param(name, command, id=f"{name}-{command}", marks=marks)


class _Runs:
    """Each model's commands run once, in order; the previous model's variants are deleted first."""

    def __init__(self, root: Path):
        self.root, self.name, self.results = root, None, {}

    def get(self, name: str) -> dict[str, Observed]:
        if name != self.name:
            if self.name is not None:
                shutil.rmtree(self.root / self.name, ignore_errors=True)
            self.name = name
            feeds = make_feeds(MODELS[name].feeds, self.root / name / "feeds")
            self.results = run_model(real_model(name), self.root / name, feeds, isolated=MODELS[name].heavy)
        return self.results


@pytest.fixture(scope="session")
def corpus_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    yield _Runs(root)
    shutil.rmtree(root, ignore_errors=True)  # the 2 GB model's variants: pytest keeps old temp folders


def test_manifest_covers_the_corpus():
    assert len(CORPUS) >= 20
    assert sorted(OUTCOMES) == sorted(CORPUS)
    for name in CORPUS:
        assert sorted(OUTCOMES[name]) == sorted(COMMANDS), name


@pytest.mark.parametrize(("name", "command"), list(_cases()))
def test_command(corpus_runs, name, command):
    results = corpus_runs.get(name)
    observed, expected = results[command], OUTCOMES[name][command]
    if "defect" not in expected:
        _assert_recorded(observed, expected)
        return
    if _accepted(observed, results, name):
        return  # XPASS(strict): fixed -- record the new outcome in outcomes.toml
    _assert_recorded(observed, expected)  # an AssertionError here: the defect changed into another failure
    raise KnownDefect(f"{observed.kind}: {observed.message}")


def _assert_recorded(observed: Observed, expected: dict) -> None:
    what = f"{observed.command}: {observed.kind} {observed.message!r} (last stderr: {observed.stderr[-3:]})"
    assert observed.kind == expected["outcome"], what
    if observed.kind in ("refused", "traceback"):
        assert expected["message"] in observed.message, what
        if "code" in expected:
            assert observed.code == expected["code"], what
    if "cosine" in expected:
        assert observed.cosine is not None and observed.cosine >= expected["cosine"], (observed.cosine, what)
    if "size" in expected:
        assert observed.size_ratio <= expected["size"], (observed.size_ratio, what)
    if "against" in expected:
        assert observed.against == expected["against"], what


def _accepted(observed: Observed, results: dict[str, Observed], name: str) -> bool:
    """What issue 11 asks of the command on this model."""
    if observed.command in ("inspect", "validate"):
        return observed.kind == "ok"
    if observed.kind != "variant":
        return False
    share = fp32_share(results["inspect"], real_model(name))
    return not accepted(observed.command, observed.cosine, observed.size_ratio, share)
