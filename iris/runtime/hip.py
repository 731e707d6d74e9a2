"""HIP backend: heaps shared through hipIpcGetMemHandle / hipIpcOpenMemHandle.

Chosen when torch is a ROCm build. It shares its implementation with the CUDA
backend (iris/runtime/ipc.py); it has not run on an AMD GPU (none is available
to the project), so only symbol names, handle size and selection are tested.
"""

from iris.runtime.ipc import IpcBackend


def configure_compiler() -> None:
    """Triton settings every process that makes AMD code needs (a HIP rank, a hip cross-compile worker).

    Triton 3.6-3.8 turn an atomic exchange on a kernel-argument pointer into an AMD buffer atomic
    and name its intrinsic "...buffer.atomic.exch" where LLVM has only "...swap" (triton-lang/triton
    #11019): ``iris.atomic_xchg`` and ``iris.signal`` fail to compile for gfx942. Iris keeps atomics
    on global addresses instead (AMDGCN_USE_BUFFER_ATOMICS=0), where every atomic compiles.
    """
    from triton import knobs

    knobs.amd.use_buffer_atomics = False


class HipBackend(IpcBackend):
    name = "hip"
    runtime_prefix = "hip"
    library_fragment = "libamdhip64.so"
    fallback_libraries = ("libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so")

    def wall_clock_rate_khz(self, device) -> int:
        """s_memrealtime counts at a constant 100 MHz on AMD Instinct GPUs (iris.device.sync)."""
        return 100_000

    def __init__(self):
        super().__init__()
        configure_compiler()  # made with the backend: before the first kernel compiles
