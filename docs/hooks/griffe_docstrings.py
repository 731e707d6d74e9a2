"""Griffe extension: read the project's docstrings the way they are written.

The docstrings follow Google style with two habits of reST that Markdown renders badly:

* a section titled ``Example:`` (griffe parses only ``Examples:`` as code examples, and
  would render ``>>> kernel[grid](...)`` as a Markdown link);
* cross-references written as ``:class:`iris.Iris```, ``:func:`name``` and the like.

This extension renames the section and turns each role into an optional autorefs link:
a link where the target is documented, plain code where it is not (no warning). A name
without a dot is looked up beside the object that mentions it (its class, else its module).
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`~?([\w.]+)`")
EXAMPLE_TITLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
LITERAL_BLOCK = re.compile(r"::$", re.MULTILINE)


def _scope(obj) -> str:
    """The path that a bare name in obj's docstring is relative to."""
    if obj.is_module or obj.is_class:
        return obj.path
    parent = obj.parent
    return parent.path if parent is not None else obj.path


class ProjectDocstrings(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs) -> None:
        docstring = obj.docstring
        if docstring is None:
            return
        scope = _scope(obj)

        def link(match):
            name = match.group(1)
            target = name if "." in name else f"{scope}.{name}"
            shown = name.rsplit(".", 1)[-1] if match.group(0).count("`~") else name
            return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'

        text = EXAMPLE_TITLE.sub(r"\1Examples:", docstring.value)
        text = LITERAL_BLOCK.sub(":", text)
        docstring.value = ROLE.sub(link, text)
