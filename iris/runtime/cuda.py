"""CUDA backend: heaps shared through cudaIpcGetMemHandle / cudaIpcOpenMemHandle.

One rank per GPU and several ranks on one GPU (simulation) both work: CUDA IPC
maps memory between processes on the same device as well as across devices.
"""

import torch

from iris.runtime.ipc import IpcBackend


def float8_formats_of(major: int, minor: int) -> tuple:
    """The float8 dtypes Triton converts to on an NVIDIA GPU of compute capability ``major.minor``: e4m3 and e5m2 in
    hardware from sm_89 (Ada, Hopper) on, none below. Example: ``float8_formats_of(8, 0)`` is ``()``."""
    return (torch.float8_e4m3fn, torch.float8_e5m2) if (major, minor) >= (8, 9) else ()


class CudaBackend(IpcBackend):
    name = "cuda"
    runtime_prefix = "cuda"
    library_fragment = "libcudart.so"
    fallback_libraries = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
    compiles_kernels = True
    runs_programs_in_turn = False
    upcasts_narrow_floats = False
    has_streams = True
    has_copy_engine = True
    tensor_descriptors = True  # TMA
    native_graph_launch = True  # cuGraphLaunch from C
    engine_reaches_other_nodes = True  # NVSHMEM's device calls
    memory_on_host = False
    inline_asm = "ptx"
    default_allocator = "torch"

    def xcc_count(self, device_index=None) -> int:
        return 1

    @staticmethod
    def arch_name(props) -> str:
        return f"sm_{props.major}{props.minor}"

    def float8_formats(self, device) -> tuple:
        props = torch.cuda.get_device_properties(device)
        return float8_formats_of(props.major, props.minor)
