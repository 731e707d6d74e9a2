"""Backend facts live in the backend: callers ask a capability question, never which backend runs.

Outside iris/runtime no code compares backend names, reads ``interpreted``, tests a vendor constant or
torch's build; it asks the backend object (``backend.has_streams``, ``backend.xcc_count(i)``, ...) or,
in device code, the constants of :func:`iris.runtime.device_facts`. Each backend's own file answers every
fact of :class:`iris.runtime.Backend`, so adding a backend touches its file and the selection table only.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import iris
from iris.runtime import BACKENDS, Backend, DeviceFacts, backend_class, device_facts, select
from iris.runtime.cpu import CpuBackend

PACKAGE = Path(__file__).resolve().parent.parent / "iris"

#: What a backend check looks like in code (comments and docstrings are not searched).
PATTERNS = {
    "a vendor constant": r"\bON_HIP\b|\bgpu_vendor\b",
    "the interpreter switch": r"\binterpreted\b",
    "a backend's name": r"\bbackend\.name\b|\bSELECTED\b|\.backend\s*[!=]=",
    "a backend name compared": r"[!=]=\s*[\"'](hip|cuda|cpu)[\"']|[\"'](hip|cuda|cpu)[\"']\s*[!=]=",
    "torch's build": r"\btorch\.version\.(hip|cuda)\b",
}

#: (file or folder/ under iris/, text of the line or None for every hit there, why it may stay). Each entry must
#: still match something: an entry that matches nothing is stale and fails the test.
ALLOWED = [
    ("memory/tensors.py", 'wanted.type == "cuda"', "the torch device type of a user's device= argument"),
    ("compat/tensor_creation.py", 'wanted.type == "cuda"', "the torch device type of a user's device= argument"),
    ("host/pointers.py", 'wanted.type == "cpu" or (wanted.type == "cuda"',
     "the torch device type of a user's device= argument"),
    ("ops/_fused.py", 'pin_memory=device.type != "cpu"', "the torch device type of the tensor's own device"),
    ("testing/cross_compile.py", 'self.backend == "cuda" else 64', "a cross-compile target's vendor (user's spec)"),
    ("testing/cross_compile.py", 'backend == "cuda" and arch.isdigit()', "parsing a cross-compile target's spec"),
    ("testing/cross_compile.py", 'backend == "hip" and arch.startswith', "parsing a cross-compile target's spec"),
    ("context.py", "JobFacts(backend=backend.name", "the name handed to the heap providers, which ask iris.runtime "
                                                   "by it (backend_class, capabilities)"),
    ("context.py", 'self.debug(f"{backend.name} heap', "a label in a log line"),
    ("host/tracing.py", '"backend": backend.name', "a label in the trace's metadata"),
    ("launch/info.py", "_no_graphs_on(backend.name)", "iris info names the backend in its text"),
    ("launch/info.py", "{backend.name} backend (its graphs", "iris info names the backend in its text"),
    ("launch/info.py", '"name": backend.name', "iris info names the backend in its text"),
    ("launch/info.py", "backend.name.upper()", "iris info names the backend in its text"),
    ("launch/info.py", '"hip": torch.version.hip', "iris info prints torch's build's versions"),
]


def _doc_ratio():
    """.ci/doc_ratio.py, the project's reader of docstrings and comments."""
    spec = importlib.util.spec_from_file_location("doc_ratio", Path(__file__).resolve().parent.parent / ".ci" /
                                                  "doc_ratio.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_lines(source: str) -> dict[int, str]:
    """Each line of ``source`` without its comment, docstrings left out: {line number: code}."""
    docs = _doc_ratio().docstring_lines(ast.parse(source))
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return {n: text for n, text in enumerate(lines, 1) if n not in docs and text.strip()}


def backend_checks(root: Path = PACKAGE) -> list[tuple[str, int, str, str]]:
    """(file, line, kind, code) of every backend check in ``root`` outside iris/runtime."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name.startswith("runtime/"):
            continue
        for number, code in code_lines(path.read_text()).items():
            for kind, pattern in PATTERNS.items():
                if re.search(pattern, code):
                    found.append((name, number, kind, code.strip()))
    return found


def _allowed_by(hit) -> tuple | None:
    name, _, _, code = hit
    return next((entry for entry in ALLOWED if (name == entry[0] or entry[0].endswith("/") and name.startswith(
        entry[0])) and (entry[1] is None or entry[1] in code)), None)


def test_the_search_finds_what_it_looks_for(tmp_path):
    """The search itself: a check in code is found, the same words in a comment or a docstring are not."""
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "cpu.py").write_text('ok = backend.name == "cpu"\n')  # the backends' own layer
    (tmp_path / "ops.py").write_text('"""Runs interpreted, says ON_HIP."""\n\n'
                                     'def f(backend):\n    """backend.name == "hip" in a docstring."""\n'
                                     '    x = 1  # backend.interpreted in a comment\n'
                                     '    return backend.interpreted or ctx.backend.name != "hip" or ON_HIP\n')
    hits = backend_checks(tmp_path)
    assert {(name, line) for name, line, _, _ in hits} == {("ops.py", 6)}, hits
    assert {kind for *_, kind, _ in hits} == {"the interpreter switch", "a backend's name", "a vendor constant",
                                              "a backend name compared"}


def test_no_backend_check_outside_the_backend_layer():
    hits = backend_checks()
    unexplained = [f"iris/{name}:{line}: {kind}: {code}" for name, line, kind, code in hits
                   if not _allowed_by((name, line, kind, code))]
    assert not unexplained, ("outside iris/runtime, ask the backend a capability question (iris.runtime.Backend's "
                             "facts, iris.runtime.device_facts()) instead of testing which backend runs:\n"
                             + "\n".join(unexplained))
    used = {_allowed_by(hit) for hit in hits}
    stale = [entry for entry in ALLOWED if entry not in used]
    assert not stale, f"allow-list entries that match nothing any more (remove them): {stale}"


# ------------------------------------------------------------------ the interface


def test_each_backend_answers_every_fact_in_its_own_class():
    """A fact inherited from Backend or a shared base would be answered outside the backend's file."""
    assert BACKENDS == ("cuda", "hip", "cpu")
    for name in BACKENDS:
        cls = backend_class(name)
        assert issubclass(cls, Backend) and cls.name == name
        missing = [fact for fact in Backend.FACTS if fact not in vars(cls)]
        assert not missing, f"{cls.__name__} ({cls.__module__}) does not answer {missing}"
        for fact in Backend.FACTS:
            value = getattr(cls, fact)
            if fact == "inline_asm":
                assert value in (None, "ptx", "amdgcn"), (name, value)
            elif fact == "default_allocator":
                assert value in iris.context.ALLOCATORS, (name, value)
            elif not callable(value):
                assert isinstance(value, bool), (name, fact, value)


def test_every_fact_is_documented_on_the_interface():
    source = Path(iris.runtime.base.__file__).read_text()
    for fact in Backend.FACTS:
        assert re.search(rf"#: .+\n\s+{fact}\b|def {fact}\(", source), f"Backend.{fact} has no description"


def test_the_cpu_backends_answers():
    cpu = CpuBackend
    assert not cpu.compiles_kernels and cpu.runs_programs_in_turn and cpu.upcasts_narrow_floats
    assert not cpu.has_streams and not cpu.has_copy_engine and not cpu.native_graph_launch
    assert cpu.tensor_descriptors  # the interpreter emulates them
    assert cpu.memory_on_host and not cpu.engine_reaches_other_nodes and cpu.inline_asm is None
    assert cpu.xcc_count(cpu, None) == 1 and cpu.xcc_count(cpu, 3) == 1
    assert cpu.arch_name(SimpleNamespace(major=9, minor=0)) == ""
    assert cpu.find_limitation("atomic", torch.bfloat16).feature == "atomic"
    assert cpu.find_limitation("atomic", torch.float16) is None  # a single writer is exact
    assert cpu.find_limitation("atomic", torch.float16, concurrent=True) is not None
    assert {row.feature for row in cpu.limitations()} >= {"atomic", "cuda_graph", "inline_asm", "shmem_heap"}
    assert all(row.backend == "cpu" for row in cpu.limitations())


def test_the_gpu_backends_answers_without_a_gpu():
    cuda, hip = backend_class("cuda"), backend_class("hip")
    for gpu in (cuda, hip):
        assert gpu.compiles_kernels and not gpu.runs_programs_in_turn and not gpu.upcasts_narrow_floats
        assert gpu.has_streams and gpu.has_copy_engine and not gpu.memory_on_host
        assert gpu.find_limitation("atomic", torch.bfloat16, concurrent=True) is None and gpu.limitations() == ()
    assert (cuda.inline_asm, hip.inline_asm) == ("ptx", "amdgcn")
    assert cuda.tensor_descriptors and not hip.tensor_descriptors
    assert cuda.native_graph_launch and not hip.native_graph_launch
    assert cuda.engine_reaches_other_nodes and not hip.engine_reaches_other_nodes
    assert cuda.xcc_count(cuda, 0) == 1
    assert cuda.arch_name(SimpleNamespace(major=9, minor=0)) == "sm_90"
    assert hip.arch_name(SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-")) == "gfx942:sramecc+:xnack-"


def test_backend_class_names_the_selected_one_and_refuses_an_unknown_name():
    assert backend_class() is backend_class(iris.runtime.SELECTED)
    with pytest.raises(ValueError, match="unknown backend 'metal'.*cuda, hip, cpu"):
        backend_class("metal")


@pytest.mark.skipif(iris.runtime.SELECTED != "cpu", reason="the CPU backend's process (interpreted kernels)")
def test_this_process_facts_on_the_cpu_backend():
    backend = iris.runtime.get_backend()
    assert isinstance(backend, CpuBackend) and type(backend) is backend_class()
    assert device_facts() == DeviceFacts(inline_asm=None, compiles_kernels=False)
    assert device_facts().compiles_kernels == backend.compiles_kernels
    from iris.device import rma

    assert not rma.PTX.value and not rma.AMDGCN.value  # device code takes the interpreter's paths


@pytest.mark.parametrize("target,asm", [("cuda:90", "ptx"), ("hip:gfx942", "amdgcn")])
def test_a_cross_compile_worker_compiles_for_its_targets_assembly(monkeypatch, target, asm):
    """The gate's worker (IRIS_COMPILE_TARGET set, the interpreter off) imports device code with its target's
    constants, whatever this machine has."""
    monkeypatch.setattr(select, "compile_target", lambda: target)
    monkeypatch.setattr(select, "interpreted", lambda: False)
    assert device_facts() == DeviceFacts(inline_asm=asm, compiles_kernels=True)


def test_a_gpu_process_compiles_for_its_gpus_assembly(monkeypatch):
    monkeypatch.setattr(select, "compile_target", lambda: "")
    monkeypatch.setattr(select, "interpreted", lambda: False)
    for kind, asm in (("cuda", "ptx"), ("hip", "amdgcn")):
        monkeypatch.setattr(select, "_torch_gpu_kind", lambda kind=kind: kind)
        assert device_facts() == DeviceFacts(inline_asm=asm, compiles_kernels=True)
    monkeypatch.setattr(select, "interpreted", lambda: True)
    assert device_facts() == DeviceFacts(inline_asm=None, compiles_kernels=False)


def test_each_backend_names_the_float8_formats_its_kernels_store():
    from iris.runtime import cuda, hip

    ocp = (torch.float8_e4m3fn, torch.float8_e5m2)
    assert cuda.float8_formats_of(9, 0) == cuda.float8_formats_of(8, 9) == ocp  # Hopper, Ada
    assert cuda.float8_formats_of(8, 0) == ()  # Ampere: none
    assert hip.float8_formats_of("gfx942:sramecc+:xnack-") == (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
    assert hip.float8_formats_of("gfx950") == ocp and hip.float8_formats_of("gfx90a") == ()
    assert CpuBackend().float8_formats(torch.device("cpu")) == ocp
