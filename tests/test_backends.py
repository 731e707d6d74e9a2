"""Backend selection, and what can be checked of the GPU backends without a GPU."""

import pytest

from iris.runtime import select
from iris.runtime.cuda import CudaBackend
from iris.runtime.hip import HipBackend
from iris.runtime.ipc import IPC_HANDLE_BYTES, IpcMemHandle


def test_explicit_cpu_is_always_allowed(monkeypatch):
    monkeypatch.setenv("IRIS_BACKEND", "CPU")
    assert select.backend_name() == "cpu"


def test_automatic_choice_follows_torch(monkeypatch):
    monkeypatch.delenv("IRIS_BACKEND", raising=False)
    monkeypatch.setattr(select, "_torch_gpu_kind", lambda: None)
    assert select.backend_name() == "cpu"
    monkeypatch.setattr(select, "_torch_gpu_kind", lambda: "hip")
    assert select.backend_name() == "hip"
    monkeypatch.setattr(select, "_torch_gpu_kind", lambda: "cuda")
    assert select.backend_name() == "cuda"


def test_gpu_backend_of_the_other_vendor_is_refused(monkeypatch):
    monkeypatch.setenv("IRIS_BACKEND", "hip")
    monkeypatch.setattr(select, "_torch_gpu_kind", lambda: "cuda")
    with pytest.raises(select.BackendError, match="IRIS_BACKEND=hip but torch sees a cuda GPU"):
        select.backend_name()


def test_unknown_backend_name(monkeypatch):
    monkeypatch.setenv("IRIS_BACKEND", "metal")
    with pytest.raises(ValueError, match="cuda, hip, cpu"):
        select.backend_name()


def test_interpreter_is_enabled_only_for_cpu(monkeypatch):
    # setenv (not delenv) so that monkeypatch restores the variable afterwards: a TRITON_INTERPRET=1
    # leaking from here would put every later rank process on a GPU machine under the interpreter.
    monkeypatch.setenv("TRITON_INTERPRET", "")
    select.prepare_interpreter("cuda")
    import os

    assert os.environ["TRITON_INTERPRET"] == ""
    select.prepare_interpreter("cpu")
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_ipc_symbols_and_handle_size():
    # The runtime's calls are <prefix>Malloc, <prefix>IpcGetMemHandle, ... for both vendors.
    assert (CudaBackend.runtime_prefix, HipBackend.runtime_prefix) == ("cuda", "hip")
    assert CudaBackend.library_fragment == "libcudart.so" and HipBackend.library_fragment == "libamdhip64.so"
    assert IPC_HANDLE_BYTES == 64 and IpcMemHandle.__sizeof__(IpcMemHandle()) >= 64
    import ctypes

    assert ctypes.sizeof(IpcMemHandle) == 64


def test_ipc_handle_bytes_survive_zero_bytes():
    """A handle full of zero bytes must travel whole (a c_char array would stop at the first zero)."""
    import ctypes

    raw = bytes([7, 0, 0, 3] + [0] * 59 + [5])
    handle = IpcMemHandle.from_buffer_copy(raw)
    assert bytes(handle) == raw and ctypes.sizeof(handle) == 64
