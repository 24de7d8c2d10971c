"""Text from a model or a recipe is shown as the characters it is, never obeyed (issue: hardening, class 5).

A model whose names, producer and metadata hold rich markup (``logits[/]``), mathtext (``$\\frac{a}{b}$``),
Markdown/HTML (``a|b``, ``<script>``), terminal escapes (``ESC[2J``, an OSC 8 link) and a bidi override
goes through ``inspect``, ``fp16 --report``, ``build`` (card, report.html, its figures) and ``card``:
every command finishes as it would for plain names, what it writes is written, no escape reaches the
terminal raw, the card's tables keep their cells and no HTML gets into the card or the report.
"""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET

import onnx
import pytest
from markdown_it import MarkdownIt
from onnx import TensorProto, helper

from onnxsmith.core.text import for_html, for_markdown, for_markdown_code, for_terminal
from tests.conftest import assert_one_line_error
from tests.support.models import mlp
from tests.support.release import recipe_text, toy_faceage

MARKUP = "logits[/]"
STYLE = "[bold red]x[/]"
MATH = "$\\frac{a}{b}$"
BAD_MATH = "$\\nosuchcommand{$"  # mathtext that does not parse: it once crashed the report's figure
PIPE = "a|b"
SCRIPT = "<script>alert(1)</script>"
CLEAR = "\x1b[2J"
LINK = "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\"
BIDI = "\u202eevil"
HOSTILE = [MARKUP, STYLE, MATH, PIPE, SCRIPT, CLEAR, LINK, BIDI]
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _renamed(model: onnx.ModelProto, names: dict[str, str]) -> onnx.ModelProto:
    """``model`` with its tensors renamed, a hostile suffix on every node name, and hostile metadata."""
    graph = model.graph
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
        node.name += STYLE + CLEAR
    for tensor in graph.initializer:
        tensor.name = names.get(tensor.name, tensor.name)
    for value in [*graph.input, *graph.output]:
        value.name = names.get(value.name, value.name)
    model.producer_name = "[/]" + LINK
    helper.set_model_props(model, {MARKUP: SCRIPT + CLEAR, "k": BIDI})
    return model


def _hostile_mlp(path):
    names = {"h0": MARKUP, "h1": STYLE, "h2": MATH, "y0": PIPE, "y": SCRIPT + CLEAR, "w1": LINK, "b1": BIDI}
    onnx.save(_renamed(mlp(), names), path)
    return path


def _assert_shown_not_obeyed(result):
    """No traceback, and no control character or bidi override reaches the terminal."""
    for stream in (result.stdout, result.stderr):
        assert "Traceback" not in stream, stream
        assert not RAW_CONTROLS.search(stream), repr(stream)


def test_the_escapers():
    assert for_terminal(CLEAR + "x\n\ty\a" + BIDI) == "\\x1b[2Jx\n\ty\\x07\\u202eevil"
    assert for_terminal("\x9b31m") == "\\x9b31m"  # C1 CSI
    assert for_html(SCRIPT + CLEAR) == "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[2J"
    assert for_markdown("a|b\nc") == "a\\|b c"
    assert for_markdown("- item") == "\\- item" and for_markdown("# h") == "\\# h"
    assert for_markdown(MATH) == "\\$\\\\frac{a}{b}\\$"
    assert for_markdown_code("a`b") == "``a`b``" and for_markdown_code("`x") == "`` `x ``"
    assert for_markdown_code(PIPE, table=True) == "`a\\|b`" and for_markdown_code(PIPE) == "`a|b`"


def test_inspect_shows_hostile_names_as_text(cli, tmp_path):
    result = cli("inspect", _hostile_mlp(tmp_path / "h.onnx"))
    assert result.returncode == 0, result.stderr
    _assert_shown_not_obeyed(result)
    # the producer, the output, the largest weights and the nodes reading them, as the characters they are
    for shown in ("producer [/]\\x1b]8;;http://evil", SCRIPT + "\\x1b[2J", "\\u202eevil", "mm1" + STYLE):
        assert shown in result.stdout, shown  # the names, visible as the characters they are


def test_fp16_writes_the_variant_and_its_report_whatever_the_names(cli, tmp_path):
    """A MarkupError once lost the report after the variant was written."""
    source = _hostile_mlp(tmp_path / "h.onnx")
    result = cli("fp16", source, tmp_path / "out.onnx", "--report", tmp_path / "r.json", "--explain")
    assert result.returncode == 0, result.stderr
    _assert_shown_not_obeyed(result)
    assert onnx.load(tmp_path / "out.onnx").graph.output[0].name == SCRIPT + CLEAR  # the names themselves kept
    report = json.loads((tmp_path / "r.json").read_text())
    assert f"output '{SCRIPT + CLEAR}'" in report["headline"][1]  # JSON keeps the name exactly (escaped)
    assert f"output '{SCRIPT}\\x1b[2J'" in result.stdout


