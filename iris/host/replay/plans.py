"""A Triton launch bound once (:func:`bind`) and a call's launches remembered to relaunch them (:class:`Plans`).

``kernel[grid](*args)`` redoes Triton's argument binding and kernel lookup on every call, more host time than a
small collective's GPU time; a :class:`BoundLaunch` does it once. :meth:`Plans.call` is the way a call comes in.

Example:
    >>> bind(my_kernel, (4,), x, y, n, BLOCK=256)()   # my_kernel[(4,)](x, y, n, BLOCK=256)
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import weakref

import torch
from triton import knobs

from iris import config
from iris import runtime
from iris.host import watchdog

_RUNTIME_KNOBS = knobs.runtime  # the launch hooks live here


class BoundLaunch:
    """One kernel, grid and argument list, ready to launch on the current stream (see :func:`bind`)."""

    __slots__ = ("_kernel", "_grid", "_args", "_constexprs", "_compiled", "_values", "_tail", "_device", "_run",
                 "_function", "_metadata")

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
        self._tail = tuple(tail)
        self._values = _addresses(self._args) + self._tail
        self._device = torch.cuda.current_device()
        self._run, self._function, self._metadata = compiled.run, compiled.function, compiled.packed_metadata
        self._compiled = compiled
        self._args = None  # from now on only addresses: no tensor is kept alive

    def __call__(self) -> None:
        if self._compiled is None:  # the interpreter
            self._kernel[self._grid](*self._args, **self._constexprs)
            return
        self._launch(self._values)

    def launch_values(self, values: tuple) -> None:
        """This compiled launch with other argument values of the same specialization, as the launcher takes them
        (tensors as addresses): tensors of the same dtypes whose addresses agree with the first ones' modulo 16,
        the same integers (Triton compiles those in). What a repeated call of one shape passes with new tensors,
        e.g. ``launch.launch_values((x2.data_ptr(), y2.data_ptr(), n))`` after ``bind(k, (4,), x, y, n)``."""
        self._launch(values + self._tail)

    def _launch(self, values: tuple) -> None:
        compiled = self._compiled
        stream = _current_stream(self._device)
        gx, gy, gz = self._grid
        enter = _RUNTIME_KNOBS.launch_enter_hook
        if _no_hook(enter):
            self._run(gx, gy, gz, stream, self._function, self._metadata, None, None, None, *values)
        else:  # as Triton launches it, so that the hook (a profiler) sees the launch
            launch_metadata = compiled.launch_metadata(self._grid, stream, *values)
            self._run(gx, gy, gz, stream, self._function, self._metadata, launch_metadata, enter,
                      _RUNTIME_KNOBS.launch_exit_hook, *values)


def _addresses(args) -> tuple:
    """A launch's arguments as the launcher takes them: each tensor as its address."""
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


def bind(kernel, grid, *args, **constexprs) -> BoundLaunch:
    """``kernel[grid](*args, **constexprs)`` as a launch compiled now, for these arguments, and launched by calling
    it (pointers kept as addresses: their memory must outlive the launch), e.g. ``bind(k, (4,), x, BLOCK=256)()``.
    On Triton's interpreter (the CPU backend) each call is ``kernel[grid](*args, **constexprs)``."""
    launch = BoundLaunch(kernel, grid, args, constexprs)
    if _compiles():
        launch._compile()
    return launch


def weakly_held(function, *tensors):
    """A launch of ``function(*tensors)``, each tensor held weakly, for work torch runs (the vendor's GEMM): a plan
    keeps no caller's tensor alive and is dropped once one died. Example: ``weakly_held(torch.mm, A, B)()``."""
    refs = tuple(None if tensor is None else weakref.ref(tensor) for tensor in tensors)

    def launch() -> None:
        function(*(None if ref is None else ref() for ref in refs))

    launch.tensors = tuple(ref for ref in refs if ref is not None)
    return launch


# Remembered calls per Plans; past this many the memory starts again.
MAX_PLANS = 1024


def call_key(name, first, second, *rest):
    """What a call's launches depend on, one flat tuple: its name, each tensor's address, shape, strides (``True``
    where contiguous: cheaper to hash) and dtype (``second`` may be None), then ``rest``; None where a tensor is
    not a plain ``torch.Tensor``. Example: ``call_key("all_reduce", out, x, "sum", None)``."""
    if type(first) is not torch.Tensor:
        return None
    if second is None:
        return (name, first.data_ptr(), first.shape, first.is_contiguous() or first.stride(), first.dtype, *rest)
    if type(second) is not torch.Tensor:
        return None
    return (name, first.data_ptr(), first.shape, first.is_contiguous() or first.stride(), first.dtype,
            second.data_ptr(), second.shape, second.is_contiguous() or second.stride(), second.dtype, *rest)


def _with_rank_lists_as_tuples(key):
    """``key`` (a tuple) with each list of ints in it as a tuple, where that makes it hashable; else ``key``. Only
    on a miss: a list in a key fails the first lookup, so hashable keys never pay for this."""
    try:
        hash(key)
        return key
    except TypeError:
        pass
    if not isinstance(key, tuple):
        return key
    return tuple(tuple(v) if type(v) is list and all(type(r) is int for r in v) else v for v in key)


