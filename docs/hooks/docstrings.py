"""A griffe extension for the API pages (mkdocs.yml): docstrings are written for ``help()`` and Sphinx, with
doctest examples (``>>> x``) at the margin, which Markdown would read as nested quotes. Each run of doctest lines
with its output becomes a Python code block, without the ``# doctest:`` directives, and Sphinx roles
(:func:`name`, :class:`~a.b.Name`) become the names as code."""

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):`(~?)([^`]+)`")
DIRECTIVE = re.compile(r"\s*# doctest:.*$")


def _roles(text: str) -> str:
    return ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)


def markdown_docstring(text: str) -> str:
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        block = []
        while i < len(lines) and lines[i].strip():  # the examples and their output, to the next blank line
            block.append(DIRECTIVE.sub("", lines[i][indent:] if len(lines[i]) >= indent else lines[i].lstrip()))
            i += 1
        if out and out[-1].strip():
            out.append("")
        out += ["```python", *block, "```", ""]
    return _roles("\n".join(out))


class DoctestFences(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
