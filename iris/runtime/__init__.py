"""Backends (one module each) and the choice between them.

Chosen once at import: the CPU backend must switch Triton to its interpreter before any kernel is defined.
"""

from iris.runtime import select
from iris.runtime.base import Backend, DeviceFacts, HeapMemory
from iris.runtime.select import (BACKENDS, BackendError, backend_name, compile_target, create_backend, device_facts,
                                 interpreted, prepare_interpreter)

try:
    SELECTED = backend_name()
    _SELECTION_ERROR = None
except (ValueError, BackendError) as exc:  # reported when a context is created, not at import
    SELECTED, _SELECTION_ERROR = None, exc
if SELECTED:
    prepare_interpreter(SELECTED)
if SELECTED == "cpu" and not compile_target():  # device="cuda" and torch.cuda's calls served by the host
    from iris.runtime.cuda_on_cpu import install as _serve_cuda_on_the_host

    _serve_cuda_on_the_host()
if compile_target().startswith("hip"):  # a cross-compile worker for an AMD target (it makes no backend)
    from iris.runtime.hip import configure_compiler as _configure_hip_compiler

    _configure_hip_compiler()

_instance = None


def get_backend() -> Backend:
    """The process's backend, created on first use.

    Raises:
        ValueError: IRIS_BACKEND names no known backend.
        BackendError: the requested backend cannot run here.
    """
    global _instance
    if _SELECTION_ERROR is not None:
        raise _SELECTION_ERROR
    if _instance is None:
        _instance = create_backend(SELECTED)
        if _instance.compiles_kernels:
            from iris.runtime.compile_cache import install as _install_compile_cache

            _install_compile_cache()  # the ranks of a job compile each kernel once, not once each
    return _instance


def backend_class(name: str | None = None) -> type[Backend]:
    """The class of the backend called ``name`` (None: this process's), whose facts need no device.

    Raises:
        ValueError: no backend has that name (or IRIS_BACKEND names none).
        BackendError: the requested backend cannot run here.

    Example:
        >>> iris.runtime.backend_class().memory_on_host      # True on the CPU backend
    """
    if name is None:
        if _SELECTION_ERROR is not None:
            raise _SELECTION_ERROR
        name = SELECTED
    return select.backend_class(name)


__all__ = ["BACKENDS", "Backend", "BackendError", "DeviceFacts", "HeapMemory", "SELECTED", "backend_class",
           "device_facts", "get_backend", "interpreted"]
