"""Collectives side by side: iris.ccl, NCCL (torch.distributed) and torch symmetric memory, same run.

    iris run -n 2 benchmarks/ccl.py [--collectives all_reduce all_gather reduce_scatter all_to_all]
                                    [--dtypes bf16] [--min 1K] [--max 256M] [--methods device eager graph]
                                    [--calls 20] [--iters 20] [--warmup 5] [--graph-max 1M]
                                    [--csv PATH] [--validate] [--host] [--trace] [--nccl-symmetric]

Sizes are bytes of input per rank, powers of two from --min to --max (all_gather's output is W
times that; reduce_scatter's input is split W ways). For every collective, dtype and size, in one
process group and with the same buffers:

    iris              ctx.ccl.<collective> with its default variant (all_reduce: also each variant;
                      all_gather and all_to_all: also ``iris.copies``, the copy engine's variant)
    iris.copy_in      the input copied from a plain tensor into a heap buffer, then the collective:
                      the documented path for inputs that are not on the heap (see iris.ccl)
    nccl              torch.distributed (all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
                      all_to_all_single); gloo on the CPU backend
    symm_mem          torch.ops.symm_mem one_shot_all_reduce / two_shot_all_reduce_ (all_reduce only,
                      where torch has them; otherwise the row says why)
    nccl.symmetric    with --nccl-symmetric (all_reduce, NCCL on CUDA): torch.distributed's all_reduce on a
                      buffer of NCCL's own allocator registered as a symmetric window, where NCCL 2.27+ runs
                      its symmetric-memory kernels (:func:`nccl_window`); otherwise the row says why

Every implementation is timed the same way, by each method of --methods (the CSV's method column; see
benchmarks/_timing.py): ``device``, CUDA events around --calls calls back to back on one stream over
--calls (nccl-tests' method; algbw and busbw are this figure's), ``eager``, the wall clock around --calls calls
with one synchronize at the end (host-inclusive), and ``graph``, --calls calls captured in a CUDA graph and
replayed (up to --graph-max bytes). Each figure is the median of --iters samples on rank 0, after --warmup
calls; each sample starts with the GPU idle and the ranks met (a host barrier), and the samples are taken in
turns. A small message (up to 64 KiB) whose device figure is more than twice its graph figure is flagged
in the CSV's suspect column and printed: the device figure then times launch gaps or a late peer. The CSV
names NCCL's version and the protocol and algorithm it was told to use (nccl_version, nccl_proto, nccl_algo).

    iris (host)       with --host: host microseconds per iris call issued back to back on rank 0 (and
                      ``iris (host, slowest rank)``: the most any rank took, the ranks timed together:
                      an eager call waits for the last rank's launch), beside the floor of launching an
                      empty Triton kernel (``null (host)``: Triton's own launch, and ``null bound (host)``:
                      iris's remembered launch, which a repeated collective uses); method ``host``

On the CPU backend only the eager method runs (perf_counter around the calls): a smoke test, not a figure.
Bus bandwidth follows NCCL: all_reduce moves 2(W-1)/W of the data per rank, the others (W-1)/W.
--validate first checks every iris row (each variant, copy-in) once per size against NCCL on
small-integer data.
Tuning: --tune, after a run whose CSV goes to its default place, writes iris/ccl/all_reduce/tuned.py, the
default all_reduce variant by world size, dtype and size, from every
benchmarks/results/ccl_<gpu>_<W>ranks.csv of that GPU (this run's among them): the fastest of one_shot,
push and ll where its median time is at least --tune-margin (10%) below two_shot's, else two_shot. --tune-from CSV...
writes it from given runs without running anything (several runs of one world size: the median); on a
GPU of another kind than the table's runs, name the runs to keep beside the new one there, e.g. a 2-rank
run on H100s beside the H200s' 4- and 8-rank runs (--tune alone would drop the world sizes it did not
measure).
The times weighed are the graph-replay rows (method graph) at a size where a run has them for two_shot
and another variant, else the device rows: a repeated call replays from a graph (IRIS_GRAPH_REPLAY, on by
default), and a small call issued eagerly costs the host's time whichever variant it runs (on 2 x H100,
8-12 us of host time per call against 3.5-9 us of GPU time at 1-64 KiB), so host-bound rows rank variants by
noise. Runs written before the method column name their replayed rows ``<impl>+graph``; the tuner reads both.
ll's rows count where the run packed ll's words as the tuner's IRIS_LL_PACK says (the CSV's ll_pack column: 1,
0 or auto, unset; runs without it: 0, one element a word): tune with IRIS_LL_PACK=1 to weigh two 16-bit
elements a word at every size.
Output: a table, printed as each point is measured, with each time's ratio to NCCL's by the same method
(>1: faster than NCCL); at the end a CSV and, with matplotlib, a PNG beside it (a row per collective: latency and bus
bandwidth against size): benchmarks/results/ccl_<gpu>_<W>ranks.csv/.png unless --csv names another place.
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse
import csv
import functools
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import triton
from _results import (add_csv_argument, check_csv_argument, default_csv, git_commit, host_us, parse_size, why_not,
                      write_csv)
from _rows import ccl_method
from _timing import Timer, add_timing_arguments, by_methods, check_timing_arguments, nccl_facts, suspect

import iris
from iris.runtime.distributed import job_world_size
from iris.runtime.capabilities import find_limitation
from iris.ccl import Config
from iris.ccl.all_reduce import ELEMENT_SIZES, far_path_refusal
from iris.ccl.all_reduce import push as all_reduce_push
from iris.ccl.config import ALL_REDUCE_VARIANTS
from iris.memory.collective_free import never_free

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int32": torch.int32,
          "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
REDUCING = ("all_reduce", "reduce_scatter")
TUNED = Path(__file__).resolve().parents[1] / "iris" / "ccl" / "all_reduce" / "tuned.py"
# The variants a default may be: each gives every member the same bits in a fixed order (atomic,
# spinlock and ring sum in arrival order); two_shot is the fallback, its traffic bounded in W.
TUNED_VARIANTS = ("one_shot", "two_shot", "push", "ll")


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", nargs="+", choices=COLLECTIVES, default=list(COLLECTIVES))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["bf16"])
    parser.add_argument("--min", type=parse_size, default=parse_size("1K"), help="smallest size per rank (1K)")
    parser.add_argument("--max", type=parse_size, default=parse_size("256M" if gpu else "16K"),
                        help="largest size per rank (256M on a GPU, 16K on the CPU backend)")
    add_timing_arguments(parser, gpu)
    add_csv_argument(parser, "ccl")
    parser.add_argument("--validate", action="store_true", help="check iris against NCCL once per size")
    parser.add_argument("--graph-max", type=parse_size, default=parse_size("1M"),
                        help="largest size timed by the graph method (1M)")
    parser.add_argument("--host", action="store_true", help="also time the host's share of each iris call")
    parser.add_argument("--nccl-symmetric", action="store_true",
                        help="also time NCCL's all_reduce on a registered symmetric window (nccl.symmetric)")
    parser.add_argument("--trace", action="store_true", help="tracing on (ctx.tracing.enable()) for the whole run: "
                        "iris's collectives record their events, to compare their times with a run without it "
                        "(a traced run is never tuned from)")
    parser.add_argument("--tune", action="store_true", help="write iris/ccl/all_reduce/tuned.py from this GPU's runs")
    parser.add_argument("--tune-from", nargs="+", type=Path, default=None, metavar="CSV",
                        help="write the tuned table from these runs' CSVs, run nothing")
    parser.add_argument("--tune-file", type=Path, default=TUNED,
                        help="where the table goes (iris/ccl/all_reduce/tuned.py)")
    parser.add_argument("--tune-margin", type=float, default=0.10,
                        help="how much faster one_shot must be than two_shot to be chosen (0.10)")
    args = parser.parse_args()
    check_csv_argument(parser, args, "ccl")
    if args.tune and args.csv is not None:
        parser.error("--tune builds the table from benchmarks/results/: leave --csv out")
    check_timing_arguments(parser, args, gpu)
    if args.min < 16 or args.max < args.min:
        parser.error(f"need 16 <= --min <= --max; got {args.min}, {args.max}")
    args.sizes = [args.min << i for i in range((args.max // args.min).bit_length()) if args.min << i <= args.max]
    return args


class Buffers:
    """Views of one heap arena (iris) and one plain allocation (torch) big enough for the largest point."""

    def __init__(self, ctx, max_bytes: int, world: int):
        self.heap = ctx.empty((world + 2) * max_bytes, dtype=torch.uint8)
        self.plain = torch.empty((world + 2) * max_bytes, dtype=torch.uint8, device=ctx.get_device())

    def pair(self, arena, dtype, in_count: int, out_count: int):
        """(input, output) views of ``arena``: disjoint, 256-byte aligned."""
        size = torch.empty((), dtype=dtype).element_size()
        start = -(-in_count * size // 256) * 256
        return (arena[: in_count * size].view(dtype), arena[start : start + out_count * size].view(dtype))


def counts(name: str, nbytes: int, size: int, world: int) -> tuple[int, int]:
    """(input, output) elements of ``name`` for ``nbytes`` of input per rank."""
    n = nbytes // size
    return {"all_reduce": (n, n), "all_gather": (n, n * world), "reduce_scatter": (n, n // world),
            "all_to_all": (n, n)}[name]


def fill(tensor: torch.Tensor, rank: int) -> None:
    """Small integers (exact in every dtype and in any summation order)."""
    values = ((torch.arange(tensor.numel(), device=tensor.device) * 7 + rank * 3) % 5 - 2).view(tensor.shape)
    tensor.copy_(values.to(torch.int32) if tensor.dtype == torch.int32 else values.float().to(tensor.dtype))


def iris_calls(ctx, name, inp, out, world, plain_in):
    """label -> zero-argument call of iris for this point (or why that variant cannot run here).

    ``iris.copy_in`` is the documented path for an input that is not on the heap: copy it into a
    heap buffer made once (here ``inp``), then call the collective; ``plain_in`` is that input.
    """
    calls = _iris_variants(ctx, name, inp, out, world)
    default = calls["iris"]
    calls["iris.copy_in"] = lambda: (inp.copy_(plain_in), default())
    return calls


def _iris_variants(ctx, name, inp, out, world):
    if name == "all_reduce":
        calls = {"iris": lambda: ctx.ccl.all_reduce(out, inp)}
        for variant in ALL_REDUCE_VARIANTS:
            row = find_limitation(iris.runtime.SELECTED, "atomic", inp.dtype, concurrent=True) \
                if variant == "atomic" else None
            if row is not None:
                calls[f"iris.{variant}"] = row.reason
                continue
            refusal = far_path_refusal(variant, len(set(ctx.get_node_map())) > 1)
            if refusal is not None:
                calls[f"iris.{variant}"] = refusal
                continue
            if not all_reduce_push.holds(variant, inp.numel(), inp.element_size()):
                held = all_reduce_push.capacity(variant, inp.element_size())
                calls[f"iris.{variant}"] = f"{variant} takes at most {held} per rank (its landing zones)"
                continue
            config = Config(all_reduce_variant=variant)
            calls[f"iris.{variant}"] = lambda config=config: ctx.ccl.all_reduce(out, inp, config=config)
        return calls
    # all_to_all and all_gather: the default variant, and the copy engine's (a copy per member, no SM)
    unreached = None if ctx.team.heap.maps() else "a member is reached only through the engine (another node)"
    if name == "all_to_all":
        shape = all_to_all_shape(inp.numel(), world)
        copies = Config(all_to_all_variant="copies")
        return {"iris": lambda: ctx.ccl.all_to_all(out.view(shape), inp.view(shape)),
                "iris.copies": unreached or (lambda: ctx.ccl.all_to_all(out.view(shape), inp.view(shape),
                                                                       config=copies))}
    if name == "all_gather":
        copies = Config(all_gather_variant="copies")
        return {"iris": lambda: ctx.ccl.all_gather(out, inp),
                "iris.copies": unreached or (lambda: ctx.ccl.all_gather(out, inp, config=copies))}
    return {"iris": lambda: getattr(ctx.ccl, name)(out, inp)}


@triton.jit
def _null_kernel(x):
    pass


def null_launch_rows(base, x) -> list[dict]:
    """The host's floor for one launch: an empty Triton kernel, launched by Triton and by iris's
    remembered launch (iris.host.replay.bind, what a repeated collective replays)."""
    from iris.host.replay import bind

    bound = bind(_null_kernel, (1,), x)
    return [{**base, "collective": "null", "impl": label, "method": "host", "us": host_us(call), "note": "host"}
            for label, call in (("null (host)", lambda: _null_kernel[(1,)](x)), ("null bound (host)", bound))]


def host_rows(ctx, point, call) -> list[dict]:
    """The --host rows of one point: host microseconds per iris call issued back to back, rank 0's and the most
    any rank took (the ranks timed together)."""
    ctx.barrier()
    per_rank = ctx.comm.all_gather_object(host_us(call))
    return [{**point, "impl": "iris (host)", "method": "host", "us": per_rank[0], "note": "host"},
            {**point, "impl": "iris (host, slowest rank)", "method": "host", "us": max(per_rank), "note": "host"}]


def timed_rows(ctx, timer, methods, point, calls, graph_max, nccl_captures) -> list[dict]:
    """One row per implementation of ``calls`` (label -> call, or why it cannot run here) and method, every
    implementation timed the same way (benchmarks/_timing.py), rank 0's figures; device rows whose figure is over
    twice the graph figure of a small message are flagged (suspect)."""
    runnable = {label: call for label, call in calls.items() if not isinstance(call, str)}
    methods = [m for m in methods if m != "graph" or point["bytes"] <= graph_max]
    figures = by_methods(timer, methods, runnable, lambda found: ctx.broadcast(found, src=0), nccl_captures)
    rows = []
    for method in methods:
        for label, call in calls.items():
            us = figures[method].get(label, call)
            row = {**point, "impl": label, "method": method, "us": "", "note": us}
            if not isinstance(us, str):
                row.update(us=us, algbw_gbps=point["bytes"] / us / 1e3, busbw_gbps=point["bus_bytes"] / us / 1e3,
                           note="")
            rows.append(row)
    for row in rows:
        if row["method"] == "device":
            row["suspect"] = int(suspect(row["us"], figures.get("graph", {}).get(row["impl"]), point["bytes"]))
    return rows


def all_to_all_shape(numel: int, world: int) -> tuple[int, int]:
    """(M, W*N) for all_to_all's layout: chunks of up to 4096 columns per rank."""
    chunk = math.gcd(numel // world, 4096)
    return numel // (world * chunk), world * chunk


def nccl_call(name, inp, out):
    if name not in REDUCING and inp.dtype.is_floating_point and inp.dtype.itemsize == 1:
        inp, out = inp.view(torch.uint8), out.view(torch.uint8)  # moving fp8 is moving bytes (gloo has no fp8)
    if name == "all_reduce":
        return lambda: dist.all_reduce(inp)
    if name == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, inp)
    if name == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(out, inp)
    return lambda: dist.all_to_all_single(out, inp)