def test_an_error_quoting_a_hostile_name_prints_it_escaped(cli, tmp_path):
    name = CLEAR + LINK + BIDI
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], [name], name="a" + STYLE), helper.make_node("Neg", ["x"], [name], name="b")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "twice.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    for args in (("inspect", path), ("fp16", path, tmp_path / "out.onnx")):
        result = cli(*args)
        assert_one_line_error(result, "twice.onnx: '\\x1b[2J\\x1b]8;;http://evil", f"by node 'a{STYLE}'")
        _assert_shown_not_obeyed(result)
    assert not (tmp_path / "out.onnx").exists()


# ------------------------------------------------------------------ a release built from a hostile model

CARD_TITLE = f"Toy {STYLE} {SCRIPT} {PIPE} {CLEAR}"


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """toy_faceage (a massive residual channel: its name is in the card and a figure's title) with hostile
    names everywhere, built through the CLI with the generic task."""
    root = tmp_path_factory.mktemp("hostile-release")
    names = {
        "residual": f"res {MATH} {BAD_MATH} {MARKUP}",
        "embed": SCRIPT,
        "pooled": CLEAR,
        "normed": LINK,
        "age_logits": f"age {PIPE} {MARKUP}",
        "gender_logits": BIDI + "`tick`",
    }
    source = root / "toy.onnx"
    onnx.save(_renamed(toy_faceage(), names), source)
    card = f"[card]\ntitle = {json.dumps(CARD_TITLE)}\nhomepage = {json.dumps('http://x/' + PIPE + SCRIPT)}"
    variants = '[[variants]]\nname = "fp16"\nsteps = [{ pass = "fp16" }]\n'
    (root / "recipe.toml").write_text(
        recipe_text(source, variants, validation='[validation]\ntask = "generic"\nsamples = 2\n', card=card)
    )
    from tests.conftest import run_cli_in_process

    result = run_cli_in_process("build", root / "recipe.toml", "--out", root / "release", "--no-bench")
    return root / "release", result


def test_build_finishes_and_writes_everything(release):
    folder, result = release
    assert result.returncode == 0, result.stderr
    _assert_shown_not_obeyed(result)
    for name in ("README.md", "report.html", "measurements.json", "SHA256SUMS", "fp16.onnx"):
        assert (folder / name).is_file(), name
    measured = json.loads((folder / "measurements.json").read_text())
    assert measured["ranges"]["massive"]["tensor"] == f"res {MATH} {BAD_MATH} {MARKUP}"  # the figure names it


def _tables(html: str) -> list[list[int]]:
    """The cell count of every row of every table in rendered HTML."""
    return [
        [len(re.findall(r"<t[hd][ >]", row)) for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
        for table in re.findall(r"<table>(.*?)</table>", html, re.S)
    ]


def test_the_card_keeps_its_tables_and_lets_no_html_in(release):
    folder, _ = release
    card = (folder / "README.md").read_text()
    assert not RAW_CONTROLS.search(card), "a control character in the card"
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(card)  # raw HTML would pass
    assert "<script" not in html
    tables = _tables(html)
    assert len(tables) >= 3
    for rows in tables:
        assert len(set(rows)) == 1, rows  # a '|' in a name added no cell
    assert "&lt;script&gt;" in html and "logits[/]" in html and "age a|b logits[/]" in html
    assert "$\\frac{a}{b}$" in html  # shown as typed (GitHub would render \$ as $)
    assert "<h1>Toy [bold red]x[/] &lt;script&gt;alert(1)&lt;/script&gt; a|b \\x1b[2J</h1>" in html


def test_the_report_and_its_figures_show_names_as_text(release):
    folder, _ = release
    page = (folder / "report.html").read_text()
    assert "<script" not in page and not RAW_CONTROLS.search(page)
    assert "&lt;script&gt;" in page
    figures = [base64.b64decode(uri).decode() for uri in re.findall(r"data:image/svg\+xml;base64,([^\"]+)", page)]
    assert len(figures) >= 2
    for svg in figures:
        ET.fromstring(svg)  # well-formed XML: no control character in a label
        assert "<script" not in svg
    assert any(f"res {MATH} {BAD_MATH} {MARKUP}" in svg for svg in figures)  # mathtext off: the name as typed


def test_card_command_rewrites_the_same_card(release, cli):
    folder, _ = release
    before = (folder / "README.md").read_bytes()
    result = cli("card", folder)
    assert result.returncode == 0, result.stderr
    _assert_shown_not_obeyed(result)
    assert (folder / "README.md").read_bytes() == before
