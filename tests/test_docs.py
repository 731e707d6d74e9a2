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
  variable iris/config.py reads or sets and every variable ``iris run`` and Iris's tools set for the
  processes they start;
- the CLI page is generated from ``iris.launch.build_parser()`` and shows every subcommand and option;
- the capability page is generated from ``iris.runtime.capabilities.LIMITATIONS``;
- what the pages say of the code and CI stays true where a test can read both: the conformance profiles
  and their default (conformance/profiles.py), the ranks CI runs conformance at and its Triton versions
  (.ci/run), the example catalogue (examples/NN_*), the original's modules not ported yet
  (tests/data/original_api.json), the allocators ``iris.iris`` takes; and a guide that quotes a measured
  figure names the benchmark page or the committed CSV that holds it.

No ranks, no kernels: this file runs in a second or two.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import importlib.util
import os
import re
import sys
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


def not_ported() -> set[str]:
    """The original's names Iris does not have yet (tests/data/original_api.json's ``pending``): a page may name
    them to say so."""
    import json

    return set(json.loads((ROOT / "tests" / "data" / "original_api.json").read_text())["pending"])


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_page_names_resolves(page, monkeypatch):
    if "IRIS_BACKEND" not in os.environ:
        monkeypatch.setenv("IRIS_BACKEND", "cpu")
    stale = [name for name in module_names(page.read_text()) if name not in not_ported() and not resolves(name)]
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


def _variables_set_for_processes() -> set[str]:
    """Every name iris/ passes by keyword to ``config.child_environment`` or ``config.export`` (the environment of
    a process Iris starts, or of a rank process the test harness makes), or drops there."""
    names = set()
    for path in (ROOT / "iris").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("child_environment", "export"):
                for keyword in node.keywords:
                    if keyword.arg == "drop":
                        names |= {e.value for e in getattr(keyword.value, "elts", []) if isinstance(e, ast.Constant)}
                    elif keyword.arg is not None:
                        names.add(keyword.arg)
    return names


