"""The cross-compile gate: the CPU backend compiles every kernel it launches for real GPU targets.

Why: Triton's interpreter accepts programs the GPU compilers reject (an int64 atomic with an int32 operand,
assembly for the wrong vendor). With ``IRIS_CROSS_COMPILE=cuda:90,hip:gfx942`` (or pytest's
``--cross-compile``), each launched kernel is first compiled per specialization for every target, as a GPU
would specialize it, in one worker process per target; a failure raises :class:`CrossCompileError`. Results
are cached in IRIS_CROSS_COMPILE_CACHE. Each launching process installs it itself (conftest.py, the rank
pool, ``iris run`` through ``--run``, :func:`python_command`); importing iris does not.

Example:
    $ IRIS_CROSS_COMPILE=cuda:90,hip:gfx942 iris run -n 2 examples/01_store/example.py
    $ python -m iris.testing.cross_compile --summary
    cuda:90: 12 specializations of 5 kernels compiled
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from iris import config

TARGETS_ENV = "IRIS_CROSS_COMPILE"
WORKER_TIMEOUT_S = 600


class CrossCompileError(RuntimeError):
    """A kernel launched on the CPU backend does not compile for a GPU target of the gate."""


class SharedMemoryError(CrossCompileError):
    """A kernel compiles for a target but needs more shared memory per program than its GPUs have: there the
    launch fails (Triton's OutOfResources), and an autotuner skips the configuration."""


#: Shared memory (LDS on AMD) one program may use on the GPUs of a target, in bytes: what Triton's launcher
#: compares a compiled kernel's need with (CUDA's opt-in maximum per block; AMD's LDS per workgroup). A target
#: not listed is compiled without this check.
SHARED_MEMORY_BYTES = {"cuda:80": 166912, "cuda:86": 101376, "cuda:89": 101376, "cuda:90": 232448,
                       "cuda:100": 232448, "cuda:120": 101376, "hip:gfx90a": 65536, "hip:gfx942": 65536,
                       "hip:gfx950": 163840}


@dataclass(frozen=True)
class Target:
    """A GPU to compile for: ``backend`` "cuda" or "hip", ``arch`` 90 or "gfx942"."""

    backend: str
    arch: int | str

    @property
    def name(self) -> str:
        return f"{self.backend}:{self.arch}"

    @property
    def shared_memory_bytes(self) -> int | None:
        """Shared memory per program on this target's GPUs (None: not known here, not checked)."""
        return SHARED_MEMORY_BYTES.get(self.name)

    def gpu_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, 32 if self.backend == "cuda" else 64)


def parse_targets(spec: str) -> list[Target]:
    """``"cuda:90,hip:gfx942"`` as targets.

    Raises:
        ValueError: an entry is not ``cuda:<int>`` or ``hip:gfx<...>``.
    """
    targets = []
    for entry in (part.strip() for part in spec.split(",")):
        if not entry:
            continue
        backend, _, arch = entry.partition(":")
        if backend == "cuda" and arch.isdigit():
            targets.append(Target("cuda", int(arch)))
        elif backend == "hip" and arch.startswith("gfx"):
            targets.append(Target("hip", arch))
        else:
            raise ValueError(f"{TARGETS_ENV}: {entry!r} is not a target; write cuda:<capability> (cuda:90) or "
                             f"hip:<gfx arch> (hip:gfx942), comma-separated")
    return targets


def cache_dir() -> Path:
    return Path(config.cross_compile_cache())


# ------------------------------------------------------------------------------- launching side


def _digest_files(paths) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path).encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()


