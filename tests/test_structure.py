"""The import rules of the package, read from the source: every import, at module level or inside a
function (a deferred import still ties two modules together), unless a rule says otherwise:

- no import cycle between Iris's modules;
- no module imports a module of a higher layer (:data:`LAYERS`, from the ground up);
- no module imports another package's private module (``iris.ccl._common`` from ``iris.ops``), but the
  testing tools (``iris.testing``), which reach what tests reach;
- plug-ins (``iris.ccl``, ``iris.ops``) import what they use by name, never the ``iris`` root,
  and the context facade (``iris.context``) imports neither plug-in when it is imported (``ctx.ccl`` /
  ``ctx.ops`` import them when first used);
- only ``iris.config`` reads or sets environment variables;
- importing iris changes nothing outside iris but, on the CPU backend, Triton's interpreter switch and the
  CUDA stand-in (iris.runtime.cuda_on_cpu, where torch sees no GPU).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "iris"
PLUG_INS = ("iris.ccl", "iris.ops")

#: The layers, from the ground up: a module may import its own layer and those below, never one above.
#: A module belongs to the layer of the longest prefix it matches.
LAYERS = (
    ("configuration", ("iris.config", "iris.runtime.capabilities", "iris.runtime.logging", "iris.runtime.cpu_binding")),
    ("backends, memory, device code", ("iris.runtime", "iris.memory", "iris.device")),
    ("host-side features", ("iris.host",)),
    ("plug-ins", ("iris.ccl", "iris.ops")),
    ("the context facade", ("iris.context",)),
    ("the public package", ("iris", "iris.compat", "iris.x", "iris.compile", "iris.inference")),
    ("tools", ("iris.launch", "iris.testing", "iris.__main__")),
)


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _all_nodes(tree: ast.Module):
    """Every statement and expression of the module, inside functions and classes too."""
    return ast.walk(tree)


def _module_level_nodes(tree: ast.Module):
    """Statements run at import: the module's body, including inside its if/try blocks (not functions)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            pending.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                pending.extend(handler.body)


def imports_of(name: str, at_import_only: bool = False) -> set[str]:
    """The Iris modules ``name`` imports: anywhere in it, or (``at_import_only``) when it is imported."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    nodes = _module_level_nodes if at_import_only else _all_nodes
    for node in nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}
AT_IMPORT = {name: imports_of(name, at_import_only=True) for name in MODULES}


def layer_of(name: str) -> int:
    """The index in :data:`LAYERS` of the layer holding module ``name`` (longest matching prefix)."""
    best, found = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    return found


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return cycles


def test_the_rules_see_imports():
    """The reader finds what it must (else the rules below would pass on nothing): module-level imports,
    imports inside functions, and only the former at import time."""
    assert "iris.runtime" in GRAPH["iris"] and "iris.device.sync" in GRAPH["iris.host.barrier"]
    assert "iris.host.replay.native" in GRAPH["iris.host.replay.plans"]  # inside a method
    assert "iris.host.replay.native" not in AT_IMPORT["iris.host.replay.plans"]


def test_every_module_has_a_layer():
    assert [name for name in sorted(MODULES) if layer_of(name) is None] == []


def test_no_module_imports_a_higher_layer():
    offences = [f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                for name in sorted(GRAPH) for target in sorted(GRAPH[name]) if layer_of(target) > layer_of(name)]
    assert offences == []


def test_no_import_cycle():
    assert _cycles() == []


def test_no_module_imports_another_packages_private_module():
    offences = []
    for name, imported in GRAPH.items():
        if name.startswith("iris.testing."):
            continue
        for target in imported:
            owner, _, leaf = target.rpartition(".")
            if leaf.startswith("_") and not leaf.startswith("__") and not (name == owner or
                                                                          name.startswith(owner + ".")):
                offences.append(f"{name} imports {target}")
    assert offences == []


def test_plug_ins_import_by_name_and_the_facade_imports_no_plug_in():
    offences = [f"{name} imports the iris root" for name in GRAPH
                if name.startswith(PLUG_INS) and "iris" in GRAPH[name]]
    offences += [f"iris.context imports {m} at import" for m in AT_IMPORT["iris.context"] if m.startswith(PLUG_INS)]
    assert offences == []


def _environment_uses(path: Path) -> list[int]:
    """Lines of ``path`` that name ``os.environ``, ``os.getenv``, ``os.putenv`` or ``os.unsetenv`` (or import them)."""
    names = {"environ", "getenv", "putenv", "unsetenv", "environb"}
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in names:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name in names for a in node.names):
            lines.append(node.lineno)
    return lines


def test_only_the_config_module_touches_the_environment():
    offences = [f"{MODULES[name].relative_to(PACKAGE.parent)}:{line}" for name in sorted(MODULES)
                if name != "iris.config" for line in _environment_uses(MODULES[name])]
    assert offences == []
    assert _environment_uses(MODULES["iris.config"]), "the reader must see the config module's own reads"


@pytest.mark.slow  # a fresh interpreter (5 s); the default tier's budget is the README's 5 minutes
def test_importing_iris_changes_only_the_interpreter_switch():
    """A process that imports iris (as under ``iris run``, with stack dumps asked for) keeps its signal
    handlers, its loggers, Triton's cache manager and its environment but for TRITON_INTERPRET."""
    probe = textwrap.dedent("""
        import faulthandler, json, logging, os, signal
        from triton import knobs
        before_env = dict(os.environ)
        import iris
        changed = sorted(k for k in set(before_env) | set(os.environ) if before_env.get(k) != os.environ.get(k))
        print(json.dumps(dict(
            env=changed,
            sigusr1=faulthandler.unregister(signal.SIGUSR1),
            handlers=len(logging.getLogger("iris").handlers),
            level=logging.getLogger("iris").level,
            cache_manager=repr(knobs.cache.manager_class),
            backend=iris.runtime.SELECTED,
        )))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_CROSS_COMPILE")}
    env.update(IRIS_STACKS_ON_SIGUSR1="1", IRIS_LOG_LEVEL="DEBUG")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    import json

    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["env"] == (["TRITON_INTERPRET"] if found["backend"] == "cpu" else [])
    assert found["sigusr1"] is False
    assert found["handlers"] == 0 and found["level"] == 0
    assert found["cache_manager"] == "None"


def test_the_top_level_is_one_package_per_layer():
    """At most 16 entries in iris/ (packages by layer beside config, context, inference and the entry points): a
    new module goes into the package of its layer."""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and not p.name.startswith("."))
    assert len(entries) <= 16, entries


def test_documentation_stays_at_most_a_third_of_the_code():
    """Docstrings say what, why and an example; measured figures and history live in CHANGELOG.md and the
    benchmark results (.ci/doc_ratio.py; CONTRIBUTING.md gives the figure)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_ratio", PACKAGE.parent / ".ci" / "doc_ratio.py")
    doc_ratio = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc_ratio)
    value, _ = doc_ratio.ratio(PACKAGE)
    assert value <= 0.35, f"documentation lines per code line in iris/: {value:.3f} (python .ci/doc_ratio.py --files)"
