"""Backend selection, and what can be checked of the GPU backends without a GPU."""

import os

import pytest

from iris.runtime import interpreted, select
from iris.runtime.ipc import IPC_HANDLE_BYTES, GpuRuntime, IpcMemHandle


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
    assert os.environ["TRITON_INTERPRET"] == ""
    if not interpreted():
        # "cpu" turns the whole process to the interpreter, kernels defined earlier included, for good: every
        # kernel a GPU gate worker launched after this test would run interpreted (the CPU tier checks it)
        return
    select.prepare_interpreter("cpu")
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_a_handle_of_the_wrong_length_is_refused_before_the_runtime_is_called():
    """open_ipc_handle checks the bytes it was given (a peer's handle, passed through the host) before
    the driver sees them: no runtime library is loaded here, so reaching it would fail otherwise."""
    runtime = GpuRuntime.__new__(GpuRuntime)  # no library: any call into it raises AttributeError
    runtime.prefix = "cuda"
    with pytest.raises(ValueError, match=f"an IPC handle has {IPC_HANDLE_BYTES} bytes, got 63"):
        runtime.open_ipc_handle(bytes(63))


def test_ipc_handle_bytes_survive_zero_bytes():
    """A handle full of zero bytes must travel whole (a c_char array would stop at the first zero)."""
    import ctypes

    raw = bytes([7, 0, 0, 3] + [0] * 59 + [5])
    handle = IpcMemHandle.from_buffer_copy(raw)
    assert bytes(handle) == raw and ctypes.sizeof(handle) == 64