@functools.cache
def symmetric_buffer(nbytes: int, device) -> torch.Tensor:
    """torch symmetric memory's buffer for the whole run (``nbytes``: the largest point), made and
    rendezvoused on first use, on every rank at the same point; each point takes a view of it.

    One allocation, never freed by Python: on torch's NVSHMEM backend (which the shmem heap selects) a
    symmetric tensor's free is collective, and torch issues it from the tensor's deleter, that is from
    the garbage collector (pytorch/pytorch#195500), so a rank that frees at another moment than its
    peers waits for them forever (ccl.py on the shmem heap, 2 x H100: rank 1 never left main's
    teardown, rank 0 waited in destroy_process_group). A buffer per point also cost a collective
    allocation per point there. The process's end returns the memory."""
    import torch.distributed._symmetric_memory as symm_mem

    buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
    never_free(buf)
    return buf


def symm_mem_calls(numel: int, dtype, device, capacity: int) -> tuple[dict, str]:
    """({label: call}, why-not) for torch symmetric memory's all_reduce on a view of the run's symmetric
    buffer (:func:`symmetric_buffer` of ``capacity`` bytes)."""
    if device.type != "cuda":
        return {}, "torch symmetric memory needs CUDA"
    try:
        group = dist.group.WORLD.group_name
        buf = symmetric_buffer(capacity, device)[: numel * dtype.itemsize].view(dtype)
        return {"symm_mem.one_shot": lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group),
                "symm_mem.two_shot": lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group)}, ""
    except Exception as exc:  # a torch without it, or a dtype/size it refuses: say so in the table
        return {}, why_not(exc)


