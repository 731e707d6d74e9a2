"""HIP backend: heaps shared through hipIpcGetMemHandle / hipIpcOpenMemHandle.

Chosen when torch is a ROCm build; shares the CUDA backend's implementation. Untested on an AMD GPU: only
symbol names, handle size and selection are tested.
"""

import ctypes

import torch

from iris.runtime.ipc import IpcBackend

#: hipDeviceAttributeNumberOfXccs (ROCm 7 and later).
HIP_ATTRIBUTE_XCC_COUNT = 10018

#: XCCs by architecture, where the device cannot be asked (ROCm 6).
XCC_COUNT_BY_ARCH = {"gfx942": 8, "gfx950": 8}


def configure_compiler() -> None:
    """Triton settings every process that makes AMD code needs (a HIP rank, a hip cross-compile worker).

    Buffer atomics are off: Triton 3.6-3.8 miscompile an atomic exchange as one (triton-lang/triton#11019).
    """
    from triton import knobs

    knobs.amd.use_buffer_atomics = False


def hip_xcc_count(lib, index: int, hip_version: str | None, arch: str) -> int:
    """The XCC count of AMD device ``index``: asked of the HIP runtime ``lib`` from ROCm 7, else by ``arch``.

    Example:
        >>> hip_xcc_count(None, 0, "6.4", "gfx942")
        8
    """
    major = int(str(hip_version).split(".")[0]) if hip_version and str(hip_version)[0].isdigit() else 0
    if lib is not None and major >= 7:
        count = ctypes.c_int(0)
        try:
            status = lib.hipDeviceGetAttribute(ctypes.byref(count), ctypes.c_int(HIP_ATTRIBUTE_XCC_COUNT),
                                               ctypes.c_int(index))
        except (AttributeError, OSError):
            status = -1
        if status == 0 and count.value > 0:
            return count.value
    return XCC_COUNT_BY_ARCH.get(arch.split(":")[0], 1)


def float8_formats_of(arch: str) -> tuple:
    """The float8 dtypes kernels store on an AMD GPU of architecture ``arch`` ("gfx942:sramecc+:xnack-"): MI300
    (gfx942) the fnuz variants, MI350 (gfx950) and RDNA4 (gfx12) the OCP formats, none before. Example:
    ``float8_formats_of("gfx90a")`` is ``()``."""
    arch = arch.split(":")[0]
    if arch == "gfx942":
        return (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
    if arch == "gfx950" or arch.startswith("gfx12"):
        return (torch.float8_e4m3fn, torch.float8_e5m2)
    return ()


class HipBackend(IpcBackend):
    name = "hip"
    runtime_prefix = "hip"
    library_fragment = "libamdhip64.so"
    fallback_libraries = ("libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so")
    compiles_kernels = True
    runs_programs_in_turn = False
    upcasts_narrow_floats = False
    has_streams = True
    has_copy_engine = True
    tensor_descriptors = False  # no TMA: the fused ops load tiles by pointer
    native_graph_launch = False  # graphs go out by graph.replay()
    engine_reaches_other_nodes = False  # rocSHMEM's device calls are not wired (docs/multi-node.md)
    memory_on_host = False
    default_allocator = "torch"  # the hipMem* path of allocator_type="vmem" has not run on an AMD GPU yet
    inline_asm = "amdgcn"

    def __init__(self):
        super().__init__()
        configure_compiler()  # made with the backend: before the first kernel compiles
        self._xcc_counts: dict[int, int] = {}

    @staticmethod
    def pipeline_buffers(num_stages: int) -> int:
        """AMD's stream pipeliner keeps one stage fewer in LDS (the newest stage's loads wait in registers):
        128 x 256 x 64 bf16 tiles in 3 stages compile to 98304 bytes for gfx942 (Triton 3.8), two copies."""
        return max(1, num_stages - 1)

    def wall_clock_rate_khz(self, device) -> int:
        """s_memrealtime counts at 100 MHz on AMD Instinct GPUs."""
        return 100_000

    def xcc_count(self, device_index=None) -> int:
        index = torch.cuda.current_device() if device_index is None else int(device_index)
        if index not in self._xcc_counts:
            arch = torch.cuda.get_device_properties(index).gcnArchName
            self._xcc_counts[index] = hip_xcc_count(getattr(self.runtime, "lib", None), index, torch.version.hip,
                                                    arch)
        return self._xcc_counts[index]

    @staticmethod
    def arch_name(props) -> str:
        return getattr(props, "gcnArchName", "")

    def float8_formats(self, device) -> tuple:
        return float8_formats_of(getattr(torch.cuda.get_device_properties(device), "gcnArchName", ""))
