"""Text from a model or a recipe, made safe for where it is shown.

Tensor and node names, producer strings, metadata and recipe values are whatever the file's
author wrote: they may hold terminal escape sequences, bidi overrides, Markdown or HTML. Each
output edge passes them through the one function for its medium, so a name is shown as the
characters it is, never obeyed: the console (cli/common.py, with rich's markup off), the one-line
errors (cli/main.py), the card (release/card.py), report.html (release/report.py) and its figures
(release/plots.py, with matplotlib's mathtext off).

Numbers every medium shows the same way are written here too (:func:`format_cosine`).
"""

from __future__ import annotations

import html
import math
import re

# C0 controls but newline and tab (ESC starts CSI/OSC sequences, BEL ends OSC ones), DEL, C1 controls
# (CSI/OSC/ST as single code points), and the invisible characters that reorder or hide text (bidi
# embeddings, overrides and isolates, marks, line/paragraph separators, the zero-width no-break space).
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: object) -> str:
    """``text`` with every control and invisible formatting character shown as its escape (``\\x1b``,
    ``\\u202e``): a name cannot clear the screen, plant a link, or reorder what is printed around it.
    Newlines and tabs stay."""
    return _HIDDEN.sub(_visible, str(text))


def for_html(text: object) -> str:
    """``text`` as HTML character data or an attribute value: ``<>&"'`` as entities, controls visible."""
    return html.escape(for_terminal(text), quote=True)


def for_plot_label(text: object) -> str:
    """``text`` as a matplotlib label: controls visible (an SVG's XML cannot hold them). The figures
    turn mathtext off (``text.parse_math``), so ``$`` and ``\\`` are shown as they are."""
    return for_terminal(text)


# Characters that can start Markdown syntax anywhere in a line (backslash-escaped: CommonMark shows
# any escaped ASCII punctuation as itself; ``\\<`` and ``\\&`` are never HTML or an entity; ``$`` is
# GitHub's math, ``|`` a table cell) ...
_MARKDOWN_INLINE = re.compile(r"([\\`*_\[\]<|&~$])")
# ... and those that do only at the start of a line (a list item, heading, quote, heading underline).
_MARKDOWN_LINE_START = re.compile(r"^(\s*\d*)([-+=.)>#])")


def _one_line(text: object) -> str:
    return re.sub(r"[\n\t]", " ", for_terminal(text))


def for_markdown(text: object) -> str:
    """``text`` as literal Markdown text, inline or in a table cell: one line, controls visible, every
    character that could make a link, emphasis, HTML, an entity or a new table cell escaped."""
    escaped = _MARKDOWN_INLINE.sub(r"\\\1", _one_line(text))
    return _MARKDOWN_LINE_START.sub(r"\1\\\2", escaped, count=1)


def for_markdown_code(text: object, *, table: bool = False) -> str:
    """``text`` as a Markdown code span, backticks included: one line, controls visible, fenced by more
    backticks than it holds. ``table``: the span is in a table cell, where ``|`` must be ``\\|`` even in
    code (GFM splits cells before it reads code spans)."""
    body = _one_line(text)
    if table:
        body = body.replace("|", "\\|")
    if not body.strip():  # CommonMark keeps a span of spaces as it is; an empty one is no span
        return "`" + (body or " ") + "`"
    fence = "`" * (max((len(run) for run in re.findall("`+", body)), default=0) + 1)
    pad = " " if body[0] == "`" or body[-1] == "`" or (body[0] == " " and body[-1] == " ") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def format_cosine(value: float) -> str:
    """A cosine with enough digits to show its distance from 1 (0.99871, 0.9999999702)."""
    gap = 1 - value
    digits = 4 if gap <= 0 else max(4, math.ceil(-math.log10(gap)) + 2)
    return f"{value:.{digits}f}"