class _Worker:
    """One compiler process for one target, spoken to in pickled frames over its stdin and stdout."""

    def __init__(self, target: Target):
        env = config.child_environment(drop=("TRITON_INTERPRET",), IRIS_COMPILE_TARGET=target.name,
                                       PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the kernels' modules
        self.proc = subprocess.Popen([sys.executable, "-m", "iris.testing.cross_compile", "--worker", target.name],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def send(self, request: dict) -> None:
        _write_frame(self.proc.stdin, request)

    def receive(self, request: dict) -> tuple[str, str, int | None]:
        """The reply to the request sent last."""
        reply = _read_frame(self.proc.stdout)
        if reply is None:
            raise CrossCompileError(f"the cross-compile worker for {request['target']} exited "
                                    f"(code {self.proc.wait()}); its stderr is above")
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Gate:
    """Compiles each kernel launched here for ``targets`` before the interpreter runs it."""

    def __init__(self, targets: list[Target], directory: Path | None = None):
        import triton
        from triton.compiler import make_backend

        self.targets = targets
        self.directory = directory or cache_dir()
        self._backends = {t: make_backend(t.gpu_target()) for t in targets}
        self._workers: dict[Target, _Worker] = {}
        self._lock = threading.Lock()
        iris_root = Path(__file__).resolve().parent.parent
        self._version = hashlib.sha256((triton.__version__ + _digest_files(iris_root.rglob("*.py"))).encode())

    def check(self, interpreted_fn, args: tuple, kwargs: dict) -> None:
        """Compile ``interpreted_fn`` for every target with these launch arguments (cached), targets in parallel.

        Raises:
            CrossCompileError: it does not compile for a target (SharedMemoryError: it compiles, but needs more
                shared memory per program than the target's GPUs have).
        """
        error = next((e for e in self.verdicts(interpreted_fn, args, kwargs).values() if e is not None), None)
        if error is not None:
            raise type(error)(str(error))

    def verdicts(self, interpreted_fn, args: tuple, kwargs: dict) -> dict[Target, CrossCompileError | None]:
        """Per target, None where this launch of ``interpreted_fn`` compiles and fits the target's shared memory,
        else the error :meth:`check` would raise; what a caller that expects some refusals reads (an autotuner's
        candidates, of which the GPU skips those over its shared memory). Example:
        ``gate.verdicts(kernel, (x, y, n), dict(BLOCK=1024, num_stages=3))`` -> ``{Target("cuda", 90): None, ...}``.
        """
        verdicts = {}
        with self._lock:
            compiling = []  # (key, state, job) of the targets sent to their workers, in target order
            try:
                for target in self.targets:
                    state, work, found = self._look_up(target, interpreted_fn, args, kwargs)
                    if found is not None:  # checked before, here or in another process
                        verdicts[target] = found[0]
                        continue
                    key, request, marker = work
                    job = self._start(target, request, marker)
                    if job is None:  # another process compiled it while this one waited for the lock
                        state.done[key] = verdicts[target] = None
                    else:
                        compiling.append((key, state, job))
            finally:  # every job sent is finished and its lock released, whatever went wrong
                for key, state, job in compiling:
                    state.done[key] = verdicts[job["target"]] = self._finish(job)
        return {target: verdicts[target] for target in self.targets}

    def _look_up(self, target: Target, interpreted_fn, args, kwargs):
        """(state, work, found) of one launch for ``target``: ``found`` is ``(error or None,)`` when the launch's
        specialization was checked already (this process or the cache); else None, and ``work`` is
        ``(key, request, marker)``: what compiling it takes."""
        from triton import knobs
        from triton.runtime.jit import create_function_from_signature

        from iris.runtime.launch_options import for_target

        state = _state(interpreted_fn)
        jit, backend = state.jit, self._backends[target]
        kwargs = for_target(target.backend, kwargs, jit.arg_names)  # AMD-only options: for hip targets only
        if target not in state.binders:
            state.binders[target] = create_function_from_signature(jit.signature, jit.params, backend)
        kwargs = dict(kwargs, debug=kwargs.get("debug", jit.debug) or knobs.runtime.debug,
                      instrumentation_mode=knobs.compilation.instrumentation_mode)
        bound, specialization, options = state.binders[target](*args, **kwargs)
        key = (target, str(specialization), str(options), _debug_on(), str(self.directory))
        if key in state.done:
            return state, None, (state.done[key],)
        options, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialization, options)
        fn = interpreted_fn.fn
        request = dict(target=target.name, module=fn.__module__, qualname=fn.__qualname__,
                       path=inspect.getsourcefile(fn), signature=signature, constexprs=constexprs, attrs=attrs,
                       options=options.__dict__, debug=_debug_on())
        marker = self._marker(target, request, key[1:4])
        if marker.exists():
            marker.touch()  # checked again now: summary(since=...) counts it
            state.done[key] = None
            return state, None, (None,)
        return state, (key, request, marker), None

    def _marker(self, target: Target, request: dict, specialization) -> Path:
        """The cache file that says this specialization compiled for ``target`` (any process, any run)."""
        h = self._version.copy()
        h.update(repr((request["module"], request["qualname"], specialization, request["debug"])).encode())
        with contextlib.suppress(OSError, TypeError):
            h.update(Path(request["path"]).read_bytes())
        folder = self.directory / target.name.replace(":", "-")
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{h.hexdigest()[:32]}.json"

    def _start(self, target: Target, request: dict, marker: Path):
        """Take the specialization's lock (one process compiles it; the others wait and find the marker) and send
        it to the target's worker; None where the marker appeared meanwhile."""
        lock = open(marker.with_suffix(".lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if marker.exists():
                lock.close()
                return None
            worker = self._workers.get(target) or self._workers.setdefault(target, _Worker(target))
            worker.send(request)
        except BaseException:
            lock.close()
            raise
        return dict(target=target, request=request, marker=marker, lock=lock, worker=worker)

    def _finish(self, job: dict) -> CrossCompileError | None:
        """The worker's answer to a job :meth:`_start` sent: the marker written (None) or the error; the lock
        released either way."""
        try:
            status, message, shared = job["worker"].receive(job["request"])
            request, target = job["request"], job["target"]
            kernel = f"{request['module']}.{request['qualname']}"
            if status == "error":
                return CrossCompileError(f"kernel {kernel} does not compile for {target.name} (cross-compile gate, "
                                         f"{TARGETS_ENV}):\n{message}")
            limit = target.shared_memory_bytes
            if shared is not None and limit is not None and shared > limit:
                options = request["options"]
                return SharedMemoryError(
                    f"kernel {kernel} needs {shared} bytes of shared memory per program on {target.name}, which has "
                    f"{limit}: its GPUs refuse the launch (OutOfResources; cross-compile gate, {TARGETS_ENV}). "
                    f"Constants {request['constexprs']}, num_warps {options.get('num_warps')}, num_stages "
                    f"{options.get('num_stages')}: smaller tiles or fewer stages fit")
            record = dict(kernel=kernel, status=status, detail=message, signature=request["signature"],
                          shared=shared)
            _write_atomically(job["marker"], json.dumps(record, default=str))
            return None
        finally:
            job["lock"].close()

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()


class _KernelState:
    """What the gate keeps on one interpreted kernel: a JITFunction of the same source (whose
    binder specializes arguments as a GPU launch would), a binder per target, the launches checked."""

    def __init__(self, interpreted_fn):
        from triton.runtime.jit import JITFunction

        self.jit = JITFunction(interpreted_fn.fn, **interpreted_fn.kwargs)
        self.binders: dict = {}
        self.done: dict[tuple, CrossCompileError | None] = {}  # None: compiled; else the error


def _state(interpreted_fn) -> _KernelState:
    state = interpreted_fn.__dict__.get("_iris_cross_compile")
    if state is None:
        state = interpreted_fn.__dict__["_iris_cross_compile"] = _KernelState(interpreted_fn)
    return state


def _debug_on() -> tuple[bool, bool]:
    from iris.host import debug

    return debug.compile_flavour()


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp")
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(tmp, path)


_gate: Gate | None = None


def install(targets: list[Target]) -> Gate:
    """Compile every kernel this process launches under Triton's interpreter for ``targets`` first."""
    global _gate
    from triton.runtime.interpreter import InterpretedFunction

    if _gate is not None:
        _gate.close()
    _gate = Gate(targets)
    triton_run = InterpretedFunction.__dict__.get("_iris_run_before_gate", InterpretedFunction.run)

    def run(self, *args, grid, warmup, **kwargs):
        if _gate is not None and not warmup:
            _gate.check(self, args, kwargs)
        return triton_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction._iris_run_before_gate = triton_run
    InterpretedFunction.run = run
    return _gate


@contextlib.contextmanager
def suspended():
    """Launch without the gate inside this block (a test of what the interpreter itself does)."""
    global _gate
    gate, _gate = _gate, None
    try:
        yield
    finally:
        _gate = gate


def install_from_environment() -> Gate | None:
    """:func:`install` with the targets ``IRIS_CROSS_COMPILE`` names, if it names any."""
    targets = parse_targets(config.cross_compile_targets())
    return install(targets) if targets else None


def asked() -> bool:
    """Whether this process's launches go through the gate: IRIS_CROSS_COMPILE names targets and the
    backend is interpreted (a GPU backend compiles every kernel for real)."""
    from iris.runtime import device_facts

    return bool(config.cross_compile_targets()) and not device_facts().compiles_kernels


def install_if_asked() -> Gate | None:
    """:func:`install_from_environment` where :func:`asked`, else nothing (None). Idempotent."""
    if not asked():
        return None
    return _gate if _gate is not None else install_from_environment()


def python_command(args: list[str]) -> list[str]:
    """The command line of a Python process that runs ``args`` (``[script, ...]``, ``[-m, module, ...]``
    or ``[-c, code, ...]``) as ``python *args`` would, with the gate installed first where :func:`asked`."""
    if asked():
        return [sys.executable, "-m", __name__, "--run", *args]
    return [sys.executable, *args]


def run_as_python(args: list[str]) -> None:
    """Install the gate (where asked), then run ``args`` as ``python *args`` would: a script as
    ``__main__`` with its folder first on sys.path, ``-m module``, or ``-c code``."""
    import runpy

    install_if_asked()
    if not args:
        raise SystemExit("--run: nothing to run (a script, -m module or -c code)")
    if args[0] == "-m" and len(args) > 1:
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c" and len(args) > 1:
        import types

        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        main_module = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(args[1], "<string>", "exec"), main_module.__dict__)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


def enable(spec: str) -> Gate | None:
    """Turn the gate on for this process and the processes it starts (``spec`` as IRIS_CROSS_COMPILE).

    Elsewhere than the CPU backend this does nothing and returns None.
    """
    from iris.runtime import device_facts

    targets = parse_targets(spec)
    if not targets or device_facts().compiles_kernels:
        return None
    config.set_cross_compile_targets(",".join(t.name for t in targets))
    return install(targets)


# ------------------------------------------------------------------------------- worker side


def _write_frame(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read_frame(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def _find_kernel(module_name: str, qualname: str, path: str | None):
    """The ``@triton.jit`` kernel by module and name, imported here as a GPU process would."""
    from triton.runtime.jit import JITFunction

    if "<locals>" in qualname:
        return None, "defined inside a function: not importable by name"
    if module_name == "__main__":  # a launched script: its definitions, not its work
        if not path:
            return None, "the script's file is unknown"
        module = sys.modules.get(f"__iris_script__{path}") or _definitions_of(path)
    else:
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                if not path:
                    return None, f"module {module_name} not importable"
                spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                spec.loader.exec_module(module)
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    while obj is not None and not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn  # autotuner / heuristics wrappers
    if not isinstance(obj, JITFunction):
        return None, f"{module_name}.{qualname} is not a @triton.jit function in a GPU process"
    return obj, ""


def _definitions_of(path: str):
    """The script at ``path`` as a module holding only its imports, functions, classes and constant
    assignments: running the whole script would start its work (a context, a process group) here."""
    import ast
    import types

    tree = ast.parse(Path(path).read_text(), path)

    def definition(node) -> bool:
        return isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))

    def constant(node) -> bool:  # an assignment that calls nothing but tl.constexpr (BLOCK = tl.constexpr(64))
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            return False
        calls = [n for n in ast.walk(node.value) if isinstance(n, ast.Call)]
        return all(ast.unparse(c.func).endswith("constexpr") for c in calls)

    module = types.ModuleType("__iris_script__", doc=f"definitions of {path}")
    module.__file__ = path
    sys.modules[f"__iris_script__{path}"] = module
    for node in tree.body:
        if definition(node) or constant(node):
            code = compile(ast.Module(body=[node], type_ignores=[]), path, "exec")
            try:
                exec(code, module.__dict__)
            except NameError:  # an assignment from the script's run-time values (rank = ctx.get_rank() ...)
                if definition(node):
                    raise
    return module


@contextlib.contextmanager
def _captured_stderr():
    """What the compiler prints (MLIR's diagnostics on descriptor 2, a dump of the module on 1), as
    ``box[0]`` afterwards."""
    box = [""]
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile() as file:
        for fd in saved:
            os.dup2(file.fileno(), fd)
        try:
            yield box
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            file.seek(0)
            box[0] = file.read().decode(errors="replace")


def _compile_request(request: dict, target: Target) -> tuple[str, str, int | None]:
    """(status, message, shared memory bytes per program): "compiled", "unchecked" (a kernel not importable by
    name) or "error" (the compiler's message)."""
    import triton
    from triton.compiler import ASTSource

    from iris.host import debug

    try:
        kernel, why = _find_kernel(request["module"], request["qualname"], request["path"])
    except Exception as exc:  # the module failed to import in a GPU process: that is a finding too
        return "error", f"importing {request['module']} failed: {type(exc).__name__}: {exc}", None
    if kernel is None:
        return "unchecked", why, None
    debug.set_compile_constants(request["debug"])
    source = ASTSource(kernel, request["signature"], request["constexprs"], request["attrs"])
    with _captured_stderr() as printed:
        try:
            shared = triton.compile(source, target=target.gpu_target(), options=request["options"]).metadata.shared
            failure = None
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
    if failure is None:
        return "compiled", "", shared
    lines = [_readable(line) for line in printed[0].splitlines() if "error" in line.lower()]
    return "error", "\n".join((lines or printed[0].splitlines()[-20:]) + [failure]), None


def _readable(diagnostic: str) -> str:
    """An MLIR diagnostic without its debug-info location dump: ``file:line`` (each call site) and the error."""
    import re

    if "error:" not in diagnostic or not diagnostic.startswith("loc("):
        return diagnostic
    sites = dict.fromkeys(f"{path}:{line}" for path, line in re.findall(r'"([^"]+\.py)":(\d+):\d+', diagnostic))
    return f"{' <- '.join(sites) or '?'}: {diagnostic[diagnostic.index('error:'):]}"


def _worker_main(target_name: str) -> None:
    (target,) = parse_targets(target_name)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever imported modules print goes to stderr, not into the replies
    requests = sys.stdin.buffer
    while (request := _read_frame(requests)) is not None:
        _write_frame(replies, _compile_request(request, target))


def summary(directory: Path | None = None, since: float = 0.0) -> list[str]:
    """One line per target: specializations and kernels compiled (or found compiled) since ``since``
    (a time.time()), and the kernels left unchecked."""
    directory = directory or cache_dir()
    lines = []
    for folder in sorted(p for p in directory.glob("*") if p.is_dir()):
        records = [json.loads(p.read_text()) for p in folder.glob("*.json") if p.stat().st_mtime >= since - 1]
        compiled = [r for r in records if r["status"] == "compiled"]
        unchecked = sorted({r["kernel"] for r in records if r["status"] == "unchecked"})
        line = (f"{folder.name.replace('-', ':', 1)}: {len(compiled)} specializations of "
                f"{len({r['kernel'] for r in compiled})} kernels compiled")
        if unchecked:
            line += f"; {len(unchecked)} kernels unchecked (not importable by name): {', '.join(unchecked)}"
        lines.append(line)
    return lines or [f"no cross-compile results under {directory}"]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run"]:  # everything after it is the process's own command line
        run_as_python(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="python -m iris.testing.cross_compile", description=__doc__.split("\n")[0])
    parser.add_argument("--summary", action="store_true", help="count the compiled kernels in the cache")
    parser.add_argument("--worker", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--run", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="run a Python script (or -m module, -c code) with the gate installed first")
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(args.worker)
    else:
        print("\n".join(summary()))


if __name__ == "__main__":
    from iris.testing.cross_compile import main as _main  # the imported module's: one gate per process

    _main()
