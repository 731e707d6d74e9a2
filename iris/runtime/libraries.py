"""Vendor libraries bound through ctypes: the very one torch loaded where it did, and the error of a failed call."""

from __future__ import annotations

import ctypes
import ctypes.util
import os


class RuntimeApiError(RuntimeError):
    """A call into the CUDA/HIP runtime failed."""


def find_loaded_library(fragment: str) -> str | None:
    """Path of a shared library already mapped into this process whose name contains ``fragment``."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if fragment in os.path.basename(path):
                    return path
    except OSError:
        return None
    return None


def load_library(fragment: str, fallback_names: tuple[str, ...], what: str) -> ctypes.CDLL:
    """The library already mapped here whose name contains ``fragment`` (the very one torch uses), else the first
    of ``fallback_names`` that loads."""
    path = find_loaded_library(fragment)
    candidates = ([path] if path else []) + list(fallback_names)
    found = ctypes.util.find_library(fragment.replace("lib", "", 1).split(".")[0])
    if found:
        candidates.append(found)
    errors = []
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise RuntimeApiError(f"cannot load {what}; tried: {'; '.join(errors)}")
