"""Choose the backend once, at import, before any Triton kernel is defined."""

from __future__ import annotations

import importlib

from iris import config

#: Each backend's module and class, by IRIS_BACKEND's name (a new backend: one entry here, one module).
_CLASSES = {"cuda": ("iris.runtime.cuda", "CudaBackend"), "hip": ("iris.runtime.hip", "HipBackend"),
            "cpu": ("iris.runtime.cpu", "CpuBackend")}
BACKENDS = tuple(_CLASSES)


class BackendError(RuntimeError):
    """The requested backend cannot run on this machine."""


def _torch_gpu_kind() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


def backend_name() -> str:
    """The backend this process uses: IRIS_BACKEND if set, else what torch sees.

    Raises:
        ValueError: IRIS_BACKEND names no known backend.
        BackendError: IRIS_BACKEND asks for a GPU backend this machine cannot run.
    """
    requested = config.backend_request()
    if requested and requested not in BACKENDS:
        raise ValueError(f"IRIS_BACKEND={requested!r} is not a backend; use one of {', '.join(BACKENDS)}")
    gpu = _torch_gpu_kind()
    if not requested:
        return gpu or "cpu"
    if requested != "cpu" and requested != gpu:
        found = f"torch sees a {gpu} GPU" if gpu else "torch sees no GPU"
        raise BackendError(
            f"IRIS_BACKEND={requested} but {found}; unset IRIS_BACKEND or set IRIS_BACKEND=cpu to run on the CPU"
        )
    return requested


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (the CPU backend turns it on at import)."""
    return config.interpreter_on()


def compile_target() -> str:
    """The target a cross-compile worker compiles for ("cuda:90", "hip:gfx942"), or "" in any other process."""
    return config.compile_target()


def gpu_vendor() -> str | None:
    """"hip" or "cuda": the vendor whose code this process's kernels become; None if interpreted or no GPU."""
    target = compile_target()
    if target:
        return target.partition(":")[0]
    if interpreted():
        return None
    return _torch_gpu_kind()


def prepare_interpreter(name: str) -> None:
    """Turn Triton's interpreter on for the CPU backend, before any ``@triton.jit`` function is defined."""
    if name == "cpu" and not compile_target():
        config.turn_interpreter_on()
        _mend_interpreter_index()
        _interpret_kernels_defined_earlier()


def _interpret_kernels_defined_earlier() -> None:
    """Run kernels defined before ``import iris`` under the interpreter too, so import order does not matter."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if getattr(JITFunction, "_iris_interprets", False):
        return

    def interpreted(kernel):
        found = kernel.__dict__.get("_iris_interpreted")
        if found is None:
            found = kernel.__dict__["_iris_interpreted"] = InterpretedFunction(kernel.fn)
        return found

    JITFunction.__getitem__ = lambda kernel, grid: interpreted(kernel)[grid]
    JITFunction.__call__ = lambda kernel, *args, **kwargs: interpreted(kernel)(*args, **kwargs)
    JITFunction._iris_interprets = True


def _mend_interpreter_index() -> None:
    """Squeeze before ``int()`` in the interpreter's ``__index__``, as Triton 3.7 does: NumPy 2.4 refuses older
    Triton's shape-(1,) conversion, failing every ``range()`` with a run-time bound."""
    import triton

    if tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 7):
        return
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_iris_index_mended", False):
        return

    def index(self):
        return int(self.handle.data.squeeze())

    def _patch_lang_tensor(tensor, *scope):  # Triton 3.6 passes a scope that undoes the patches later
        patch(tensor, *scope)
        if scope:
            scope[0].set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    _patch_lang_tensor._iris_index_mended = True
    interpreter._patch_lang_tensor = _patch_lang_tensor


def backend_class(name: str):
    """The class of the backend called ``name`` (imports only that backend's module; makes no backend).

    Raises:
        ValueError: no backend has that name.
    """
    if name not in _CLASSES:
        raise ValueError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(module), cls)


def create_backend(name: str):
    """Instantiate the backend called ``name`` (imports only that backend's module)."""
    return backend_class(name)()


def device_facts():
    """The facts device code of this process compiles against; read at each call, as the interpreter switch may change.

    Example:
        >>> device_facts()        # on the CPU backend
        DeviceFacts(inline_asm=None, compiles_kernels=False)
    """
    from iris.runtime.base import DeviceFacts

    if interpreted():
        return DeviceFacts(inline_asm=None, compiles_kernels=False)
    vendor = gpu_vendor()
    return DeviceFacts(inline_asm=backend_class(vendor).inline_asm if vendor else None, compiles_kernels=True)
