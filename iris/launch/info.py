"""``iris info``: what a bug report needs to say about this machine and process, without starting a job.

Versions, the backend and why, each GPU and its peer access, the heap providers, every switch and setting
of :data:`iris.config.VARIABLES` and what it means here (a bad value reported, not raised), and the
backend's gaps. It creates no context, heap or process group.

Example:
    $ iris info            # a few lines of text
    $ iris info --json     # the same facts, for a script or an issue
"""

from __future__ import annotations

import importlib.util
import platform

from iris import config
from iris.memory.providers import provider_name

# Switches and settings whose meaning here says more than their value; the others are shown plainly.
_MEANINGS = {
    "IRIS_BACKEND": lambda: config.backend_request() or "chosen by what torch sees",
    "IRIS_SIMULATION": lambda: "several ranks per GPU" if config.simulation() else "off",
    "IRIS_HEAP_BASES_PREFIX": lambda: (f"{config.heap_bases_prefix()}_rank_<r>_heap_bases.json in simulation"
                                       + ("" if config.text("IRIS_HEAP_BASES_PREFIX") else " (default)")),
    "IRIS_HEAP": lambda: provider_name(None) + ("" if config.heap_request() else " (default)"),
    "IRIS_GRAPH_REPLAY": lambda: ("on" if config.graph_replay() else "off")
    + (" (default)" if not config.text("IRIS_GRAPH_REPLAY").strip() else "") + _no_graphs_here(),
    "IRIS_NATIVE_REPLAY": lambda: native_replay_meaning(config.native_replay(), _backend()),
    "IRIS_NATIVE_CACHE": config.native_cache,
    "IRIS_LL_PACK": lambda: {True: "two 16-bit elements a word", False: "off (one element a word)",
                             None: "two 16-bit elements a word past 32768 elements (default)"}[config.ll_pack()],
    "IRIS_TWO_SHOT_WRITES": lambda: ("on" if config.two_shot_writes() else "off (each member reads its half)")
    + (" (default)" if not config.text("IRIS_TWO_SHOT_WRITES").strip() else ""),
    "IRIS_CPU_BIND": lambda: "iris run binds each rank to cores of its own" if config.cpu_bind_requested() else "off",
    "IRIS_QUIET_AMD_OPTIONS": lambda: ("on: AMD-only launch options dropped without a warning"
                                       if config.quiet_amd_options() else
                                       "off: a warning for each AMD-only launch option dropped"),
    "IRIS_CPU_CUDA": lambda: ("on: where torch sees no GPU, the CPU backend serves device=\"cuda\" and torch.cuda"
                              if config.cpu_cuda() else "off: torch left as it is"),
    "IRIS_WAIT_TIMEOUT": lambda: f"{config.wait_timeout_s():g} s (debug mode's waits)",
    "IRIS_LOG_LEVEL": config.log_level_name,
    "IRIS_CROSS_COMPILE": lambda: config.cross_compile_targets() or "off",
    "IRIS_CROSS_COMPILE_CACHE": config.cross_compile_cache,
    "IRIS_ENGINE_CACHE": config.engine_cache,
}


def _generic(variable):
    """What a switch or setting without an entry in _MEANINGS means: on or off, or its value, else its default."""
    if variable.kind == "switch":
        return lambda: ("on" if config.switch(variable.name) else "off") + \
            ("" if config.text(variable.name).strip() else " (default)")
    return lambda: config.text(variable.name) or f"{variable.default} (default)"


def _meanings() -> dict:
    """Every switch and setting a user sets (iris.config.VARIABLES, in its order), each with its reader."""
    return {v.name: _MEANINGS.get(v.name) or _generic(v) for v in config.VARIABLES if v.kind in ("switch", "setting")}


def _backend():
    """The class of the backend this process runs (its facts need no device), or None where none can run."""
    import iris

    try:
        return iris.runtime.backend_class()
    except (ValueError, iris.runtime.BackendError):
        return None


def _no_graphs_here() -> str:
    """What IRIS_GRAPH_REPLAY changes on this backend: nothing where there are no streams to capture."""
    backend = _backend()
    return _no_graphs_on(backend.name) if backend is not None and not backend.has_streams else ""


def _no_graphs_on(backend: str) -> str:
    return f"; no effect on the {backend} backend (no graphs to capture)"


def native_replay_meaning(on: bool, backend) -> str:
    """What IRIS_NATIVE_REPLAY does on ``backend`` (a class): nothing where graphs go by ``graph.replay()`` or none.

    Example:
        >>> native_replay_meaning(True, iris.runtime.backend_class("hip"))
        'on; no effect on the hip backend (its graphs go out by graph.replay())'
    """
    if not on:
        return "off"
    if backend is None:  # no backend can run here
        return "on"
    if not backend.has_streams:
        return "on" + _no_graphs_on(backend.name)
    if not backend.native_graph_launch:
        return f"on; no effect on the {backend.name} backend (its graphs go out by graph.replay())"
    return "on: repeated calls launched from C"