def test_every_variable_iris_run_and_the_tools_set_is_in_the_table():
    from iris import config

    names = _variables_set_for_processes()
    assert {"RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "IRIS_JOB_ID"} <= names
    assert sorted(names - {v.name for v in config.VARIABLES}) == []


def test_every_variable_has_a_known_kind_and_the_page_a_section_per_kind():
    from iris import config

    assert sorted({v.kind for v in config.VARIABLES} - set(config.KINDS)) == []
    assert len({v.name for v in config.VARIABLES}) == len(config.VARIABLES)
    page = _hook().environment_page()
    for kind, heading in config.KINDS.items():
        section = page.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
        assert sorted(v.name for v in config.VARIABLES if f"| `{v.name}` |" in section) == \
            sorted(v.name for v in config.VARIABLES if v.kind == kind), kind


def _load_file(relative: str):
    spec = importlib.util.spec_from_file_location(f"_test_docs_{Path(relative).stem}", ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_conformance_page_names_every_profile_its_budget_and_the_default():
    profiles = _load_file("conformance/profiles.py")
    page = (ROOT / "docs" / "conformance.md").read_text()
    rows = re.findall(r"^\| `(\w+)`( \(default\))? \|[^|]*\| (\d+) \| (\d+) \|$", page, re.MULTILINE)
    assert {name: (int(examples), int(litmus)) for name, _, examples, litmus in rows} == {
        name: (p.max_examples, p.litmus_iterations) for name, p in profiles.PROFILES.items()}
    assert [name for name, default, _, _ in rows if default] == [profiles.DEFAULT]
    assert f"the profile is `{profiles.DEFAULT}`" in page
    from iris import config

    assert next(v.default for v in config.VARIABLES if v.name == "IRIS_CONFORMANCE_PROFILE") == profiles.DEFAULT
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    named = re.search(r"profiles (`\w+`[^|]*)\|", contributing).group(1)
    assert re.findall(r"`(\w+)`", named) == list(profiles.PROFILES)


def _ci() -> str:
    return (ROOT / ".ci" / "run").read_text()


def ci_triton_versions() -> list[str]:
    """The Triton releases .ci/run's version matrix installs, as written there (``3.6.0``)."""
    return re.search(r"for triton_version in ([\d. ]+);", _ci()).group(1).split()


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def triton_versions_said_of_ci(text: str) -> list[list[str]]:
    """For each paragraph of ``text`` that speaks of CI and Triton: the Triton versions it names (3.6, 3.9.0)."""
    said = []
    for paragraph in _paragraphs(text):
        if re.search(r"\bCI\b", paragraph) and "Triton" in paragraph:
            said.append(re.findall(r"(?<!Python )(?<![\d.])3\.\d+(?:\.\d+)?(?![\d.]*\d)", paragraph))
    return said


def test_the_ci_triton_reader_sees_what_it_must():
    assert triton_versions_said_of_ci("CI runs Triton 3.6.0 and 3.9 (Python 3.10).\n\nTriton 3.7 alone.\n\nCI: 2.13.") \
        == [["3.6.0", "3.9"]]
    assert ci_triton_versions() and all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in ci_triton_versions())


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_names_only_the_triton_versions_ci_runs_when_it_speaks_of_ci(page):
    ci = ci_triton_versions()
    for versions in triton_versions_said_of_ci(page.read_text()):
        stale = [v for v in versions if not any(c == v or c.startswith(v + ".") for c in ci)]
        assert stale == [], f"{page.relative_to(ROOT)} says CI runs Triton {', '.join(stale)}; .ci/run runs {ci}"


def test_getting_started_names_every_triton_version_ci_runs():
    text = (ROOT / "docs" / "getting-started.md").read_text()
    said = [v for versions in triton_versions_said_of_ci(text) for v in versions]
    assert all(v in said for v in ci_triton_versions()), (said, ci_triton_versions())


def test_contributing_names_the_ranks_ci_runs_conformance_at_profile_ci():
    ci_ranks = set(re.findall(r"pytest conformance[^\n]*--ranks (\d+) --hypothesis-profile ci", _ci()))
    said = re.search(r"conformance at profile `ci` at ([\d and]+) ranks", (ROOT / "CONTRIBUTING.md").read_text())
    assert ci_ranks and said, "CONTRIBUTING.md no longer says at how many ranks CI runs conformance at profile ci"
    assert set(re.findall(r"\d+", said.group(1))) == ci_ranks


def example_numbers_named(text: str) -> set[int]:
    """The example numbers a sentence names, ranges spread out: "00-05 load, 06 message passing" -> 0..6."""
    numbers = set()
    for first, last in re.findall(r"\b(\d\d)(?:-(\d\d))?\b", text):
        numbers |= set(range(int(first), int(last or first) + 1))
    return numbers


def test_the_readme_example_summary_covers_every_example_folder():
    assert example_numbers_named("00-05 load, 06 passing, 07-12 GEMM, 16 the end") == set(range(0, 13)) | {16}
    folders = {int(p.name[:2]) for p in (ROOT / "examples").iterdir() if re.match(r"\d\d_", p.name) and p.is_dir()}
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Examples\n", 1)[1].split("\n## ", 1)[0]
    summary = section.split("Each takes")[0]
    assert example_numbers_named(summary) == folders


def test_the_readme_names_the_original_modules_not_ported_yet():
    """README's and the home page's claim that the original's programs run unchanged names its exceptions:
    every module of tests/data/original_api.json's pending list, and how many there are."""
    modules = sorted(key for key in not_ported() if key.startswith("iris.") and key.count(".") == 1)
    count = ["no", "one", "two", "three", "four", "five"][len(modules)] if len(modules) < 6 else str(len(modules))
    readme = " ".join((ROOT / "README.md").read_text().split())
    differences = readme.split("## Differences from the original", 1)[1].split("## ", 1)[0]
    assert modules and all(f"`{m}`" in differences for m in modules), modules
    assert f"{count} modules" in differences and f"{count} modules not ported yet" in readme
    index = " ".join((ROOT / "docs" / "index.md").read_text().split())
    assert all(f"`{m}`" in index for m in modules) and f"{count} modules not ported yet" in index


def test_the_readme_names_every_allocator_iris_iris_takes():
    tree = ast.parse((ROOT / "iris" / "context.py").read_text())
    allocators = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "ALLOCATORS" for t in node.targets))
    sentence = next(p for p in _paragraphs((ROOT / "README.md").read_text()) if "`allocator_type`" in p)
    assert all(f'`"{name}"`' in sentence for name in allocators), (allocators, sentence)
    assert "only" not in sentence.split("`allocator_type`", 1)[1].split(";", 1)[0]


