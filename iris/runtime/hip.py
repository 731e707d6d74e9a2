"""HIP backend: heaps shared through hipIpcGetMemHandle / hipIpcOpenMemHandle.

Chosen when torch is a ROCm build. It shares its implementation with the CUDA
backend (iris/runtime/ipc.py); it has not run on an AMD GPU (none is available
to the project), so only symbol names, handle size and selection are tested.
"""

from iris.runtime.ipc import IpcBackend


class HipBackend(IpcBackend):
    name = "hip"
    runtime_prefix = "hip"
    library_fragment = "libamdhip64.so"
    fallback_libraries = ("libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so")
