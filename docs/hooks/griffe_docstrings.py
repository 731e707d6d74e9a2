"""Griffe extension: read the project's docstrings the way they are written.

The docstrings follow Google style with two habits of reST that Markdown renders badly:

* a section titled ``Example:`` (griffe parses only ``Examples:`` as code examples, and
  would render ``>>> kernel[grid](...)`` as a Markdown link);
* cross-references written as ``:class:`iris.Iris```, ``:func:`name``` and the like;
* reST "simple tables" (columns marked by ``=====  =====`` borders), which Markdown would read
  as headings.

This extension renames the section, turns each role into an optional autorefs link (a link
where the target is documented, plain code where it is not, with no warning; a name without a
dot is looked up beside the object that mentions it: its class, else its module) and rewrites
each simple table as a Markdown table. The sources stay as they are.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`~?([\w.]+)`")
EXAMPLE_TITLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
LITERAL_BLOCK = re.compile(r"::$", re.MULTILINE)
TABLE_BORDER = re.compile(r"^ *=+( +=+)+ *$")


def _simple_tables_to_markdown(text: str) -> str:
    """Rewrite reST simple tables (border, header, border, rows, border) as Markdown tables."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        border = lines[i]
        end = next((j for j in range(i + 3, len(lines)) if lines[j].rstrip() == border.rstrip()), None)
        if not TABLE_BORDER.match(border) or end is None or lines[i + 2].rstrip() != border.rstrip():
            out.append(border)
            i += 1
            continue
        indent = border[: len(border) - len(border.lstrip())]
        starts = [m.start() for m in re.finditer(r"=+", border)]

        def cells(line):
            bounds = zip(starts, starts[1:] + [None])
            return [line[a:b].strip().replace("|", "\\|") for a, b in bounds]

        rows = [cells(lines[i + 1])] + [cells(line) for line in lines[i + 3 : end] if line.strip()]
        out.append(indent + "| " + " | ".join(rows[0]) + " |")
        out.append(indent + "|" + "---|" * len(starts))
        out.extend(indent + "| " + " | ".join(row) + " |" for row in rows[1:])
        i = end + 1
    return "\n".join(out)


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

        text = _simple_tables_to_markdown(docstring.value)
        text = EXAMPLE_TITLE.sub(r"\1Examples:", text)
        text = LITERAL_BLOCK.sub(":", text)
        docstring.value = ROLE.sub(link, text)
