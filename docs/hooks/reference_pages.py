"""mkdocs hook: the reference pages that are generated from the code, at build time.

- ``reference/environment.md`` from ``iris.config.VARIABLES`` (a variable added there appears here);
- ``reference/cli.md`` from ``iris.launch.build_parser()`` (every subcommand, its usage and options);
- ``reference/capabilities.md`` from ``iris.runtime.capabilities.LIMITATIONS``;
- ``changelog.md`` and ``contributing.md`` from the repository's CHANGELOG.md and CONTRIBUTING.md.

Nothing here is committed as a page, so nothing can go stale. The docs build needs neither torch nor an
installed Iris (``tox -e docs`` installs only mkdocs): config.py and capabilities.py import only the
standard library and are loaded from their files, and ``build_parser`` (argparse only) is read out of
iris/launch's source and run alone. tests/test_docs.py calls the ``*_page`` functions to check the pages.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 100  # argparse's usage lines, whatever the terminal


def _load(relative: str):
    """A stdlib-only module of the repository, loaded from its file (no ``import iris``)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"_docs_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _markdown(text: str) -> str:
    """Docstring-style ``literals`` as Markdown code; a table cell keeps its pipes escaped."""
    return text.replace("``", "`").replace("|", "\\|")


def environment_page() -> str:
    config = _load("iris/config.py")
    lines = [
        "# Environment variables",
        "",
        "Every variable Iris reads or sets. This page is generated from `iris.config.VARIABLES`: "
        "`iris/config.py` is the one module of Iris that touches the environment, and a test checks that "
        "every name it reads, and every name `iris run` and Iris's tools set, is in that table.",
        "",
        "A switch takes `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case); unset or empty, its "
        "default. Any other word is refused with the variable's name, the value and these spellings: by `iris run` "
        "before it starts a rank, and when the switch is read. Values are read when asked for, not cached. "
        "`iris info` prints every switch and setting below as set here and what it means.",
        "",
    ]
    for kind, heading in config.KINDS.items():
        lines += [f"## {heading}", "", "| variable | default | meaning |", "|---|---|---|"]
        for variable in config.VARIABLES:
            if variable.kind != kind:
                continue
            default = variable.default
            default = default if " " in default else f"`{default}`" if default else ""
            lines.append(f"| `{variable.name}` | {_markdown(default)} | {_markdown(variable.meaning)} |")
        lines.append("")
    lines += [
        "On GPUs keep NVLink multicast off in every program, Iris's or not: "
        "`export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1` "
        "(the tox GPU environments, the images and the Slurm scripts set them). On shared hosts multicast "
        "objects can take GPUs out of service.",
        "",
    ]
    return "\n".join(lines)


def cli_parser() -> argparse.ArgumentParser:
    """``iris.launch.build_parser()``, run from its source alone."""
    source = (ROOT / "iris" / "launch" / "__init__.py").read_text()
    tree = ast.parse(source)
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "build_parser")
    namespace = {"argparse": argparse}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "iris/launch/__init__.py", "exec"), namespace)
    return namespace["build_parser"]()


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            return [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return []


def _argument_row(action: argparse.Action) -> str:
    if action.option_strings:
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        names = ", ".join(f"`{option}{metavar}`" for option in action.option_strings)
    else:
        names = f"`{action.dest}`" + (" ..." if action.nargs == argparse.REMAINDER else "")
    default = "" if action.default in (None, False, argparse.SUPPRESS) else f"`{action.default}`"
    required = "required" if action.required and action.option_strings else ""
    return f"| {names} | {_markdown(action.help or '')} | {' '.join(x for x in (required, default) if x)} |"


def cli_page() -> str:
    parser = cli_parser()
    lines = [
        "# Command line",
        "",
        "`iris` (or `python -m iris`) has one subcommand per task. This page is generated from "
        "`iris.launch.build_parser()`; `iris <subcommand> --help` prints the same.",
        "",
    ]
    for name, sub, help_text in _subcommands(parser):
        sub.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
        lines += [f"## `iris {name}`", "", _markdown(help_text[:1].upper() + help_text[1:]) + ".", "",
                  "```text", sub.format_usage().strip(), "```", ""]
        rows = [_argument_row(action) for action in sub._actions if not isinstance(action, argparse._HelpAction)]
        lines += ["| argument | meaning | required, default |", "|---|---|---|", *rows] if rows else ["No options."]
        lines.append("")
    return "\n".join(lines)


def capabilities_page() -> str:
    capabilities = _load("iris/runtime/capabilities.py")
    lines = [
        "# Capability table",
        "",
        "What a backend cannot honour, each gap with its reason. This page is generated from "
        "`iris.runtime.capabilities.LIMITATIONS`, the one table that tests and library code ask "
        "(`iris.runtime.capabilities.limitation(backend, feature, dtype)`) instead of special-casing a backend: a case "
        "the table names is marked with its reason, never skipped silently. Each row has a test that fails "
        "once the gap disappears (a newer Triton), so a stale row is found and deleted. A backend and feature "
        "not listed here has no known gap.",
        "",
        "| backend | feature | dtype | when | reason |",
        "|---|---|---|---|---|",
    ]
    for row in capabilities.LIMITATIONS:
        when = "several writers at once" if row.concurrent_only else "always"
        lines.append(f"| `{row.backend}` | `{row.feature}` | {row.dtype or 'any'} | {when} | {_markdown(row.reason)} |")
    lines.append("")
    return "\n".join(lines)


def _root_page(name: str) -> str:
    """A Markdown file of the repository's root, its ``docs/`` links made relative to the site's root."""
    text = (ROOT / name).read_text()
    text = re.sub(r"\]\(docs/", "](", text)
    return text.replace("](CHANGELOG.md)", "](changelog.md)").replace("](CONTRIBUTING.md)", "](contributing.md)")


PAGES = {
    "reference/environment.md": environment_page,
    "reference/cli.md": cli_page,
    "reference/capabilities.md": capabilities_page,
    "changelog.md": lambda: _root_page("CHANGELOG.md"),
    "contributing.md": lambda: _root_page("CONTRIBUTING.md"),
}


def on_files(files, config):
    from mkdocs.structure.files import File  # here: tests import this module without mkdocs

    for uri, render in PAGES.items():
        files.append(File.generated(config, uri, content=render()))
    return files