# A measured figure: a time (12 us, 1.2-1.3 ms), a rate (370 GB/s), a ratio (1.6-4.7x) or a share (96%).
MEASURED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:\s?(?:us|µs|ms|GB/s)\b|x\b|%)")
# Where a page says which measurement backs its figures (the benchmark page or a committed CSV), or that they are
# an estimate from stated rates, not a measurement.
BACKED = re.compile(r"benchmarks\.md|benchmarks/results/|not a measurement")


def unbacked_figures(text: str) -> list[str]:
    """The measured figures of ``text`` (outside code blocks) in paragraphs that name no result behind them."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return [m.group(0) for p in _paragraphs(text) if not BACKED.search(p) for m in MEASURED.finditer(p)]


def test_the_figure_reader_sees_what_it_must_and_nothing_else():
    assert unbacked_figures("took 5.6-9.0 us, 2.4x, 96% and 370 GB/s\n\non 2 x H200, 8 x H200, 4 MiB, sm_90") == [
        "5.6-9.0 us", "2.4x", "96%", "370 GB/s"]
    assert unbacked_figures("1.2x ([Benchmarks](../benchmarks.md))\n\n```\n3 us\n```") == []


GUIDES = [ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "getting-started.md",
          *sorted((ROOT / "docs" / "guides").glob("*.md")), *sorted((ROOT / "docs" / "concepts").glob("*.md"))]


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_guide_quotes_a_measured_figure_only_beside_the_result_that_holds_it(page):
    figures = unbacked_figures(page.read_text())
    assert figures == [], f"{page.relative_to(ROOT)} quotes {figures} with no benchmark page or CSV in the " \
                          "paragraph: point to the committed CSV under benchmarks/results/, or drop the figure"


# Claims: a figure a page quotes is computed from the committed CSVs (benchmarks/claims.py) and written between
# <!-- claim NAME --> and <!-- /claim -->; `python benchmarks/summarize_results.py` rewrites them.

def _claims():
    from benchmark_runs import import_benchmark

    return import_benchmark("claims")


@functools.cache
def computed_claims() -> dict[str, str]:
    return _claims().compute()


# The pages whose measured figures all come from claims: outside code and claims, no figure in their prose.
CLAIMED_PAGES = [ROOT / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "guides" / "collectives.md"]


def bare_figures(text: str) -> list[str]:
    """The measured figures of ``text`` outside code blocks, inline code, claims and comments (the markers the
    docs build fills, such as ``<!-- figures ccl -->``)."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = _claims().SPAN.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group(0) for m in MEASURED.finditer(text)]


