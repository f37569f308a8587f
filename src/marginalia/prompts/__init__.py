"""Our prompt templates: the text files in this folder, filled with `string.Template`.

Values are inserted verbatim (never re-parsed), so a question may hold braces,
dollar signs, quotes, newlines or any script.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template


@cache
def template(name: str) -> Template:
    text = resources.files(__package__).joinpath(f"{name}.txt").read_text("utf-8")
    return Template(text)


def render(name: str, **values: str) -> str:
    """Fill the template ``<name>.txt``; a missing value is a programming error."""
    return template(name).substitute(**values)