def value_key(value, kind: type):
    """A config by value (it may change between calls), e.g. ``value_key(Config(), Config)``: its type and fields;
    None for None; anything else a fresh object (the call refuses it: nothing is remembered under it)."""
    if value is None:
        return None
    if isinstance(value, kind):
        return type(value), *value.__dict__.values()
    return object()


def unchecked(run):
    """Mark ``run``, a first run of :meth:`Plans.call` (``@unchecked def _first_send(ctx, tensor, dst)``), as not
    checked across ranks in debug mode: its ranks pass different arguments by design (send and recv)."""
    run.checked = False
    return run


def rank_specific(*names: str):
    """Mark parameters of a first run of :meth:`Plans.call` that ranks pass differently by design, left out of the
    cross-rank check (``@rank_specific("output_tensor", "send_counts") def _first_all_to_all_v(ctx, ...)``)."""
    def mark(run):
        run.rank_specific = frozenset(names)
        return run
    return mark


class Plans:
    """A context's remembered calls (``ctx.ccl``, ``ctx.ops``), by :func:`call_key`: a repeated call skips its
    checks and Triton's per-call Python. A call without a plan is first checked by ``check(team, name, arguments)``
    (:func:`iris.host.team.check_first_call`: across ranks, every call in debug mode, else the first of each
    distinct call). Nothing is remembered in debug mode nor for a key of None. A call's
    config, an instance of ``config_type``, is keyed by value (:func:`value_key`).

    On a GPU, unless IRIS_GRAPH_REPLAY=0, a plan's launches are captured into a CUDA/HIP graph on its first replay
    and later replays launch the graph (:func:`graph_launcher`), except under the user's own stream capture or a
    Triton launch hook (a profiler). On CUDA, unless IRIS_NATIVE_REPLAY=0, a repeated call's key, lookup, checks
    and graph launch are one C call (iris.host.replay.native).

    Example:
        >>> plans = Plans(ctx, check=check_first_call, config_type=Config)
        >>> plans.call("all_reduce", out, x, config, (op, group), _first_all_reduce, out, x, op, group, config)
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

    def __init__(self, ctx, check=None, config_type=type(None)):
        self._ctx = ctx
        self._check, self._config_type = check, config_type
        self._plans: dict = {}
        self._kept: dict = {}  # heap workspaces, by problem: never dropped (a plan may use one)
        self._watchdog = watchdog.current()  # IRIS_STALL_TIMEOUT: told every call, to name the last one
        self._graphs = config.graph_replay() and _compiles()
        self._capturing = torch.cuda.is_current_stream_capturing  # whether the current stream is being captured
        if self._graphs:  # torch's own C call, without the Python around it
            self._capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", self._capturing)
        native = self._graphs and config.native_replay() and runtime.get_backend().native_graph_launch
        self._native, self._state = self._native_path() if native else (None, None)
        # a plan of one kernel relaunched by cuLaunchKernel (iris.host.replay.direct) instead of a graph
        self._direct = config.direct_launch() and _compiles() and runtime.get_backend().native_graph_launch

    def call(self, name, first, second, config, rest, run, *args):
        """One call: relaunch the launches remembered for ``call_key(name, first, second, *rest, config by value)``
        or, the first time, ``check`` it across ranks, ``run(ctx, *args)`` and remember what it returns,
        ``(launches, result)``; returns ``result``. ``rest`` holds every other value the launches depend on (an
        unhashable one, or ``first`` not a plain tensor: not remembered); ``run``'s parameters after ``ctx`` name
        ``args`` for the check (unless :func:`unchecked`).

        Example:
            >>> def _first_broadcast(ctx, tensor, src, config):
            ...     return broadcast(tensor, ctx, src=src, config=config), None
            >>> plans.call("broadcast", tensor, None, config, (src,), _first_broadcast, tensor, src, config)
        """
        if self._watchdog is not None:
            self._watchdog.note_call(name)
        by_value = None if config is None else value_key(config, self._config_type)
        native = self._native
        if native is not None:
            key, plan = native(self._state, name, first, second, rest, by_value)
            if plan is not None:
                return plan.result
        else:
            key = call_key(name, first, second, *rest, by_value)
        plan = self.replay(key)
        if plan is not None:
            return plan.result
        key = _with_rank_lists_as_tuples(key)  # a team given as a list of ranks: planned by its ranks
        plan = self.replay(key)
        if plan is not None:
            return plan.result
        ctx = self._ctx
        ctx.heap.refuse_if_closed(name)  # a closed context forgot its plans (Iris.close): every call ends here
        if self._check is not None and getattr(run, "checked", True):  # debug: every call; else a first one
            code, differing = run.__code__, getattr(run, "rank_specific", ())
            self._check(ctx.team, name, {parameter: value for parameter, value
                                         in zip(code.co_varnames[1:code.co_argcount], args)
                                         if parameter not in differing})
        launches, result = run(ctx, *args)
        return self.remember(key, launches, result).result

    def _native_path(self):
        """iris.host.replay.native's ``replay`` and its state for these plans, or (None, None) (said why, once)."""
        driver = _driver_functions()
        if driver is None:
            self._ctx.warning("IRIS_NATIVE_REPLAY: repeated calls take the Python path (the CUDA driver library did "
                              "not load)")
            return None, None
        return self._native_state(driver, torch._C._cuda_getCurrentRawStream)

    def _native_state(self, driver, current_stream):
        """``(replay, state)`` of iris.host.replay.native, or (None, None) where it cannot be built (said why); the
        state holds the team weakly."""
        from iris.host.replay import native

        module, why = native.load()
        if module is None:
            self._ctx.warning(f"IRIS_NATIVE_REPLAY: repeated calls take the Python path ({why})")
            return None, None
        return module.replay, (self._plans, weakref.proxy(self._ctx.team), _RUNTIME_KNOBS, torch.Tensor,
                               current_stream, *driver)

    def __len__(self) -> int:
        return len(self._plans)

    def forget(self) -> None:
        """Drop every plan and kept workspace (the context is closing: none may launch again)."""
        self._plans.clear()
        self._kept.clear()

    def plans(self) -> list[Plans.Plan]:
        """The remembered plans."""
        return list(self._plans.values())

    def replay(self, key) -> Plans.Plan | None:
        """Relaunch the launches remembered for ``key`` (or their graph) and return its plan; None where none is."""
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
        if (launch_graph is not None or ((self._graphs or self._direct) and not plan.captured)) \
                and _no_hook(_RUNTIME_KNOBS.launch_enter_hook) and not self._capturing():
            if launch_graph is None:  # its first replay: one kernel packed once, or captured once
                plan.captured = True
                launch_graph = plan.launch_graph = self._fast_launch(plan.launches)
                plan.native = getattr(launch_graph, "native", None)
            if launch_graph is not None:
                launch_graph()
                return plan
        for launch in plan.launches:
            launch()
        return plan

    def _fast_launch(self, launches):
        """How a plan's ``launches`` replay from now on: one kernel by cuLaunchKernel (IRIS_DIRECT_LAUNCH), else a
        graph (IRIS_GRAPH_REPLAY); None where neither applies (the launches are relaunched one by one)."""
        if self._direct and len(launches) == 1 and isinstance(launches[0], BoundLaunch):
            from iris.host.replay.direct import direct_launcher

            direct = direct_launcher(launches[0])
            if direct is not None:
                return direct
        if not self._graphs:
            return None
        graph = self._captured(launches)
        return None if graph is None else graph_launcher(graph, torch.cuda.current_device())

    def _captured(self, launches):
        """``launches`` captured into a graph (not run), or None where capture fails (logged)."""
        try:
            return captured_graph(launches)
        except RuntimeError as error:
            self._ctx.warning(f"a remembered call could not be captured into a graph ({error}); it launches as before")
            return None

    def kept(self, key, make):
        """The workspace kept for problem ``key``, made by ``make()`` on first use (collective, as heap
        allocations are)."""
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    def remember(self, key, launches, result=None) -> Plans.Plan:
        """Keep the ``launches`` a call made (callables that launch on the current stream) and its ``result`` for
        the next call with the same ``key``; returns the plan."""
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
    """A CUDA/HIP graph of ``launches``, captured on a side stream, not run; RuntimeError where capture fails.

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
    """A callable that launches the captured ``graph`` on ``device``'s current stream: on CUDA one driver call,
    ``cuGraphLaunch`` (``graph.replay()`` also walks torch's RNG and device guards); elsewhere ``graph.replay``.

    Example:
        >>> launch_graph = graph_launcher(graph, torch.cuda.current_device())
        >>> launch_graph()   # the captured work, once more, on the current stream
    """
    driver = _driver_functions() if runtime.get_backend().native_graph_launch else None
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
    """The addresses of the CUDA driver's ``cuStreamIsCapturing``, ``cuGraphLaunch`` and ``cuLaunchKernel``, or None
    without it."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        return tuple(ctypes.cast(getattr(driver, name), ctypes.c_void_p).value
                     for name in ("cuStreamIsCapturing", "cuGraphLaunch", "cuLaunchKernel"))
    except (OSError, AttributeError):
        return None


def _no_hook(enter) -> bool:
    """Whether ``enter``, Triton's launch-enter hook, is none (Triton 3.6 keeps an empty chain where none is)."""
    return enter is None or getattr(enter, "calls", None) == []


def _compiles() -> bool:
    """Whether Triton compiles for a device here (not the interpreter of the CPU backend)."""
    return runtime.get_backend().compiles_kernels and torch.cuda.is_available()


def _current_stream(device: int) -> int:
    """The raw handle of ``device``'s current stream (the call Triton itself makes on each launch)."""
    return torch._C._cuda_getCurrentRawStream(device)
