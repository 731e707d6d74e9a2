"""Launching the same Triton kernel with the same arguments again, for the price of the driver call.

``kernel[grid](*args)`` binds every argument, works out what the compiler specializes on and
looks the compiled kernel up, on every call. On an H200 host that costs 13.6 us for an empty
kernel with 11 arguments (benchmarks/probes/graph_launch_probe.py measures the like): more than the GPU time of a small
collective. :func:`bind` does that work once and returns a :class:`BoundLaunch`. Calling it
launches the compiled kernel on the current stream, with the arguments fixed at bind time.
Pointers are kept as addresses, so the bound launch holds no tensor alive.

On Triton's interpreter (the CPU backend) there is no compiled kernel. There a bound launch
calls ``kernel[grid](*args, **constexprs)`` each time and keeps its tensors. On a GPU an installed
Triton launch hook (a profiler) still sees every launch.

Example:
    >>> launch = bind(my_kernel, (4,), x, y, n, BLOCK=256)
    >>> launch()   # the same as my_kernel[(4,)](x, y, n, BLOCK=256), without Triton's per-call Python
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import weakref

import torch
from triton import knobs

from iris import config
from iris.runtime import interpreted

_RUNTIME_KNOBS = knobs.runtime  # the launch hooks live here


class BoundLaunch:
    """One kernel, grid and argument list, ready to launch on the current stream (see :func:`bind`)."""

    __slots__ = ("_kernel", "_grid", "_args", "_constexprs", "_compiled", "_values", "_device", "_run", "_function",
                 "_metadata")

    def __init__(self, kernel, grid, args, constexprs):
        self._kernel, self._grid, self._args, self._constexprs = kernel, tuple(grid) + (1,) * (3 - len(grid)), args, \
            constexprs
        self._compiled = None
        self._values = ()
        self._device = None

    def _compile(self) -> None:
        """Compile (or find) the kernel for these arguments, as a launch through Triton would."""
        compiled = self._kernel.warmup(*self._args, grid=self._grid, **self._constexprs)
        if hasattr(compiled, "result"):  # Triton's asynchronous compile mode hands back a future
            compiled = compiled.result()
        compiled.run  # noqa: B018  (loads the module: sets compiled.function)
        names = [p.name for p in self._kernel.params]
        defaults = {name: p.default for name, p in inspect.signature(self._kernel.fn).parameters.items()}
        tail = [self._constexprs[name] if name in self._constexprs else defaults[name]
                for name in names[len(self._args):]]
        # The launcher takes every parameter in order (it skips the constexprs); pointers as addresses.
        self._values = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in self._args) + tuple(tail)
        self._device = torch.cuda.current_device()
        self._run, self._function, self._metadata = compiled.run, compiled.function, compiled.packed_metadata
        self._compiled = compiled
        self._args = None  # from now on only addresses: no tensor is kept alive

    def __call__(self) -> None:
        compiled = self._compiled
        if compiled is None:  # the interpreter
            self._kernel[self._grid](*self._args, **self._constexprs)
            return
        stream = _current_stream(self._device)
        gx, gy, gz = self._grid
        enter = _RUNTIME_KNOBS.launch_enter_hook
        if _no_hook(enter):
            self._run(gx, gy, gz, stream, self._function, self._metadata, None, None, None, *self._values)
        else:  # as Triton launches it, so that the hook (a profiler) sees the launch
            launch_metadata = compiled.launch_metadata(self._grid, stream, *self._values)
            self._run(gx, gy, gz, stream, self._function, self._metadata, launch_metadata, enter,
                      _RUNTIME_KNOBS.launch_exit_hook, *self._values)


def bind(kernel, grid, *args, **constexprs) -> BoundLaunch:
    """``kernel[grid](*args, **constexprs)`` as a reusable launch: compiled now, launched by calling it.

    Args:
        kernel: a ``@triton.jit`` function.
        grid: the launch grid, a tuple of 1 to 3 ints.
        args: the kernel's leading arguments, positional (tensors, ints, floats).
        constexprs: the remaining (constexpr) arguments, by name; left out: their defaults.

    On a GPU, the kernel is compiled (or found) now, for exactly these arguments: their dtypes,
    alignments and value classes, as Triton would specialize them. The tensors' memory must stay
    allocated for as long as the launch is used.
    """
    launch = BoundLaunch(kernel, grid, args, constexprs)
    if _compiles():
        launch._compile()
    return launch


def weakly_held(function, *tensors):
    """A launch that calls ``function(*tensors)`` with each tensor (or None) held by a weak reference, for the
    launches torch runs (the vendor's GEMM, copies into a caller's tensor): a remembered plan then keeps none of
    the caller's tensors alive, and :class:`Plans` drops a plan whose tensors have died instead of replaying it
    (their addresses may name new tensors by then). Views made of them are made inside ``function``.

    Example:
        >>> launch = weakly_held(lambda a, b, out: torch.mm(a, b, out=out), A, B, out)
        >>> launch()   # torch.mm(A, B, out=out), while A, B and out live
    """
    refs = tuple(None if tensor is None else weakref.ref(tensor) for tensor in tensors)

    def launch() -> None:
        function(*(None if ref is None else ref() for ref in refs))

    launch.tensors = tuple(ref for ref in refs if ref is not None)
    return launch


# Remembered calls per Plans; past this many the memory starts again (a program that keeps making new
# tensors for its calls gains nothing from it anyway).
MAX_PLANS = 1024


def call_key(name, first, second, *rest):
    """What a call's checks and launches depend on, as one flat tuple: its name, each tensor's address,
    shape, strides and dtype (``second`` may be None: one tensor), then ``rest``. None where a tensor
    argument is not a plain ``torch.Tensor``: such a call is not remembered (or is refused). Written
    out for two tensors: it runs on every call of a small collective, whose host time it is part of
    (so a contiguous tensor's strides, which its shape fixes, are ``True``: cheaper to read and hash).

    No device: under unified addressing (CUDA, HIP, and the host) an address names one device.

    Example:
        >>> call_key("all_reduce", out, x, "sum", None)
    """
    if type(first) is not torch.Tensor:
        return None
    if second is None:
        return (name, first.data_ptr(), first.shape, first.is_contiguous() or first.stride(), first.dtype, *rest)
    if type(second) is not torch.Tensor:
        return None
    return (name, first.data_ptr(), first.shape, first.is_contiguous() or first.stride(), first.dtype,
            second.data_ptr(), second.shape, second.is_contiguous() or second.stride(), second.dtype, *rest)


def value_key(value, kind: type):
    """A config argument by value (it may change between calls): None for None, its type and fields for
    a ``kind``; for anything else a fresh object (the call refuses it, so nothing is remembered under it)."""
    if value is None:
        return None
    if isinstance(value, kind):
        return type(value), *value.__dict__.values()
    return object()


class Plans:
    """The launches of calls remembered by :func:`call_key`, relaunched when the same call comes again
    (``ctx.ccl``, ``ctx.ops``): a repeated call skips its checks and Triton's per-call Python.

    Never in debug mode (each call is checked and diagnosed) nor for a key of None.

    On a GPU, unless IRIS_GRAPH_REPLAY=0 (read when the context's ``ccl``/``ops`` is made), a plan's
    launches are captured into a CUDA/HIP graph on its first replay, and later replays launch that graph
    (:func:`graph_launcher`): one driver call per call instead of one per launch (on an H200 host at one
    rank, 5.5-9.6 us of host time per ccl call instead of 7.8-29.7, two runs). Not while the stream is
    being captured (the user's own graph gets the launches), nor while a Triton launch hook (a profiler)
    is installed; a plan whose capture fails keeps its launches. On CUDA, unless IRIS_NATIVE_REPLAY=0, a
    repeated call's key, lookup, checks and graph launch are one C call (:meth:`replay_call`,
    iris.host.replay.native): on 2 x H200 the slowest rank's host time per small all_reduce 3.0-5.3 us against
    6.9-7.8 by Python (docs/benchmarks.md).

    Example:
        >>> plan = plans.replay(key)
        >>> result = plan.result if plan is not None else plans.remember(key, *call()).result
    """

    class Plan:
        __slots__ = ("launches", "result", "launch_graph", "captured", "tensors", "native")

        def __init__(self, launches, result):
            self.launches, self.result = tuple(launches), result
            # the caller's tensors its launches hold weakly (:func:`weakly_held`): all must live to replay
            self.tensors = tuple(ref for launch in self.launches for ref in getattr(launch, "tensors", ()))
            self.captured = False  # whether a capture into a graph was tried
            self.launch_graph = None  # graph_launcher(graph) once captured (it holds the graph)
            self.native = None  # (graph executable, device) where the driver launches it: iris.host.replay.native

    def __init__(self, ctx):
        self._ctx = ctx  # the context (a weak proxy): its team says whether debug mode is on
        self._plans: dict = {}
        self._kept: dict = {}  # heap workspaces, by problem: never dropped (a plan may use one)
        self._graphs = config.graph_replay() and _compiles()
        self._capturing = torch.cuda.is_current_stream_capturing  # whether the current stream is being captured
        if self._graphs:  # torch's own C call, without the Python around it
            self._capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", self._capturing)
        native = self._graphs and config.native_replay() and torch.version.cuda is not None  # HIP: graph.replay
        self._native, self._state = self._native_path() if native else (None, None)

    def _native_path(self):
        """iris.host.replay.native's ``replay`` and its state for these plans, or (None, None) (said why, once)."""
        driver = _driver_functions()
        if driver is None:
            self._ctx.warning("IRIS_NATIVE_REPLAY: repeated calls take the Python path (the CUDA driver library did "
                              "not load)")
            return None, None
        return self._native_state(driver, torch._C._cuda_getCurrentRawStream)

    def _native_state(self, driver, current_stream):
        """``(replay, state)`` of iris.host.replay.native for these plans, given the driver's two functions' addresses
        and the current-stream function, or (None, None) where the module cannot be built (said why). The
        state holds the team weakly, as these plans hold their context: the heap dies with the context."""
        from iris.host.replay import native

        module, why = native.load()
        if module is None:
            self._ctx.warning(f"IRIS_NATIVE_REPLAY: repeated calls take the Python path ({why})")
            return None, None
        return module.replay, (self._plans, weakref.proxy(self._ctx.team), _RUNTIME_KNOBS, torch.Tensor,
                               current_stream, *driver)

    def __len__(self) -> int:
        return len(self._plans)

    def plans(self) -> list[Plans.Plan]:
        """The remembered plans."""
        return list(self._plans.values())

    def replay_call(self, name, first, second, *rest):
        """``key = call_key(name, first, second, *rest)`` and :meth:`replay` of it, in one: ``(key, plan or None)``.

        With IRIS_NATIVE_REPLAY on (CUDA), a plan whose graph the driver launches is found and launched in one
        C call (iris.host.replay.native); every other case takes :meth:`replay`.

        Example:
            >>> key, plan = plans.replay_call("all_reduce", out, x, op, group)
        """
        if self._native is not None:
            key, plan = self._native(self._state, name, first, second, rest)
            if plan is not None:
                return key, plan
        else:
            key = call_key(name, first, second, *rest)
        return key, self.replay(key)

    def replay(self, key) -> Plans.Plan | None:
        """Relaunch the launches remembered for ``key`` (or launch their graph) and return its plan; None
        where none is. The path of every repeated small call: a plan's graph goes out after one lookup
        and three checks (debug mode, a profiler's launch hook, the user's own stream capture)."""
        try:
            plan = self._plans.get(key)
        except TypeError:  # an unhashable argument: the call itself says what is wrong with it
            return None
        if plan is None or self._ctx.team.debug:  # (remembered before debug mode was switched on)
            return None
        if plan.tensors and not all(ref() is not None for ref in plan.tensors):  # a tensor died: planned anew
            del self._plans[key]
            return None
        launch_graph = plan.launch_graph
        if (launch_graph is not None or (self._graphs and not plan.captured)) \
                and _no_hook(_RUNTIME_KNOBS.launch_enter_hook) and not self._capturing():
            if launch_graph is None:  # its first replay: captured once
                plan.captured = True
                graph = self._captured(plan.launches)
                launch_graph = plan.launch_graph = None if graph is None else \
                    graph_launcher(graph, torch.cuda.current_device())
                plan.native = getattr(launch_graph, "native", None)
            if launch_graph is not None:
                launch_graph()
                return plan
        for launch in plan.launches:
            launch()
        return plan

    def _captured(self, launches):
        """``launches`` captured into a CUDA/HIP graph on a side stream (not run), or None where capture
        fails (logged): the plan then keeps launching them one by one."""
        try:
            return captured_graph(launches)
        except RuntimeError as error:
            self._ctx.warning(f"a remembered call could not be captured into a graph ({error}); it launches as before")
            return None

    def kept(self, key, make):
        """The workspace kept for problem ``key``, made by ``make()`` on first use (heap allocations are
        collective: every rank asks for the same problems in the same order)."""
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    def remember(self, key, launches, result=None) -> Plans.Plan:
        """Keep the ``launches`` a call made (callables: bound launches, or stream work such as a counter's
        ``add_``) and what it returned, for the next call with the same ``key``; returns the plan."""
        plan = Plans.Plan(launches, result)
        if not launches or key is None or self._ctx.team.debug:
            return plan
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        try:
            self._plans[key] = plan
        except TypeError:  # unhashable: not remembered
            pass
        return plan


def captured_graph(launches) -> torch.cuda.CUDAGraph:
    """A CUDA/HIP graph of ``launches`` (callables that launch on the current stream), captured on a side
    stream, not run; RuntimeError where capture fails.

    Example:
        >>> graph = captured_graph([bind(my_kernel, (4,), x, y)])
        >>> graph_launcher(graph, torch.cuda.current_device())()   # my_kernel runs once
    """
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            for launch in launches:
                launch()
        finally:
            graph.capture_end()
    return graph


def graph_launcher(graph, device: int):
    """A callable that launches the captured ``graph`` on ``device``'s current stream, each time it is called.

    On CUDA it is one driver call, ``cuGraphLaunch`` of the graph's executable through ctypes: on H100 hosts
    2.1-3.9 us of host time per launch against 2.6-5.1 us for ``graph.replay()``, torch's own launch, which
    also walks its RNG and device guards (benchmarks/probes/graph_launch_probe.py). Elsewhere (HIP, or a torch
    without ``raw_cuda_graph_exec``) it is ``graph.replay``. The launcher keeps ``graph`` (and so its
    executable) alive.

    Example:
        >>> launch_graph = graph_launcher(graph, torch.cuda.current_device())
        >>> launch_graph()   # the captured work, once more, on the current stream
    """
    driver = _driver_functions() if torch.version.cuda is not None else None
    executable = getattr(graph, "raw_cuda_graph_exec", None)
    if driver is None or executable is None:
        return graph.replay
    launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(driver[1])
    handle, current_stream = ctypes.c_void_p(executable()), torch._C._cuda_getCurrentRawStream

    def launch_graph() -> None:
        result = launch(handle, current_stream(device))
        if result:
            raise RuntimeError(f"cuGraphLaunch of a remembered call's graph failed: CUresult {result}")

    launch_graph.graph = graph  # the executable lives as long as the graph
    launch_graph.native = (handle.value, device)  # what iris.host.replay.native launches from C
    return launch_graph


@functools.cache
def _driver_functions():
    """The addresses of the CUDA driver's ``cuStreamIsCapturing`` and ``cuGraphLaunch``, or None where the
    driver library does not load."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        return tuple(ctypes.cast(getattr(driver, name), ctypes.c_void_p).value
                     for name in ("cuStreamIsCapturing", "cuGraphLaunch"))
    except (OSError, AttributeError):
        return None


def _no_hook(enter) -> bool:
    """Whether ``enter``, Triton's launch-enter hook, is none (Triton 3.6 keeps an empty chain where none is)."""
    return enter is None or getattr(enter, "calls", None) == []


def _compiles() -> bool:
    """Whether Triton compiles for a device here (not the interpreter of the CPU backend)."""
    return not interpreted() and torch.cuda.is_available()


def _current_stream(device: int) -> int:
    """The raw handle of ``device``'s current stream (the call Triton itself makes on each launch)."""
    return torch._C._cuda_getCurrentRawStream(device)