@functools.cache
def nccl_window(nbytes: int, device) -> torch.Tensor:
    """A buffer of ``nbytes`` from NCCL's own allocator (``ncclMemAlloc``, torch's ``backend.mem_allocator``),
    registered with the world's NCCL communicator as a symmetric window (``register_mem_pool(pool,
    symm=True)``: ``ncclCommWindowRegister`` with ``NCCL_WIN_COLL_SYMMETRIC``), the buffers NCCL 2.27+ runs its
    symmetric-memory kernels on. Made on every rank at the same point, once for the run: the communicator is
    made first by a collective (torch refuses to register a window with one it would make lazily), the buffer is
    allocated before the registration (a pool that grows later would need registering again), and neither is
    freed by Python (a window's deregistration is collective; the process's end returns the memory)."""
    backend = dist.group.WORLD._get_backend(device)
    dist.all_reduce(torch.zeros(1, device=device))
    pool = torch.cuda.MemPool(backend.mem_allocator)
    with torch.cuda.use_mem_pool(pool):
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    backend.register_mem_pool(pool, symm=True)
    never_free(pool)
    never_free(buf)
    return buf


def nccl_symmetric_call(numel: int, dtype, device, capacity: int):
    """NCCL's all_reduce of ``numel`` elements on a view of the run's symmetric window (:func:`nccl_window` of
    ``capacity`` bytes), or a string saying why it cannot run here."""
    if device.type != "cuda" or "nccl" not in str(dist.get_backend()):
        return "NCCL's symmetric windows need CUDA and the nccl backend"
    try:
        buf = nccl_window(capacity, device)[: numel * dtype.itemsize].view(dtype)
    except Exception as exc:  # a torch or NCCL without symmetric windows: say so in the table
        return why_not(exc)
    return lambda: dist.all_reduce(buf)