def collect() -> dict:
    """The facts, as a JSON-ready dict: versions, backend, devices, heap providers, switches, gaps."""
    import torch
    import triton

    import iris
    from iris.memory.providers.shmem import engine_available

    backend = iris.runtime.backend_class()
    requested = config.backend_request()
    shmem_refused = backend.find_limitation("shmem_heap")
    return {
        "versions": {"iris": iris.__version__, "python": platform.python_version(), "torch": torch.__version__,
                     "triton": triton.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip},
        "backend": {"name": backend.name,
                    "why": f"IRIS_BACKEND={requested}" if requested else
                    ("torch sees no GPU" if backend.memory_on_host else "torch sees a GPU"),
                    "kernels": "compiled for the GPU" if iris.runtime.device_facts().compiles_kernels else
                    "Triton's interpreter"},
        "devices": _devices(backend),
        # a heap in host memory is sparse shared memory, backed as allocations touch it: what the machine can back
        "heap_memory": _host_heap_memory() if backend.memory_on_host else _device_heap_memory(backend),
        "heap_providers": {"ipc": "available",
                           "shmem": "available" if shmem_refused is None and engine_available() else
                           "not available: " + (f"the {backend.name.upper()} backend" if shmem_refused else
                                                "torch has no NVSHMEM/rocSHMEM for this GPU")},
        "mpi4py": importlib.util.find_spec("mpi4py") is not None,
        "switches": {name: _meaning(name, reader) for name, reader in _meanings().items()},
        "gaps": [{"feature": row.feature, "dtype": row.dtype, "reason": row.reason} for row in backend.limitations()],
    }


def _meaning(name: str, reader) -> dict:
    try:
        means = reader()
    except ValueError as error:
        means = f"refused: {error}"
    return {"value": config.text(name), "means": means}


def _host_heap_memory() -> str:
    from iris.runtime.shm import capacity_report

    return ("sparse POSIX shared memory, backed as allocations touch it (ctx.heap_usage()); "
            f"{capacity_report()}, shared by the ranks of this machine")


def _device_heap_memory(backend) -> str:
    from iris.context import allocator_name

    try:
        name = allocator_name(None, backend)
    except ValueError as error:
        return f"refused: {error}"
    how = {"vmem": "its address range reserved, backed in chunks as allocations grow",
           "torch": "one device allocation, backed up front"}[name]
    return (f"allocator {name!r} ({how}); the backend's default {backend.default_allocator!r}, "
            "allocator_type= or IRIS_ALLOCATOR chooses (ctx.heap_usage() shows reserved vs backed bytes)")


def _devices(backend) -> list[dict]:
    if backend.memory_on_host:
        return []
    import torch

    devices = []
    count = torch.cuda.device_count()
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        arch = backend.arch_name(props)
        devices.append({"index": index, "name": props.name, "arch": arch, "units": props.multi_processor_count,
                        "memory_gib": round(props.total_memory / (1 << 30), 1),
                        "peers": [other for other in range(count)
                                  if other != index and torch.cuda.can_device_access_peer(index, other)]})
    return devices


def render(facts: dict) -> str:
    """The facts as text, one fact a line."""
    versions = facts["versions"]
    toolkit = f"CUDA {versions['cuda']}" if versions["cuda"] else (f"HIP {versions['hip']}" if versions["hip"] else
                                                                   "CPU build")
    backend = facts["backend"]
    lines = [f"iris {versions['iris']}, python {versions['python']}, torch {versions['torch']} ({toolkit}), "
             f"triton {versions['triton']}",
             f"backend: {backend['name']} ({backend['why']}; kernels: {backend['kernels']})"]
    if not facts["devices"]:
        lines.append("devices: none (ranks map each other's heaps through POSIX shared memory)")
    if facts["heap_memory"]:
        lines.append(f"heap memory: {facts['heap_memory']}")
    for device in facts["devices"]:
        peers = ", ".join(map(str, device["peers"])) or "none"
        lines.append(f"device {device['index']}: {device['name']}, {device['arch']}, {device['units']} compute units, "
                     f"{device['memory_gib']} GiB, peer access to: {peers}")
    lines.append("heap provider: " + "; ".join(f"{name} {state}" for name, state in facts["heap_providers"].items()))
    lines.append(f"mpi4py: {'installed' if facts['mpi4py'] else 'not installed (pip install iris[mpi])'}")
    lines.append("switches:")
    for name, switch in facts["switches"].items():
        shown = repr(switch["value"]) if switch["value"] else "unset"
        lines.append(f"  {name:24} {shown:12} {switch['means']}")
    lines.append(f"gaps of the {backend['name']} backend (iris.runtime.capabilities): {len(facts['gaps'])}")
    for gap in facts["gaps"]:
        lines.append(f"  {gap['feature']}{' (' + gap['dtype'] + ')' if gap['dtype'] else ''}: {gap['reason']}")
    return "\n".join(lines)
