"""The README and the documentation read as a product for users, and the reference pages cannot drift.

- README.md stays short (at most 200 lines) and keeps the Quick start's two commands verbatim
  (``.ci/run`` runs them);
- no hand-written page (README.md, CONTRIBUTING.md, docs/**/*.md) carries a run log: no commit
  hashes, no dated entries, no "this session". History belongs in git and CHANGELOG.md;
- every file of this repository a hand-written page names (``iris/ops/gemm.py``, ``benchmarks/ccl.py``,
  ``.ci/gpu.sh``, ``docs/api/*.md``) is in the tree, and every module a page names (``iris.ops.gemm``
  in backticks, ``::: iris.ccl.all_reduce`` for mkdocstrings) imports, or its parent module has that
  attribute: files move, pages must follow. CHANGELOG.md is history and may name old paths;
- the environment-variable page is generated from ``iris.config.VARIABLES``, which names every
  variable iris/config.py reads or sets;
- the CLI page is generated from ``iris.launch.build_parser()`` and shows every subcommand and option;
- the capability page is generated from ``iris.runtime.capabilities.LIMITATIONS``.

No ranks, no kernels: this file runs in a second or two.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICK_START = (
    'pip install -e . && iris run -n 2 examples/01_store/example.py --validate',
    'pip install -e ".[test]" && python -m pytest tests conformance -q',
)
# A commit-like word: 7 to 40 hex digits with at least one letter and one digit (gfx942, sm_90 and
# fp16 are not words of hex digits; 4096 and deadbeef lack a letter or a digit).
COMMIT_LIKE = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
SESSION = re.compile(r"\bthis session\b", re.IGNORECASE)


def _hook():
    spec = importlib.util.spec_from_file_location("reference_pages", ROOT / "docs" / "hooks" / "reference_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hand_written_pages() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    return pages


def run_log_marks(text: str) -> list[str]:
    """The words of ``text`` that belong to a run log: commit-like hashes, dates, "this session"."""
    found = [f"hash {m.group(0)}" for m in COMMIT_LIKE.finditer(text)]
    found += [f"date {m.group(0)}" for m in DATE.finditer(text)]
    found += [f"'{m.group(0)}'" for m in SESSION.finditer(text)]
    return found


def test_the_run_log_reader_sees_what_it_must_and_nothing_else():
    assert run_log_marks("fixed at a070d59 (2026-11-28), this session") == [
        "hash a070d59", "date 2026-11-28", "'this session'"]
    assert run_log_marks("gfx942 sm_90 fp16 4096 deadbeef cafe123 0x7f3a12 bf16 cu130") == ["hash cafe123"]


def test_readme_is_short_and_keeps_the_quick_start():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for command in QUICK_START:
        assert command in text, f"README.md lost the Quick start command {command!r} (.ci/run runs it verbatim)"


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_run_log_in_a_hand_written_page(page):
    marks = run_log_marks(page.read_text())
    assert marks == [], f"{page.relative_to(ROOT)} reads like a run log ({', '.join(marks[:10])}): " \
                        "keep history in git and CHANGELOG.md"


# A path in this repository: one of its top-level folders, then a slash and the rest (``*``, ``{a,b}`` and
# ``<placeholder>`` allowed). Not inside a URL or another path (``../guides/x.md`` names a page, not a file).
TOP_FOLDERS = (".ci", "apptainer", "benchmarks", "conformance", "docker", "docs", "examples", "iris", "tests")
REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(f) for f in TOP_FOLDERS) + r")/[\w./*{},<>-]*)")
# A dotted module name in backticks (``iris.ops.gemm``, ``iris.ccl.__all__``) or on a mkdocstrings line.
BACKTICKS = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"(?<![\w./-])(iris(?:\.[A-Za-z_]\w*)+)")
MKDOCSTRINGS = re.compile(r"^:::\s*(iris[\w.]*)", re.MULTILINE)
FILE_NAMES = ("sif", "def")  # iris.sif, apptainer/iris.def: files, not modules
# Pages the docs build generates (docs/hooks/reference_pages.py): not in the tree, still real.
GENERATED = ("docs/reference/", "docs/contributing.md", "docs/changelog.md")


def repo_paths(text: str) -> list[str]:
    """The paths of this repository ``text`` names, without a sentence's closing punctuation."""
    return sorted({m.group(1).rstrip(".,") for m in REPO_PATH.finditer(text)} - {""})


def path_exists(path: str) -> bool:
    """Whether ``path`` names something in the tree: ``{a,b}`` is each of a and b, ``*`` and ``<name>``
    match any name."""
    if path.startswith(GENERATED):
        return True
    braces = re.search(r"\{([^{}]*)\}", path)
    if braces:
        return all(path_exists(path[:braces.start()] + choice + path[braces.end():])
                   for choice in braces.group(1).split(","))
    pattern = re.sub(r"<[^<>]*>", "*", path).rstrip("/")
    if "*" in pattern:
        return any(ROOT.glob(pattern))
    return (ROOT / pattern).exists()