def bus_factor(name: str, world: int) -> float:
    return 2 * (world - 1) / world if name == "all_reduce" else (world - 1) / world


def bus_bytes(name: str, nbytes: int, world: int) -> int:
    """The bytes NCCL's bandwidth formula counts (all_gather: the whole output)."""
    return nbytes * world if name == "all_gather" else nbytes


def validate(ctx, name, buffers, dtype, nbytes, world, rank) -> list[str]:
    size = torch.empty((), dtype=dtype).element_size()
    n_in, n_out = counts(name, nbytes, size, world)
    inp, out = buffers.pair(buffers.heap, dtype, n_in, n_out)
    ref_in, ref_out = buffers.pair(buffers.plain, dtype, n_in, n_out)
    fill(ref_in, rank)
    ref_out.zero_()
    nccl_call(name, ref_in, ref_out)()
    want = (ref_out if name != "all_reduce" else ref_in).clone()  # ref_in is refilled below
    if name == "all_to_all":  # the original's column chunks, not NCCL's row chunks: build the expectation
        rows, cols = all_to_all_shape(n_in, world)
        chunk = cols // world
        inputs = []
        for peer in range(world):
            x = torch.empty(rows, cols, dtype=dtype, device=inp.device)
            fill(x, peer)
            inputs.append(x[:, rank * chunk:(rank + 1) * chunk])
        want = torch.cat(inputs, dim=1)
    problems = []
    fill(ref_in, rank)  # the plain input of iris.copy_in (all_reduce overwrote it in place)
    for label, call in iris_calls(ctx, name, inp, out, world, ref_in).items():
        if isinstance(call, str):
            continue
        fill(inp, rank)
        out.zero_()
        ctx.barrier()
        call()
        ctx.barrier()
        if not torch.equal(out.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
            problems.append(f"{name} {nbytes} B {dtype}: {label} differs from torch.distributed")
    return problems


def pack_mode(packing: bool | None) -> str:
    """IRIS_LL_PACK as the CSV's ll_pack column says it: "1", "0", or "auto" (unset: packed past LL_UNPACKED)."""
    return "auto" if packing is None else str(int(packing))


def packed_as(row: dict, packing: bool | None) -> bool:
    """Whether the run of an ll ``row`` packed its words at its size as IRIS_LL_PACK's setting ``packing`` does
    (the row's ll_pack column; none: 0, one element a word)."""
    size = ELEMENT_SIZES[row["dtype"]]
    numel = int(row["bytes"]) // size
    ran = {"1": True, "auto": None}.get(row.get("ll_pack") or "0", False)
    return all_reduce_push.packs(ran, size, numel) == all_reduce_push.packs(packing, size, numel)


def tuned_table(rows, margin: float) -> dict:
    """{(world, dtype): ((below bytes, variant), ...)} from the rows of ccl.py CSVs; see the module's docstring."""
    times = {"device": {}, "graph": {}}
    packing = iris.config.ll_pack()  # ll's rows count where they were packed as ll is here, size by size
    for row in rows:
        impl, replay = ccl_method(row)
        impl = impl.removeprefix("iris.")
        if replay not in times:
            continue
        traced = row.get("trace", "0") not in ("", "0")  # the committed runs before the column: untraced
        if impl == "ll" and not packed_as(row, packing):
            continue
        if row["collective"] == "all_reduce" and impl in TUNED_VARIANTS and row["us"] and not traced:
            key = (int(row["world_size"]), row["dtype"], int(row["bytes"]))
            times[replay].setdefault(key, {}).setdefault(impl, []).append(float(row["us"]))
    winners = {}
    for key in sorted(times["device"].keys() | times["graph"].keys()):
        # Replayed from a graph where two_shot and another variant were (the GPU's time per call, what a
        # repeated call costs); else the device figures.
        found = times["graph"].get(key, {})
        if "two_shot" not in found or len(found) < 2:
            found = times["device"].get(key, {})
        if "two_shot" not in found or len(found) < 2:
            continue
        world, dtype, nbytes = key
        medians = {variant: statistics.median(us) for variant, us in found.items()}
        fastest = min((v for v in medians if v != "two_shot"), key=medians.get)
        winner = fastest if medians[fastest] < medians["two_shot"] * (1 - margin) else "two_shot"
        winners.setdefault((world, dtype), []).append((nbytes, winner))
    table = {}
    for key, points in winners.items():
        entries = []
        for i, (_, variant) in enumerate(points):  # sizes up to the next measured one take this one's variant
            below = points[i + 1][0] if i + 1 < len(points) else 1 << 62
            if entries and entries[-1][1] == variant:
                entries[-1] = (below, variant)
            else:
                entries.append((below, variant))
        while entries and entries[-1][1] == "two_shot":  # the fallback past the last entry
            entries.pop()
        if entries:
            table[key] = tuple(entries)
    return table


def write_tuned(path: Path, paths, margin: float) -> None:
    """Write the tuned table module (iris/ccl/all_reduce/tuned.py) from the runs at ``paths``."""
    rows, runs = [], []
    for run in paths:
        with open(run) as f:
            found = list(csv.DictReader(f))
        rows += found
        runs.append(f"    {Path(run).name} (commit {', '.join(sorted({row['commit'] for row in found}))})")
    table = tuned_table(rows, margin)
    body = "".join(f"    {key!r}: (\n" + "".join(f"        {entry!r},\n" for entry in entries) + "    ),\n"
                   for key, entries in sorted(table.items()))
    path.write_text(f'''"""The default all_reduce variant by world size, dtype and bytes per rank (iris.ccl.all_reduce).

Written by benchmarks/ccl.py (--tune after a run, or --tune-from CSV...), not by hand: at each size
measured, the fastest of one_shot, push and ll where its median time over the runs is at least
{margin:.0%} below two_shot's, else two_shot; a size between two measured ones takes the smaller one's variant.
The times are those replayed from a CUDA graph where the runs have them for two_shot and another variant
(the GPU's time per call), else the device ones. Runs:

{chr(10).join(runs)}
"""

# (world size, dtype): ((below this many bytes per rank, variant), ...); two_shot past the last entry.
ALL_REDUCE = {{
{body}}}
''')
    print(f"tuned table: {path} ({len(table)} world size and dtype entries)")


def main() -> int:
    gpu = iris.runtime.SELECTED != "cpu"
    args = parse_args(gpu)
    if args.tune_from:
        write_tuned(args.tune_file, args.tune_from, args.tune_margin)
        return 0
    world = job_world_size()
    ctx = iris.iris((world + 3) * args.max + (64 << 20))  # the largest point: all_gather's input and output
    rank, device = ctx.get_rank(), ctx.get_device()
    buffers = Buffers(ctx, args.max, world)
    gpu_name = torch.cuda.get_device_name(device) if gpu else "cpu"
    if args.trace:
        ctx.tracing.enable(max_events=1_000_000)  # later events are dropped; the kernels still take the recording path
    base = {"gpu": gpu_name, "backend": iris.runtime.SELECTED, "world_size": world, "version": iris.__version__,
            "commit": git_commit(), **nccl_facts(), "samples": args.iters, "calls_per_sample": args.calls,
            "trace": int(args.trace), "graph_replay": int(iris.config.graph_replay()),
            "native_replay": int(iris.config.native_replay()), "ll_pack": pack_mode(iris.config.ll_pack()),
            "collective": "", "dtype": "", "bytes": 0, "bus_bytes": 0, "impl": "", "method": "", "us": "",
            "algbw_gbps": "", "busbw_gbps": "", "suspect": "", "note": ""}
    timer = Timer(gpu, calls=args.calls, samples=args.iters, warmup=args.warmup, meet=ctx.barrier)
    nccl_captures = gpu and "nccl" in str(dist.get_backend())
    rows, problems = [], []
    if args.host and gpu:
        rows += null_launch_rows(base, buffers.heap)
    if rank == 0:
        print(HEADER, flush=True)
        for row in rows:
            print(f"{row['collective']:15} {'':8} {'':>10} {row['impl']:18} {'host':7} {row['us']:10.2f}")
    for name in args.collectives:
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            if name in REDUCING and dtype.itemsize == 1:
                continue  # fp8 is moved, not reduced
            size = dtype.itemsize
            for nbytes in args.sizes:
                n_in, n_out = counts(name, nbytes, size, world)
                if n_out == 0 or n_in % world and name in ("reduce_scatter", "all_to_all"):
                    continue
                if args.validate:
                    problems += validate(ctx, name, buffers, dtype, nbytes, world, rank)
                inp, out = buffers.pair(buffers.heap, dtype, n_in, n_out)
                ref_in, ref_out = buffers.pair(buffers.plain, dtype, n_in, n_out)
                calls = iris_calls(ctx, name, inp, out, world, ref_in)
                first = len(rows)
                calls["nccl"] = nccl_call(name, ref_in, ref_out)
                if name == "all_reduce":
                    extra, why = symm_mem_calls(n_in, dtype, device, max(args.sizes))
                    calls.update(extra or {"symm_mem": why})
                    if args.nccl_symmetric:
                        calls["nccl.symmetric"] = nccl_symmetric_call(n_in, dtype, device, max(args.sizes))
                bus = bus_bytes(name, nbytes, world) * bus_factor(name, world)  # bytes: us -> GB/s is bus / us / 1e3
                point = {**base, "collective": name, "dtype": dtype_name, "bytes": nbytes, "bus_bytes": bus}
                rows += timed_rows(ctx, timer, args.methods, point, calls, args.graph_max, nccl_captures)
                if args.host and gpu:
                    rows += host_rows(ctx, point, calls["iris"])
                if rank == 0:
                    print_point(rows[first:])
    ctx.barrier()
    if rank == 0:
        report(rows, args, gpu, gpu_name, world)
    for problem in problems:
        print(f"VALIDATION FAILED: {problem}")
    ctx.close()
    return 1 if problems else 0


HEADER = (f"{'collective':15} {'dtype':8} {'bytes':>10} {'impl':18} {'method':7} {'us':>10} {'busbw GB/s':>11} "
          f"{'vs nccl':>8}")


def print_point(rows) -> None:
    """The rows of one collective, dtype and size, as soon as they are measured: each time's ratio to NCCL's by the
    same method (nccl among them), a suspect figure marked."""
    nccl = {r["method"]: r["us"] for r in rows if r["impl"] == "nccl" and r["us"] != ""}
    for r in rows:
        head = f"{r['collective']:15} {r['dtype']:8} {r['bytes']:>10} {r['impl']:18} {r['method']:7}"
        if r["us"] == "":
            print(f"{head} {'-':>10}  {r['note']}")
        elif r["method"] == "host":
            print(f"{head} {r['us']:10.2f}")
        else:
            ratio = f"{nccl[r['method']] / r['us']:8.2f}x" if r["method"] in nccl else f"{'':>9}"
            flag = "  SUSPECT: device figure over twice the graph figure" if r.get("suspect") == 1 else ""
            print(f"{head} {r['us']:10.2f} {r['busbw_gbps']:11.1f} {ratio}{flag}")
    sys.stdout.flush()


def report(rows, args, gpu, gpu_name, world) -> None:
    if not gpu:
        print("note: CPU backend (Triton's interpreter): a smoke test, not a figure")
    path = args.csv or default_csv("ccl", gpu_name, world)
    write_csv(rows, path)
    plot(rows, path, world)
    if args.tune:
        write_tuned(args.tune_file, sorted(path.parent.glob(path.name.replace(f"_{world}ranks", "_*ranks"))),
                    args.tune_margin)


def plot(rows, path: Path, world: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return
    names = list(dict.fromkeys(r["collective"] for r in rows if r["method"] != "host"))
    if not names:
        return
    fig, axes = plt.subplots(len(names), 2, figsize=(13, 5 * len(names)), squeeze=False)
    for name, (lat, bw) in zip(names, axes):
        timed = [r for r in rows if r["collective"] == name and r["us"] != "" and r["method"] != "host"]
        for key in dict.fromkeys((r["impl"], r["method"], r["dtype"]) for r in timed):
            line = sorted((r for r in timed if (r["impl"], r["method"], r["dtype"]) == key), key=lambda r: r["bytes"])
            label = f"{key[0]} {key[1]} ({key[2]})"
            lat.plot([r["bytes"] for r in line], [r["us"] for r in line], marker="o", label=label)
            bw.plot([r["bytes"] for r in line], [r["busbw_gbps"] for r in line], marker="o", label=label)
        for ax, ylabel in ((lat, "latency (us)"), (bw, "bus bandwidth (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("bytes per rank")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        lat.set_yscale("log")
        lat.legend(fontsize=8)
        lat.set_title(name)
        bw.set_title(name)
    commits = ", ".join(dict.fromkeys(str(r["commit"]) for r in rows))
    fig.suptitle(f"iris.ccl: {rows[0]['gpu']}, {world} ranks, commit {commits}")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.03 / len(names)))
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"PNG: {out}")


if __name__ == "__main__":
    sys.exit(main())
