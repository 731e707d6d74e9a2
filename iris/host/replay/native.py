"""The host path of a repeated ``ctx.ccl``/``ctx.ops`` call in C: key, lookup and graph launch in one call (CUDA).

A repeated small collective is host-bound. ``native.c`` (beside this file) makes :func:`iris.host.replay.call_key`'s
key, finds the plan and launches its graph by the driver in one C call, leaving every other case (first call, first
replay, debug mode, a launch hook, a user's capture) to :meth:`iris.host.replay.Plans.call`'s Python path. It is
built on first use with the system's C compiler (``$CC``, else ``cc``), as Triton builds its launchers, into
``IRIS_NATIVE_CACHE`` (else the temporary directory); where that fails the context says why once and the Python
path is used. Switch: ``IRIS_NATIVE_REPLAY``. ``replay``'s state tuple (one per Plans): ``(plans dict, team,
triton.knobs.runtime, torch.Tensor, current raw stream function, cuStreamIsCapturing, cuGraphLaunch,
cuLaunchKernel)``; a plan of one kernel packed by :mod:`iris.host.replay.direct` goes out by ``cuLaunchKernel``.

Example:
    >>> module, why = load()
    >>> key, plan = module.replay(state, "all_reduce", out, x, (None, None, False, None, False), None)
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from iris import config

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native.c")
MODULE_NAME = "iris_native_replay"  # PyInit_iris_native_replay in the source


def build(directory: str) -> str:
    """Compile the source into ``directory`` (once per source and Python) and return the module's path.

    Raises RuntimeError with the compiler's output where it fails."""
    with open(SOURCE, "rb") as file:
        source = file.read()
    tag = hashlib.sha256(source + sys.version.encode() + sysconfig.get_platform().encode()).hexdigest()[:16]
    target = os.path.join(directory, f"{MODULE_NAME}_{tag}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}")
    if os.path.exists(target):
        return target
    compiler = config.c_compiler() or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc, gcc, or $CC) on PATH")
    os.makedirs(directory, exist_ok=True)
    handle, scratch = tempfile.mkstemp(suffix=".so", dir=directory)  # ranks may build at once: each its own
    os.close(handle)
    command = [*compiler.split(), "-O2", "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], SOURCE, "-o",
               scratch]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
        os.replace(scratch, target)  # atomic: a rank loading it sees all of it or nothing
    finally:
        if os.path.exists(scratch):  # a failed build (or a compiler that would not start) leaves nothing
            os.unlink(scratch)
    return target


@functools.cache
def load():
    """``(module, None)``, the compiled module (built on first use), or ``(None, why)`` where it cannot be."""
    places = (config.native_cache(),
              os.path.join(tempfile.gettempdir(), f"iris-native-{os.getuid()}"))  # a read-only home: here
    try:
        path = _build_in_first_writable(places)
        spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, None
    except (OSError, RuntimeError, ImportError) as error:
        return None, str(error)


def _build_in_first_writable(places) -> str:
    """:func:`build` in the first of ``places`` where a directory can be made and written."""
    for place in places[:-1]:
        try:
            return build(place)
        except OSError:
            continue
    return build(places[-1])
