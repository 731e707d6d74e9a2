"""CUDA backend: heaps shared through cudaIpcGetMemHandle / cudaIpcOpenMemHandle.

One rank per GPU and several ranks on one GPU (simulation) both work: CUDA IPC
maps memory between processes on the same device as well as across devices.
"""

from iris.runtime.ipc import IpcBackend


class CudaBackend(IpcBackend):
    name = "cuda"
    runtime_prefix = "cuda"
    library_fragment = "libcudart.so"
    fallback_libraries = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