def module_names(text: str) -> list[str]:
    """The dotted names under iris that ``text`` gives in backticks or to mkdocstrings (``::: iris.x``)."""
    names = {m.group(1) for span in BACKTICKS.finditer(text) for m in DOTTED.finditer(span.group(1))}
    names |= {m.group(1).rstrip(".") for m in MKDOCSTRINGS.finditer(text)}
    return sorted(name for name in names if name != "iris" and name.rsplit(".", 1)[-1] not in FILE_NAMES)


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or its longest importable prefix is a module with that chain of
    attributes (``iris.ccl.__all__``, ``iris.device.context._DeviceContext``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.util.find_spec(".".join(parts[:end])) is not None
        except (ImportError, ValueError):  # a parent that is a module, not a package
            found = False
        if not found:
            continue
        value = importlib.import_module(".".join(parts[:end]))
        for attribute in parts[end:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_the_reference_readers_see_what_they_must_and_nothing_else():
    assert repo_paths("see `iris/ops/gemm.py`, benchmarks/ccl.py. and (.ci/gpu.sh), docs/api/*.md; "
                      "not https://x.org/iris/a.py nor ../guides/x.md nor a/tests/b.py") == [
        ".ci/gpu.sh", "benchmarks/ccl.py", "docs/api/*.md", "iris/ops/gemm.py"]
    assert path_exists("iris/ops/{gemm,config}.py") and path_exists("benchmarks/results/<name>.csv")
    assert not path_exists("iris/ops/{gemm,gone}.py") and not path_exists("benchmarks/gone.py")
    assert module_names("`iris.ops.gemm` and `ctx = iris.iris(n)`, `iris.sif`, `x.iris.y`, iris.not_quoted\n"
                        "::: iris.ccl.all_reduce\n") == ["iris.ccl.all_reduce", "iris.iris", "iris.ops.gemm"]


def test_the_module_resolver_sees_modules_and_attributes(monkeypatch):
    if "IRIS_BACKEND" not in os.environ:
        monkeypatch.setenv("IRIS_BACKEND", "cpu")
    assert resolves("iris.ops.gemm") and resolves("iris.ccl.__all__") and resolves("iris.device.context._DeviceContext")
    assert not resolves("iris.kernel_launch") and not resolves("iris.ccl.no_such_name")


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_a_page_names_is_in_the_tree(page):
    stale = [path for path in repo_paths(page.read_text()) if not path_exists(path)]
    assert stale == [], f"{page.relative_to(ROOT)} names files that are not in the tree: {', '.join(stale)}"


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_page_names_resolves(page, monkeypatch):
    if "IRIS_BACKEND" not in os.environ:
        monkeypatch.setenv("IRIS_BACKEND", "cpu")
    stale = [name for name in module_names(page.read_text()) if not resolves(name)]
    assert stale == [], f"{page.relative_to(ROOT)} names modules or attributes that do not resolve: " \
                        f"{', '.join(stale)}"


def _names_config_reads() -> set[str]:
    """Every string literal iris/config.py passes to text(), switch(), _cache() or an os.environ lookup,
    and the names of its launcher tuples."""
    tree = ast.parse((ROOT / "iris" / "config.py").read_text())
    names = set()

    def literal(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)

    def is_environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called in ("text", "switch", "_cache") or (called in ("get", "pop", "setdefault")
                                                          and is_environ(getattr(func, "value", None))):
                if node.args:
                    literal(node.args[0])
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            literal(node.slice)
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            literal(node.left)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("_VARIABLES")
                                                  for t in node.targets):
            for element in getattr(node.value, "elts", []):
                literal(element)
    return names


def test_the_config_reader_sees_the_reads():
    names = _names_config_reads()
    assert {"IRIS_BACKEND", "IRIS_DEBUG", "IRIS_NATIVE_CACHE", "TRITON_INTERPRET", "NVSHMEM_SYMMETRIC_SIZE",
            "RANK", "PMI_SIZE"} <= names


def test_every_variable_config_reads_is_in_its_table():
    from iris import config

    table = {variable.name for variable in config.VARIABLES}
    assert sorted(_names_config_reads() - table) == []
    assert all(variable.meaning for variable in config.VARIABLES)


def test_the_environment_page_lists_every_variable():
    from iris import config

    page = _hook().environment_page()
    missing = [v.name for v in config.VARIABLES if f"`{v.name}`" not in page]
    assert missing == []


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_cli_page_lists_every_subcommand_and_option():
    from iris.launch import build_parser

    hook = _hook()
    subcommands = _subcommands(build_parser())
    assert {"run", "info", "cleanup"} <= set(subcommands)
    assert set(_subcommands(hook.cli_parser())) == set(subcommands)  # the page reads the same parser
    page = hook.cli_page()
    for name, parser in subcommands.items():
        assert f"## `iris {name}`" in page
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # every subcommand's -h: in its usage line
            for option in action.option_strings:
                assert f"`{option}" in page, f"iris {name}: {option} missing from the CLI page"


def test_the_capability_page_lists_every_gap():
    from iris.runtime.capabilities import LIMITATIONS

    page = _hook().capabilities_page()
    for row in LIMITATIONS:
        assert row.reason in page
