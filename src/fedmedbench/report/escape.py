"""Names written into the outputs, escaped for each format: the one place that does it.

Run, method and site names, client labels, experiment titles and notes come from a user's config and
from the names of a user's data folders (a site is a folder name; a folder may be called
``<img src=x onerror=alert(1)>``). Written as they are, they would act as markup where the file is
rendered (a Markdown viewer passes HTML through; ``|`` splits a table cell; ``_`` or ``%`` breaks a
LaTeX table). Every writer of Markdown or LaTeX puts such text through :func:`markdown` or
:func:`latex`, so it shows exactly as written and is never markup.

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

# Markdown: HTML's three special characters as entities (CommonMark and every renderer decode them;
# a backslash before `<` is not understood by all renderers), and a backslash before the characters
# that open code spans, emphasis, links and table cells. `_` is left as it is: inside a word, as in
# site or run names (`site_A`, `fedprox_mu`), it is never emphasis in CommonMark.
_MARKDOWN = str.maketrans({
    "&": "&amp;", "<": "&lt;", ">": "&gt;",
    "\\": "\\\\", "`": "\\`", "*": "\\*", "[": "\\[", "]": "\\]", "|": "\\|",
    "\n": " ", "\r": " ",
})  # fmt: skip

# LaTeX text mode: its ten special characters, plus `<`, `>` and `|`, which the default (OT1) font
# encoding prints as other glyphs (¡, ¿, —).
_LATEX = str.maketrans({
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}", "–": "--",
    "\n": " ", "\r": " ",
})  # fmt: skip


def markdown(text) -> str:
    """``text`` as Markdown that renders as exactly this text (HTML tags included), on one line."""
    return str(text).translate(_MARKDOWN)


def latex(text) -> str:
    """``text`` as LaTeX text-mode source that prints as exactly this text."""
    return str(text).translate(_LATEX)
