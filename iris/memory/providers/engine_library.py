"""NVSHMEM's device library cut down to the functions Iris calls, so that a kernel links it in a moment.

Why: Triton parses NVSHMEM's whole bitcode library for every kernel compiled with it, which dominates a small
kernel's compile. :func:`slim_library` links a probe calling each of :data:`iris.device.nvshmem.SYMBOLS` and
keeps the linked module (cached under IRIS_ENGINE_CACHE); on any surprise the whole library is used.

Example:
    >>> path = slim_library(NvshmemLibFinder.find_device_library(), GPUTarget("cuda", 90, 32))
    >>> triton.compile(src, target=target, options={"extern_libs": {"libnvshmem_device": path}})
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import warnings
from pathlib import Path

from iris import config

PROBE = "iris_engine_probe"  # its name in the linked module


class _Linked(Exception):
    """Carries the linked module's text out of Triton's compile (nothing after linking is needed)."""


def _cache_dir() -> Path:
    return Path(config.engine_cache())


def _key(full: str, target) -> str:
    import triton

    from iris.device import nvshmem as engine

    stat = os.stat(full)
    facts = (triton.__version__, os.path.realpath(full), stat.st_size, stat.st_mtime_ns, target.backend,
             str(target.arch), engine.SYMBOLS)
    return hashlib.sha256(repr(facts).encode()).hexdigest()[:20]


def _linked_probe(full: str, target) -> str:
    """The LLVM module of the probe kernel right after Triton linked ``full`` into it, as text."""
    import triton
    from triton.backends.nvidia import compiler
    from triton.compiler import ASTSource

    from iris.device import nvshmem as engine

    link = compiler.llvm.link_extern_libs
    knobs = triton.knobs.compilation
    saved = knobs.disable_line_info, knobs.always_compile

    def link_and_stop(module, paths):
        link(module, paths)
        raise _Linked(str(module))

    compiler.llvm.link_extern_libs = link_and_stop
    knobs.disable_line_info, knobs.always_compile = True, True  # no debug records; never from the cache
    try:
        triton.compile(ASTSource(engine.iris_engine_probe, {"address": "i64", "pe": "i32"}, {}), target=target,
                       options={"extern_libs": {"libnvshmem_device": full}})
    except _Linked as linked:
        return linked.args[0]
    finally:
        compiler.llvm.link_extern_libs = link
        knobs.disable_line_info, knobs.always_compile = saved
    raise RuntimeError("Triton compiled the engine probe without linking its extern library")


def _cut(text: str, symbols: tuple[str, ...]) -> str | None:
    """The probe's module without the probe, its functions made linkable again; None if unexpected."""
    kernel = re.compile(r"^define [^\n]*@" + PROBE + r"\(.*?^}\n", re.S | re.M)
    text, removed = kernel.subn("", text)
    text = re.sub(r"^define internal ", "define ", text, flags=re.M)
    defined = set(re.findall(r"^define [^\n]*?@([\w.$]+)\(", text, flags=re.M))
    if removed != 1 or "@" + PROBE in text or not set(symbols) <= defined:
        return None
    return text


def slim_library(full: str, target) -> str:
    """A path to the NVSHMEM device functions Iris calls, cut from ``full`` for ``target`` (else ``full``)."""
    from iris.device import nvshmem as engine

    path = _cache_dir() / f"nvshmem-{_key(full, target)}.ll"
    if path.exists():
        return str(path)
    try:
        text = _cut(_linked_probe(full, target), engine.SYMBOLS)
    except Exception as error:  # noqa: BLE001  (any failure here only costs compile time)
        text, why = None, f"{type(error).__name__}: {error}"
    else:
        why = "the linked probe is not as expected"
    if text is None:
        warnings.warn(f"iris: NVSHMEM's device library could not be cut to the engine's functions ({why}); every "
                      f"kernel links the whole of {full} (seconds per compile)", stacklevel=2)
        return full
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as out:
        out.write(text)
    os.replace(out.name, path)  # whole or absent: ranks making it at once each write their own
    return str(path)