def test_the_claim_reader_sees_right_wrong_and_unknown_claims_and_bare_figures():
    claims = _claims()
    page = ("Iris is <!-- claim fast -->1.2x<!-- /claim --> NCCL's speed, <!-- claim slow -->3.0x<!-- /claim --> at\n"
            "1 MiB, <!-- claim gone -->2x<!-- /claim --> elsewhere and <!-- claim wrapped -->5.1-7.7\nus<!-- /claim "
            "--> replayed; it took 12 us.\n\n```\n5 us\n```\n`7 us` <!-- figures ccl -->\n")
    computed = {"fast": "1.2x", "slow": "2.5x", "wrapped": "5.1-7.7 us"}
    assert [name for name, _ in claims.SPAN.findall(page)] == ["fast", "slow", "gone", "wrapped"]
    found = claims.problems(page, computed)
    assert len(found) == 2, found
    assert "slow" in found[0] and "'3.0x'" in found[0] and "'2.5x'" in found[0]
    assert "python benchmarks/summarize_results.py" in found[0]
    assert "gone" in found[1] and "no such claim" in found[1]
    fixed = claims.rewrite(page, computed)
    assert "<!-- claim slow -->2.5x<!-- /claim -->" in fixed and "<!-- claim gone -->2x<!-- /claim -->" in fixed
    assert "5.1-7.7\nus" in fixed and claims.problems(fixed, computed) == found[1:]
    assert bare_figures(page) == ["12 us"]
    assert claims.problems("a <!-- claim fast -->1.2x and no end", computed) == [
        "a claim marker without its pair: write <!-- claim NAME -->TEXT<!-- /claim -->"]
    assert "opens a line" in claims.problems("a\n<!-- claim fast -->1.2x<!-- /claim --> b", computed)[0]
    unclosed = "a <!-- claim slow -->3.0x, b <!-- claim fast -->1.2x<!-- /claim -->"
    assert claims.SPAN.findall(unclosed) == [("fast", "1.2x")] and len(claims.problems(unclosed, computed)) == 1


def test_the_claims_write_ratios_and_shares_as_the_pages_do():
    claims = _claims()
    assert claims.ratios([1.21, 1.05]) == "1.05-1.21x" and claims.ratios([4.72, 1.57]) == "1.6-4.7x"
    assert claims.ratios([1.197]) == "1.2x" and claims.ratios([0.159, 0.45]) == "0.16-0.45x"
    assert claims.percents([0.9558, 0.9611]) == "96%" and claims.percents([0.94, 0.961]) == "94-96%"
    with pytest.raises(claims.ClaimError):
        claims.ratios([])


def test_every_claim_says_what_it_reads_and_a_page_quotes_it():
    claims = _claims()
    quoted = {name for page in claims.pages(ROOT) for name, _ in claims.SPAN.findall(page.read_text())}
    for name, claim in claims.CLAIMS.items():
        assert claim.compute.__doc__, f"claim {name} (benchmarks/claims.py) has no docstring saying what it reads"
        assert (ROOT / "benchmarks" / "results" / claim.csv).exists(), (name, claim.csv)
    assert sorted(set(claims.CLAIMS) - quoted) == [], "claims no page quotes: drop them from benchmarks/claims.py"


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_claim_a_page_quotes_is_what_the_committed_csvs_give(page):
    found = _claims().problems(page.read_text(), computed_claims())
    assert found == [], f"{page.relative_to(ROOT)}: " + "; ".join(found)


@pytest.mark.parametrize("page", CLAIMED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_results_page_quotes_measured_figures_only_through_claims(page):
    figures = bare_figures(page.read_text())
    assert figures == [], f"{page.relative_to(ROOT)} quotes {figures} by hand: declare a claim in " \
                          "benchmarks/claims.py and write <!-- claim NAME -->TEXT<!-- /claim --> (python " \
                          "benchmarks/summarize_results.py fills TEXT), or drop the figure"


def test_the_command_rewrites_stale_claims_and_refuses_unknown_ones(tmp_path):
    claims = _claims()
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "README.md").write_text("Iris is <!-- claim fast -->9x<!-- /claim --> NCCL's speed.\n")
    (tmp_path / "docs" / "guides" / "x.md").write_text("Level: <!-- claim fast -->1.2x<!-- /claim -->.\n")
    (tmp_path / "docs" / "y.md").write_text("A <!-- claim gone -->2x<!-- /claim --> claim.\n")
    changed, unfixable = claims.update({"fast": "1.2x"}, tmp_path)
    assert changed == {tmp_path / "README.md": "Iris is <!-- claim fast -->1.2x<!-- /claim --> NCCL's speed.\n"}
    assert unfixable == ["docs/y.md: claim gone: benchmarks/claims.py declares no such claim"]
